"""JIT compile detectors: what saw a kernel being compiled, and when.

Three detectors, each optional, all feeding one list of :class:`CompileEvent`:

* :class:`CacheScan` — fresh ``TRITON_CACHE_DIR``, ``VLLM_CACHE_ROOT`` and
  ``TORCHINDUCTOR_CACHE_DIR`` (set before vLLM, torch or Triton read them);
  a new Triton ``__grp__NAME.json`` is a compiled Triton kernel, a new
  Inductor output module (a ``.py`` calling ``async_compile``) names the
  Inductor kernels it holds (Triton kernels on GPUs, C++ ones on CPUs).
  The only detector that sees Inductor kernels; its time is the file's mtime.
* :class:`TritonHook` — ``triton.knobs.runtime.jit_post_compile_hook``,
  installed before the engine starts (chaining any hook already there, and
  vLLM's monitor chains to it): every ``@triton.jit`` compile in this process,
  with the time it ended. Not installed when Triton is absent.
* :class:`JitMonitorLog` — the warnings of vLLM's kernel JIT monitor
  (``vllm.utils.jit_monitor``, vLLM >= 0.26), active once start-up is over:
  ``Triton kernel JIT compilation during inference: NAME``.

A kernel seen by several detectors is one compile: :func:`merge` keeps, per
kernel name, the most occurrences any detector saw.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The cache variables :class:`CacheScan` points at fresh directories.
CACHE_VARIABLES = ("TRITON_CACHE_DIR", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR")
#: A Triton kernel's cache group file: ``__grp__NAME.json``.
TRITON_GROUP = re.compile(r"^__grp__(?P<name>.+)\.json$")
#: A kernel defined in Inductor's output code: ``NAME = async_compile.triton('NAME', ...`` /
#: ``NAME = async_compile.cpp_pybinding(...``.
INDUCTOR_KERNEL = re.compile(r"^(?P<name>\w+) = async_compile\.(?P<how>\w+)\(", re.M)
#: vLLM's JIT monitor warning (``vllm/utils/jit_monitor.py::_handle_jit_event``).
MONITOR_LINE = re.compile(r"^(?P<backend>\S+) (?P<event>.+?) during inference: (?P<name>[^\s(.]+)")
#: The most characters of a variant key kept (:func:`variant_text`).
MAX_VARIANT = 400
#: Hex digits of the digest that ends a cut variant key.
VARIANT_DIGEST = 16
#: Logger of vLLM's JIT monitor.
MONITOR_LOGGER = "vllm.utils.jit_monitor"


@dataclass(frozen=True)
class CompileEvent:
    """One kernel compile one detector saw."""

    #: ``cache``, ``triton-hook`` or ``jit-monitor``.
    detector: str
    #: The kernel's name (``_topk_topp_kernel``, ``triton_per_fused_ge_sum_0``,
    #: ``cpp_fused_ge_sum_0``).
    name: str
    #: ``triton``, ``inductor`` or the monitor's backend.
    kind: str
    #: When it was seen (seconds since the epoch, ``time.time()``; for the
    #: cache scan the file's mtime).
    at: float
    #: Which variant (the Triton hook: the specialization key Triton caches
    #: the kernel under, which tells two variants of one kernel apart); ''
    #: where the detector cannot tell.
    variant: str = ""


def merge(events: Iterable[CompileEvent]) -> dict[str, int]:
    """Compiles as one count per kernel name: the most occurrences any one
    detector saw (a kernel seen by the hook and the cache scan is one compile)."""
    per: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for e in events:
        per[e.detector][e.name] += 1
    names: dict[str, int] = {}
    for counter in per.values():
        for name, n in counter.items():
            names[name] = max(names.get(name, 0), n)
    return dict(sorted(names.items()))


class CacheScan:
    """New kernels in fresh compile cache directories.

    :meth:`use_fresh_dirs` must run before vLLM, torch's Inductor or Triton
    read the variables (the coverage command calls it first thing).
    """

    name = "cache"

    def __init__(self, root: Path, owned: bool = False):
        self.root = root
        #: Whether :meth:`remove` may delete ``root`` (a directory it made).
        self.owned = owned
        self.dirs = {var: root / var.lower() for var in CACHE_VARIABLES}
        self._seen: set[Path] = set()

    @classmethod
    def use_fresh_dirs(cls, root: Path | None = None) -> CacheScan:
        """Point :data:`CACHE_VARIABLES` at new empty directories under
        ``root`` (default: a new temporary directory) in ``os.environ``, and
        leave ``STEPWARM_CACHE_DIR`` out (the idle record then lives under
        the fresh ``VLLM_CACHE_ROOT``)."""
        scan = cls(Path(root), owned=False) if root is not None else cls(
            Path(tempfile.mkdtemp(prefix="stepwarm-coverage-")), owned=True)
        for var, d in scan.dirs.items():
            d.mkdir(parents=True, exist_ok=True)
            os.environ[var] = str(d)
        # STEPWARM_SKIP_IDLE's record goes with vLLM's cache, not a fixed
        # directory that a run before this one filled
        os.environ.pop("STEPWARM_CACHE_DIR", None)
        return scan

    @classmethod
    def reuse_dirs(cls, root: Path) -> CacheScan:
        """Point :data:`CACHE_VARIABLES` at the directories under ``root`` a
        :meth:`use_fresh_dirs` run filled (a restart on a cache volume), the
        files already there taken as seen: :meth:`poll` finds what this
        process compiles that the cache did not hold."""
        scan = cls.use_fresh_dirs(root)
        scan._seen = scan._files()
        return scan

    @classmethod
    def watch_current_dirs(cls) -> CacheScan:
        """The cache directories in use now (each variable of
        :data:`CACHE_VARIABLES`, else its default: Triton's ``~/.triton/cache``,
        vLLM's ``~/.cache/vllm``, Inductor's ``default_cache_dir()``), the
        files already there taken as seen: :meth:`poll` finds what is compiled
        from now on, without the cold start of :meth:`use_fresh_dirs`."""
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        defaults = {"TRITON_CACHE_DIR": Path.home() / ".triton" / "cache",
                    "VLLM_CACHE_ROOT": Path.home() / ".cache" / "vllm",
                    "TORCHINDUCTOR_CACHE_DIR": Path(default_cache_dir())}
        scan = cls(Path("/"), owned=False)
        scan.dirs = {var: Path(os.environ.get(var) or defaults[var]) for var in CACHE_VARIABLES}
        scan._seen = scan._files()
        return scan

    def remove(self) -> None:
        """Delete the cache directories if this scan made them (a temporary directory)."""
        if self.owned:
            shutil.rmtree(self.root, ignore_errors=True)

    def _files(self) -> set[Path]:
        found: set[Path] = set()
        for d in self.dirs.values():
            for dirpath, _, files in os.walk(d):
                for f in files:
                    if TRITON_GROUP.match(f) or f.endswith(".py"):
                        found.add(Path(dirpath) / f)
        return found

    def poll(self) -> list[CompileEvent]:
        """Kernels in files that appeared since the last poll, oldest first."""
        new = self._files() - self._seen
        self._seen |= new
        events = []
        for path in new:
            try:
                at = path.stat().st_mtime
            except OSError:
                continue
            m = TRITON_GROUP.match(path.name)
            if m:
                events.append(CompileEvent(self.name, m.group("name"), "triton", at))
                continue
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            for k in INDUCTOR_KERNEL.finditer(text):
                events.append(CompileEvent(self.name, k.group("name"), "inductor", at))
        # An Inductor Triton kernel also leaves a __grp__ file: one compile.
        inductor = {e.name for e in events if e.kind == "inductor"}
        events = [e for e in events if not (e.kind == "triton" and e.name in inductor)]
        return sorted(events, key=lambda e: (e.at, e.name))


def variant_text(key: Any) -> str:
    """A Triton variant key as reports keep it: whole up to
    :data:`MAX_VARIANT` characters; a longer one cut, ending in ``#`` and a
    digest of the whole key, so that keys differing only past the cut stay
    apart (``fused_moe_kernel``'s block sizes come after 400 characters of
    argument types)."""
    text = str(key)
    if len(text) <= MAX_VARIANT:
        return text
    digest = hashlib.blake2b(text.encode(), digest_size=VARIANT_DIGEST // 2).hexdigest()
    return f"{text[:MAX_VARIANT - VARIANT_DIGEST - 1]}#{digest}"


class TritonHook:
    """``triton.knobs.runtime.jit_post_compile_hook``: every ``@triton.jit``
    compile in this process."""

    name = "triton-hook"

    def __init__(self) -> None:
        self.events: list[CompileEvent] = []
        self._taken = 0
        self.installed = False

    def install(self) -> bool:
        """Install the hook (chaining the one there). Returns whether Triton
        has the knob (False without Triton or with a Triton before 3.4)."""
        try:
            from triton import knobs
        except Exception:  # noqa: BLE001 - no Triton, or one without knobs
            return False
        runtime = getattr(knobs, "runtime", None)
        if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
            return False
        previous = runtime.jit_post_compile_hook

        def hook(**kwargs: Any) -> Any:
            fn = kwargs.get("fn")
            name = getattr(fn, "name", None) or getattr(fn, "__name__", None) or repr(fn)
            key = kwargs.get("key")
            self.events.append(CompileEvent(self.name, str(name), "triton", time.time(),
                                            "" if key is None else variant_text(key)))
            return previous(**kwargs) if previous is not None else None

        runtime.jit_post_compile_hook = hook
        self.installed = True
        return True

    def poll(self) -> list[CompileEvent]:
        """Events since the last poll."""
        new = self.events[self._taken:]
        self._taken = len(self.events)
        return new


class JitMonitorLog(logging.Handler):
    """vLLM's JIT monitor warnings, as compile events (a logging handler on
    :data:`MONITOR_LOGGER`)."""

    name = "jit-monitor"

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.events: list[CompileEvent] = []
        self._taken = 0
        self.installed = False

    def install(self) -> None:
        """Attach to vLLM's monitor logger (records reach it whatever vLLM's
        own handlers do with them)."""
        logging.getLogger(MONITOR_LOGGER).addHandler(self)
        self.installed = True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            m = MONITOR_LINE.match(record.getMessage())
        except Exception:  # noqa: BLE001 - a bad record is vLLM's to report
            return
        if m:
            self.events.append(CompileEvent(self.name, m.group("name"),
                                            m.group("backend").lower(), record.created))

    def poll(self) -> list[CompileEvent]:
        """Events since the last poll."""
        new = self.events[self._taken:]
        self._taken = len(self.events)
        return new


#: Slack around a time window (s): a cache file's mtime comes from the
#: kernel's coarse clock, a few ms behind ``time.time()``.
SLACK_S = 0.01


class Detectors:
    """Every detector available here, polled together."""

    def __init__(self, scan: CacheScan):
        self.scan = scan
        self.hook = TritonHook()
        self.monitor = JitMonitorLog()

    @classmethod
    def start(cls, cache_root: Path | None = None) -> Detectors:
        """Fresh cache directories, the Triton hook (if Triton is here) and the
        monitor log handler. Call before vLLM, torch or Triton start compiling."""
        detectors = cls(CacheScan.use_fresh_dirs(cache_root))
        detectors.hook.install()
        detectors.monitor.install()
        return detectors

    @classmethod
    def restart(cls, cache_root: Path) -> Detectors:
        """The cache scan alone, on the caches a fresh run left under
        ``cache_root`` (:meth:`CacheScan.reuse_dirs`). Triton calls its
        post-compile hook, and vLLM's JIT monitor warns, for a kernel loaded
        from the disk cache too: on a warm cache they would count loads as
        compiles, so neither is installed."""
        return cls(CacheScan.reuse_dirs(cache_root))

    @classmethod
    def watch(cls, hooks: bool = True) -> Detectors:
        """The cache directories in use (:meth:`CacheScan.watch_current_dirs`),
        and with ``hooks`` the Triton hook and the monitor log handler:
        compiles from now on, caches kept warm (``stepwarm run``'s slow steps).
        ``hooks=False`` on vLLM's CPU build, where neither can see anything
        (vLLM disables Triton there; its JIT monitor watches Triton, CuTe DSL
        and TileLang kernels only): a slow step then names the cache scan alone."""
        detectors = cls(CacheScan.watch_current_dirs())
        if hooks:
            detectors.hook.install()
            detectors.monitor.install()
        return detectors

    @property
    def available(self) -> list[str]:
        """Names of the detectors that can see something here."""
        return [self.scan.name] + ([self.hook.name] if self.hook.installed else []) + (
            [self.monitor.name] if self.monitor.installed else [])

    def poll(self) -> list[CompileEvent]:
        """Every detector's events since the last poll, oldest first."""
        return sorted(self.scan.poll() + self.hook.poll() + self.monitor.poll(),
                      key=lambda e: (e.at, e.detector, e.name))

    def poll_between(self, start: float, end: float) -> list[CompileEvent]:
        """The events of :meth:`poll` seen within ``start``..``end`` (``time.time()``
        values), :data:`SLACK_S` either side; the others are dropped."""
        return [e for e in self.poll() if start - SLACK_S <= e.at <= end + SLACK_S]

    def stop(self) -> None:
        """Detach the log handler (the Triton hook stays chained: harmless)
        and delete the temporary cache directories."""
        logging.getLogger(MONITOR_LOGGER).removeHandler(self.monitor)
        self.scan.remove()
