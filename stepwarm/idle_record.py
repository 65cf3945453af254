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

The same holds inside a scenario, a segment at a time: a plan cut where no
request is left in the runner (:meth:`stepwarm.plan.Plan.segments`) runs
the same without the segments before it. The record keeps, per scenario,
the segments whose steps compiled (a compile in a thread counts for the step
that asked for it); a restart runs those alone, and skips the scenario when
there are none. On the Llama-3.1-8B shape the fresh start's ``sampler-matrix``
compiled in 9 of its 71 steps, in 7 of its 23 segments (22 steps).

The record also keeps the calls of the GEMM ladder that loaded a kernel
(:mod:`stepwarm.gemm_sizes`), with a signature of the ladder (device,
versions, shapes, counts): a restart with the same one runs those calls
alone.

"The same configuration" is a key over stepwarm's and vLLM's versions, vLLM's
config and environment hashes (those of its compile cache), the kernel
environment (:func:`kernel_environment`: torch, Triton, FlashInfer, CUDA,
the GPU), the sampler settings vLLM's hash leaves out
(:func:`stepwarm.vllm_facts.sampler_settings`), the worker's runner profile
but what varies from start to start (``num_blocks``), and the scenarios'
planned steps in their order (a scenario's idleness depends on the ones
before it): :func:`stepwarm.hook.idle_key_parts`. The record is one JSON
file per key and rank under ``<VLLM_CACHE_ROOT>/stepwarm/`` (or
``STEPWARM_CACHE_DIR``), the newest :data:`KEEP_RECORDS` of a rank kept:
deleting it, changing any of those, or a scenario that fails, makes the
scenario run again. A record is trusted only as a
regular file of this user's, of at most :data:`MAX_RECORD_BYTES`, reached
without following a link (:func:`read_trusted`); it is written the same way.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepwarm.deferred_compile import in_compile_thread
from stepwarm.files import file_type

logger = logging.getLogger("vllm.stepwarm")

#: The record's format version (a different one is ignored).
FORMAT = 3


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

    def so_far(self) -> int:
        """The compiles counted until now (Dynamo's: in any thread, also after
        the ``with`` block)."""
        return self.triton + max(0, _dynamo_activity() - self.dynamo_before)


@dataclass
class StepCompiles:
    """The indices of the steps during which ``activity`` counted a compile;
    :meth:`start` and :meth:`end` are :func:`stepwarm.driver.drive`'s
    ``on_step_start`` and ``on_step``."""

    activity: CompileActivity
    steps: set[int] = field(default_factory=set)
    _before: int = 0

    def start(self, step: Any, what: str) -> None:
        self._before = self.activity.so_far()

    def end(self, result: Any) -> None:
        if self.activity.so_far() > self._before:
            self.steps.add(result.index)


def busy_segments(plan: Any, steps: Iterable[int]) -> set[int]:
    """The numbers of ``plan``'s :meth:`~stepwarm.plan.Plan.segments` that
    hold one of the step indices ``steps``."""
    steps = set(steps)
    return {i for i, part in enumerate(plan.segments())
            if any(plan.steps[pos].index in steps for pos in part)}


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


def record_dir() -> Path:
    """``STEPWARM_CACHE_DIR``, else ``<VLLM_CACHE_ROOT>/stepwarm``."""
    explicit = os.environ.get("STEPWARM_CACHE_DIR", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    from stepwarm import vllm_facts
    return Path(vllm_facts.cache_root()) / "stepwarm"


#: Distributions whose versions decide compiled kernels, each under the names
#: it is installed as (the first found is read; none: "none").
KERNEL_DISTRIBUTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch", ("torch",)),
    ("triton", ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu")),
    ("flashinfer", ("flashinfer-python", "flashinfer")),
)


def kernel_environment() -> list[str]:
    """What decides the kernels a process compiles besides vLLM's config:
    the torch, Triton and FlashInfer versions (their installed distributions,
    ``importlib.metadata``: nothing is imported), the CUDA (or HIP) version
    torch was built with and the GPU's name (``torch.cuda.get_device_name``;
    ``"cpu"`` without one), as ``"name version"`` strings."""
    from importlib import metadata

    out = []
    for name, dists in KERNEL_DISTRIBUTIONS:
        version = "none"
        for dist in dists:
            try:
                version = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
        out.append(f"{name} {version}")
    cuda, gpu = "none", "cpu"
    with contextlib.suppress(Exception):  # no torch: "none" / "cpu"
        import torch

        cuda = str(torch.version.cuda or getattr(torch.version, "hip", None) or "none")
        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name()
    return [*out, f"cuda {cuda}", f"gpu {gpu}"]


def configuration_key(parts: Sequence[str]) -> str:
    """SHA-256 over ``parts`` (each a string), hex."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


@dataclass
class IdleRecord:
    """Per scenario, the segments that compiled at the last start with ``key``:
    ``scenarios[name] = (number of segments, the busy ones)``."""

    key: str
    path: Path
    scenarios: dict[str, tuple[int, frozenset[int]]] = field(default_factory=dict)
    #: The GEMM ladder's signature (SHA-256 of :meth:`GemmLadder.signature
    #: <stepwarm.gemm_sizes.GemmLadder.signature>`) and its calls that loaded a kernel.
    gemms: tuple[str, frozenset[tuple[int, int]]] | None = None

    @classmethod
    def load(cls, key: str, rank_label: str, directory: Path | None = None) -> IdleRecord:
        """The record for ``key`` on this rank; an empty one when there is
        none or it cannot be read (its scenarios then all run)."""
        directory = directory if directory is not None else record_dir()
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in rank_label)
        path = directory / f"idle-{key[:24]}-{safe or 'rank'}.json"
        record = cls(key=key, path=path)
        text = read_trusted(path)
        if text is None:
            return record
        try:
            data = json.loads(text)
        except Exception:  # noqa: BLE001 - not JSON, too deep: nothing known
            return record
        if not (isinstance(data, dict) and data.get("format") == FORMAT
                and data.get("key") == key and isinstance(data.get("scenarios"), dict)):
            return record
        for name, entry in data["scenarios"].items():
            read = _entry(entry)
            if read is not None:  # an entry that cannot be read: that scenario runs whole
                record.scenarios[str(name)] = read
        record.gemms = _gemms(data.get("gemms"))
        return record

    def busy(self, scenario: str, segments: int) -> frozenset[int] | None:
        """The segments of ``scenario`` that compiled at the last start; None
        when the record does not know it with ``segments`` segments."""
        entry = self.scenarios.get(scenario)
        return entry[1] if entry is not None and entry[0] == segments else None

    def note(self, scenario: str, segments: int, busy: Iterable[int]) -> None:
        """Keep ``scenario``'s busy segments for the next start."""
        self.scenarios[scenario] = (segments, frozenset(busy))

    def forget(self, scenario: str) -> None:
        """Drop ``scenario``'s entry: it runs whole at the next start."""
        self.scenarios.pop(scenario, None)

    def gemm_loads(self, signature: str) -> frozenset[tuple[int, int]] | None:
        """The GEMM ladder's calls that loaded a kernel at the last start,
        when its ladder had this ``signature``; None when not known."""
        if self.gemms is None or self.gemms[0] != configuration_key([signature]):
            return None
        return self.gemms[1]

    def note_gemms(self, signature: str, loads: Iterable[tuple[int, int]]) -> None:
        """Keep the ladder's calls that loaded a kernel for the next start."""
        self.gemms = (configuration_key([signature]), frozenset((int(g), int(m)) for g, m in loads))

    def save(self) -> bool:
        """Write the record atomically (a new temporary file, mode 0600, renamed
        over the path: a link there is replaced, never followed); False
        (logged) when it cannot be written. A process writes a key's record
        once: its start-up's, not what a later warmup in the same process
        found already loaded."""
        if self.path in _SAVED:
            return True
        data = {"format": FORMAT, "key": self.key,
                "scenarios": {name: {"segments": n, "busy": sorted(busy)}
                              for name, (n, busy) in self.scenarios.items()}}
        if self.gemms is not None:
            data["gemms"] = {"ladder": self.gemms[0],
                             "loads": [list(c) for c in sorted(self.gemms[1])]}
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".idle-", suffix=".tmp")
            with os.fdopen(fd, "w") as f:  # mkstemp: O_EXCL, mode 0600
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
            _SAVED.add(self.path)
        except OSError as e:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            logger.info("stepwarm: idle record not written (%s): %s", self.path, e)
            return False
        removed = prune_records(self.path)
        if removed:
            logger.info("stepwarm: %d stale idle record(s) removed beside %s (the newest %d "
                        "of a rank are kept)", len(removed), self.path, KEEP_RECORDS)
        return True


#: Records kept per rank in a directory: writing one removes this user's
#: records of the same rank beyond the newest ``KEEP_RECORDS`` (by
#: modification time; the one written is the newest). Each configuration a
#: cache volume serves (model, versions, settings, scenarios) has one.
KEEP_RECORDS = 16

#: A record's file name: the key's first 24 hex digits and the rank label.
_RECORD_NAME = re.compile(r"idle-[0-9a-f]{24}-(?P<rank>[A-Za-z0-9_-]+)\.json")


def prune_records(written: Path, keep: int = KEEP_RECORDS) -> list[Path]:
    """Remove this user's records (regular files, links not followed) of
    ``written``'s rank in its directory beyond the newest ``keep``; the
    removed paths. Another user's files, and names not a record's, are left."""
    m = _RECORD_NAME.fullmatch(written.name)
    if m is None:
        return []
    mine: list[tuple[int, str]] = []
    uid = os.geteuid()
    with contextlib.suppress(OSError), os.scandir(written.parent) as entries:
        for entry in entries:
            other = _RECORD_NAME.fullmatch(entry.name)
            if other is None or other["rank"] != m["rank"]:
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_uid == uid:
                    mine.append((st.st_mtime_ns, entry.name))
    mine.sort(key=lambda t: (t[1] != written.name, -t[0]))  # the one written first
    removed = []
    for _, name in mine[keep:]:
        with contextlib.suppress(OSError):
            os.unlink(written.parent / name)
            removed.append(written.parent / name)
    return removed


#: The records this process wrote (:meth:`IdleRecord.save`).
_SAVED: set[Path] = set()

#: The largest record read (bytes); a larger file is ignored. A record of
#: every built-in scenario on the Llama-3.1-8B shape is under 8 KiB.
MAX_RECORD_BYTES = 1 << 20


def read_trusted(path: Path) -> str | None:
    """The text of the record at ``path`` when it is one this process may
    trust: a regular file (not a link: ``O_NOFOLLOW``), owned by this user,
    of at most :data:`MAX_RECORD_BYTES` bytes. None when there is no file;
    None and one log line naming the path and why for anything else (a FIFO
    is opened with ``O_NONBLOCK`` and refused by its ``fstat``, so it never
    blocks; a file another user could write in a shared cache directory
    never decides what runs)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        why = "a symbolic link" if e.errno == errno.ELOOP else f"cannot be opened: {e.strerror}"
        return _ignored(path, why)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # before fdopen, which refuses a directory (the third trial)
        os.close(fd)
        return _ignored(path, f"not a regular file ({file_type(st.st_mode)})")
    with os.fdopen(fd, "rb") as f:
        if st.st_uid != os.geteuid():
            return _ignored(path, f"owned by uid {st.st_uid}, not this user (uid {os.geteuid()})")
        if st.st_size > MAX_RECORD_BYTES:
            return _ignored(path, f"{st.st_size} bytes, more than {MAX_RECORD_BYTES}")
        try:
            data = f.read(MAX_RECORD_BYTES + 1)
        except OSError as e:
            return _ignored(path, f"cannot be read: {e.strerror}")
    if len(data) > MAX_RECORD_BYTES:  # grew since the fstat
        return _ignored(path, f"more than {MAX_RECORD_BYTES} bytes")
    return data.decode("utf-8", errors="replace")


def _ignored(path: Path, why: str) -> None:
    logger.warning("stepwarm: idle record %s ignored: %s; every scenario runs", path, why)
    return None


def _entry(entry: Any) -> tuple[int, frozenset[int]] | None:
    """A record entry ``{"segments": N, "busy": [i, ...]}`` with every
    ``0 <= i < N``, integers all; None for anything else."""
    if not isinstance(entry, dict):
        return None
    n, busy = entry.get("segments"), entry.get("busy")
    if type(n) is not int or n < 0 or not isinstance(busy, list) or \
            not all(type(i) is int and 0 <= i < n for i in busy):
        return None
    return n, frozenset(busy)


def _gemms(entry: Any) -> tuple[str, frozenset[tuple[int, int]]] | None:
    """The record's ``{"ladder": SHA, "loads": [[g, m], ...]}`` (non-negative
    integers); None for anything else (the whole ladder runs)."""
    if not isinstance(entry, dict):
        return None
    ladder, loads = entry.get("ladder"), entry.get("loads")
    if not isinstance(ladder, str) or not isinstance(loads, list) or not all(
            isinstance(c, list) and len(c) == 2 and all(type(v) is int and v >= 0 for v in c)
            for c in loads):
        return None
    return ladder, frozenset((g, m) for g, m in loads)
