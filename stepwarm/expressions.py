"""Safe integer arithmetic over runner facts, for scenario sizes.

A size in a scenario file is an int or a string such as
``"decode_query_len + 1"``, ``"max_num_batched_tokens // 2"`` or
``"block_size(0) * 2"``. :func:`evaluate` parses the string with
:func:`ast.parse` and walks the tree with a whitelist: int literals, the
names in ``facts``, ``+ - * // %``, unary ``-``/``+``, parentheses and the
calls ``block_size(i)``, ``min(a, b, ...)`` and ``max(a, b, ...)``. Nothing
is evaluated by Python itself (no ``eval``, no attribute access, no
imports). :func:`buckets` expands a limit into Triton's integer
specialization classes.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Callable, Mapping

from stepwarm.profile import RunnerProfile

#: Functions an expression may call, besides ``block_size``.
_FUNCS: dict[str, Callable[..., int]] = {"min": min, "max": max}

_BINOPS: dict[type, str] = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%",
}

#: What an expression may contain, for error messages.
ALLOWED = ("integers, the facts {facts}, block_size(i), min(...), max(...), "
           "+ - * // % and parentheses")

#: Longest expression text accepted (characters).
MAX_LEN = 200


class ExpressionError(ValueError):
    """An expression that cannot be evaluated; the message says why and what
    is allowed (the scenario loader adds file, line, step and field)."""


def facts_of(profile: RunnerProfile) -> dict[str, int]:
    """The named facts an expression can use, read off ``profile`` (tokens
    unless the name says otherwise).

    ``lcm_block_size`` is the least common multiple of the block sizes of
    the groups that cache tokens (every group but cross-attention): the
    granularity of a prefix-cache hit on a hybrid model.
    """
    from math import lcm

    token_groups = [g.block_size for g in profile.kv_cache_groups
                    if g.kind != "cross_attention"] or [1]
    return {
        "decode_query_len": profile.decode_query_len,
        "num_spec_steps": profile.num_speculative_steps,
        "max_num_seqs": profile.max_num_seqs,
        "max_num_batched_tokens": profile.max_num_batched_tokens,
        "max_model_len": profile.max_model_len,
        "max_encoder_len": profile.max_encoder_len,
        "num_blocks": profile.num_blocks,
        "num_kv_groups": len(profile.kv_cache_groups),
        "lcm_block_size": lcm(*token_groups),
    }


def block_sizes_of(profile: RunnerProfile) -> tuple[int, ...]:
    """``block_size`` of each KV cache group, in group order (tokens)."""
    return tuple(g.block_size for g in profile.kv_cache_groups)


def evaluate(
    expr: int | str,
    facts: Mapping[str, int],
    block_sizes: tuple[int, ...] = (),
) -> int:
    """Evaluate a size: an int as is, a string as safe integer arithmetic.

    Args:
        expr: an int or an expression string.
        facts: name -> value (see :func:`facts_of`).
        block_sizes: ``block_size(i)`` of group ``i``.

    Returns:
        The int value.

    Raises:
        ExpressionError: syntax error, a name that is not a fact (the closest
            fact is suggested), a call other than ``block_size``/``min``/
            ``max``, ``/`` (use ``//``), division or modulo by zero, a group
            index out of range, or a value that is not an int.
    """
    if isinstance(expr, bool):
        raise ExpressionError(f"{expr!r} is a boolean; expected an integer or an expression")
    if isinstance(expr, int):
        return expr
    if not isinstance(expr, str):
        raise ExpressionError(f"{expr!r} is not an integer or an expression string")
    text = expr.strip()
    if not text:
        raise ExpressionError("empty expression; allowed: " + _allowed(facts))
    if len(text) > MAX_LEN:
        raise ExpressionError(f"expression longer than {MAX_LEN} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ExpressionError(
            f"{expr!r} is not a valid expression ({e.msg}); allowed: {_allowed(facts)}"
        ) from None
    return _Eval(text, facts, block_sizes).visit(tree.body)


def _allowed(facts: Mapping[str, int]) -> str:
    return ALLOWED.format(facts=", ".join(sorted(facts)))


class _Eval:
    """Whitelisted walk of a parsed expression (every node type not handled
    here is refused)."""

    def __init__(self, text: str, facts: Mapping[str, int], block_sizes: tuple[int, ...]):
        self.text, self.facts, self.block_sizes = text, facts, block_sizes

    def fail(self, why: str) -> ExpressionError:
        return ExpressionError(f"{self.text!r}: {why}")

    def visit(self, node: ast.AST) -> int:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int):
                raise self.fail(f"{node.value!r} is not an integer; allowed: {_allowed(self.facts)}")
            return node.value
        if isinstance(node, ast.Name):
            if node.id in self.facts:
                return self.facts[node.id]
            close = difflib.get_close_matches(node.id, list(self.facts) + ["block_size"], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise self.fail(f"unknown fact {node.id!r}{hint}; allowed facts: "
                            f"{', '.join(sorted(self.facts))}, block_size(i)")
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = self.visit(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Div):
                raise self.fail("'/' is not allowed: sizes are integers, use '//'")
            op = _BINOPS.get(type(node.op))
            if op is None:
                raise self.fail(f"operator {type(node.op).__name__} is not allowed; "
                                "allowed: + - * // %")
            a, b = self.visit(node.left), self.visit(node.right)
            if op in ("//", "%") and b == 0:
                raise self.fail(f"division by zero ({ast.unparse(node.right)} is 0); "
                                "allowed: a divisor that is not 0 on this runner")
            return {"+": a + b, "-": a - b, "*": a * b, "//": a // b if b else 0,
                    "%": a % b if b else 0}[op]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            name = node.func.id
            if name != "block_size" and name not in _FUNCS:
                raise self.fail(f"function {name!r} is not allowed; allowed: block_size, min, max")
            args = [self.visit(a) for a in node.args]
            if name == "block_size":
                if len(args) != 1:
                    raise self.fail("block_size takes one argument: the KV cache group index")
                i = args[0]
                if not 0 <= i < len(self.block_sizes):
                    raise self.fail(
                        f"block_size({i}): the runner has {len(self.block_sizes)} KV cache "
                        f"group(s); allowed: 0..{len(self.block_sizes) - 1}")
                return self.block_sizes[i]
            if name in _FUNCS:
                if not args:
                    raise self.fail(f"{name}() needs at least one argument")
                return _FUNCS[name](args)
            raise self.fail(f"function {name!r} is not allowed; allowed: block_size, min, max")
        raise self.fail(f"{type(node).__name__} is not allowed here; allowed: "
                        f"{_allowed(self.facts)}")


def buckets(limit: int, low: int = 1) -> tuple[int, ...]:
    """Triton's specialization classes of an int argument, within ``low..limit``.

    Triton compiles a separate kernel variant for an int that is ``== 1``, one
    that is a multiple of 16, and one that is neither. This returns, sorted
    and without duplicates, those of ``1``, ``16``, ``17``, the largest
    multiple of 16 not above ``limit``, and the largest value not above
    ``limit`` that is neither (``limit`` itself, or ``limit - 1`` when
    ``limit`` is a multiple of 16) that lie in ``low..limit``.

    Examples: ``buckets(512) == (1, 16, 17, 511, 512)``,
    ``buckets(8) == (1, 8)``, ``buckets(40) == (1, 16, 17, 32, 40)``.

    Raises:
        ExpressionError: ``limit < low`` or ``low < 1``.
    """
    if low < 1 or limit < low:
        raise ExpressionError(f"buckets need 1 <= low <= limit, got low {low}, limit {limit}")
    top16 = limit // 16 * 16
    neither = limit if limit % 16 else limit - 1
    cands = {1, 16, 17, top16, neither}
    return tuple(sorted(v for v in cands if low <= v <= limit))
