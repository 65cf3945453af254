"""Which scenarios compiled nothing at the last start with this configuration.

A restart on warm caches (a cache volume, a rescheduled pod) still runs every
scenario, loading from the caches what the fresh start compiled. A scenario
that compiled nothing when it last ran here - no Triton kernel compiled or
loaded in the process, no Dynamo frame or Inductor graph - cannot compile
anything when it runs again under the same configuration: everything it used
was already in the process, put there by vLLM's own warmup or by the
scenarios before it, and those still run. With ``STEPWARM_SKIP_IDLE=1`` the
plugin skips such scenarios, so a restart pays only for the scenarios that
bring kernels into the process.

"The same configuration" is a key over stepwarm's and vLLM's versions, vLLM's
config and environment hashes (those of its compile cache), the worker's
runner profile, and the scenarios' planned steps in their order (a
scenario's idleness depends on the ones before it). The record is one JSON
file per key and rank under ``<VLLM_CACHE_ROOT>/stepwarm/`` (or
``STEPWARM_CACHE_DIR``): deleting it, changing any of those, or a scenario
that fails, makes the scenario run again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepwarm.deferred_compile import in_compile_thread

logger = logging.getLogger("vllm.stepwarm")

#: The record's format version (a different one is ignored).
FORMAT = 1


def _dynamo_activity() -> int:
    """Sum of torch._dynamo's frame and Inductor counters (0 without torch)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # noqa: BLE001 - no torch / no dynamo: nothing counted
        return 0
    return sum(sum(counters[group].values()) for group in ("frames", "inductor")
               if group in counters)


@dataclass
class CompileActivity:
    """Compiles (and in-process first loads) seen while it is active.

    ``triton.knobs.runtime.jit_post_compile_hook`` counts every ``@triton.jit``
    specialization the process builds, from source or from the disk cache,
    chaining the hook that was there; torch._dynamo's counters count frames
    and Inductor graphs. Restores the previous hook on exit.
    """

    triton: int = 0
    dynamo_before: int = 0
    dynamo_after: int = 0

    @property
    def count(self) -> int:
        return self.triton + max(0, self.dynamo_after - self.dynamo_before)


@contextmanager
def compile_activity() -> Iterator[CompileActivity]:
    """Count compiles inside the ``with`` block (see :class:`CompileActivity`)."""
    seen = CompileActivity(dynamo_before=_dynamo_activity())
    runtime: Any = None
    try:
        from triton import knobs
        runtime = knobs.runtime
        previous = runtime.jit_post_compile_hook
    except Exception:  # noqa: BLE001 - no Triton (or no knobs): Dynamo alone
        runtime = None

    def hook(*args: Any, **kwargs: Any) -> Any:
        if not in_compile_thread():  # a deferred compile: its scenario's report lists it
            seen.triton += 1
        return previous(*args, **kwargs) if previous is not None else None

    if runtime is not None:
        runtime.jit_post_compile_hook = hook
    try:
        yield seen
    finally:
        if runtime is not None:
            runtime.jit_post_compile_hook = previous
        seen.dynamo_after = _dynamo_activity()


def record_dir() -> Path:
    """``STEPWARM_CACHE_DIR``, else ``<VLLM_CACHE_ROOT>/stepwarm``."""
    explicit = os.environ.get("STEPWARM_CACHE_DIR", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    from stepwarm import vllm_facts
    return Path(vllm_facts.cache_root()) / "stepwarm"


def configuration_key(parts: Sequence[str]) -> str:
    """SHA-256 over ``parts`` (each a string), hex."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


@dataclass
class IdleRecord:
    """The scenarios that compiled nothing at the last start with ``key``."""

    key: str
    path: Path
    idle: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def load(cls, key: str, rank_label: str, directory: Path | None = None) -> IdleRecord:
        """The record for ``key`` on this rank; an empty one when there is
        none or it cannot be read (its scenarios then all run)."""
        directory = directory if directory is not None else record_dir()
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in rank_label)
        path = directory / f"idle-{key[:24]}-{safe or 'rank'}.json"
        record = cls(key=key, path=path)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return record
        if (isinstance(data, dict) and data.get("format") == FORMAT and data.get("key") == key
                and isinstance(data.get("idle"), dict)):
            record.idle = {str(k): bool(v) for k, v in data["idle"].items()}
        return record

    def is_idle(self, scenario: str) -> bool:
        return self.idle.get(scenario, False)

    def save(self) -> bool:
        """Write the record atomically; False (logged) when the directory
        cannot be written."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".idle-", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump({"format": FORMAT, "key": self.key, "idle": self.idle}, f,
                          indent=1, sort_keys=True)
            os.replace(tmp, self.path)
            return True
        except OSError as e:
            logger.info("stepwarm: idle record not written (%s): %s", self.path, e)
            return False
