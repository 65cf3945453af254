"""Counted nouns for log lines and the console (no rich: the plugin's log
lines use it inside every vLLM worker)."""

from __future__ import annotations


def plural(n: int, noun: str) -> str:
    """``1 request``, ``2 requests`` (nouns that take an s)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
