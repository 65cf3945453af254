"""Wrap a class of vLLM's now, or right after vLLM imports its module.

The plugin wraps the worker and front-end classes (:mod:`stepwarm.hook`), the
recorder the scheduler (:mod:`stepwarm.record`), without importing vLLM
themselves: a class whose module is loaded is wrapped at once; for the others
a ``sys.meta_path`` finder hands Python the real module spec with a loader
that wraps the class after executing the module. One finder per owner: a
second call replaces its targets (``register()`` twice leaves one finder).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Mapping
from typing import Any

#: ``module:Class`` -> the function that wraps the class in place.
Wrappers = Mapping[str, Callable[[type], None]]


class WrapOnImport(importlib.abc.MetaPathFinder):
    """The finder of one owner: ``targets`` is module -> (class name, wrap)."""

    def __init__(self, owner: str, targets: dict[str, tuple[str, Callable[[type], None]]]):
        self.owner = owner
        self.targets = dict(targets)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.targets:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        name, wrap = self.targets[fullname]
        spec.loader = WrappingLoader(spec.loader, name, wrap)
        return spec


class WrappingLoader(importlib.abc.Loader):
    """The module's own loader, then ``wrap(module.<cls_name>)``."""

    def __init__(self, inner: Any, cls_name: str, wrap: Callable[[type], None]):
        self.inner, self.cls_name, self.wrap = inner, cls_name, wrap

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        cls = getattr(module, self.cls_name, None)
        if isinstance(cls, type):
            self.wrap(cls)

    def __getattr__(self, name: str) -> Any:  # get_code, get_source, ... for tracebacks
        return getattr(self.inner, name)


def finder_of(owner: str) -> WrapOnImport | None:
    """``owner``'s finder on ``sys.meta_path``, if installed."""
    return next((f for f in sys.meta_path if isinstance(f, WrapOnImport) and f.owner == owner),
                None)


def wrap_now_or_on_import(owner: str, wrappers: Wrappers) -> None:
    """Wrap each ``module:Class`` of ``wrappers`` now where its module is
    loaded; the others when vLLM imports them (``owner``'s finder, installed
    once, its targets replaced by these)."""
    pending: dict[str, tuple[str, Callable[[type], None]]] = {}
    for path, wrap in wrappers.items():
        module, _, name = path.partition(":")
        loaded = sys.modules.get(module)
        if loaded is not None:
            cls = getattr(loaded, name, None)
            if isinstance(cls, type):
                wrap(cls)
        else:
            pending[module] = (name, wrap)
    finder = finder_of(owner)
    if finder is not None:
        finder.targets = pending
    elif pending:
        sys.meta_path.insert(0, WrapOnImport(owner, pending))
