"""Memory before, after and at the peak of a scenario.

On CUDA: ``torch.cuda.mem_get_info`` (the device's free memory, every
process together, what vLLM's own memory profiling reads) before and after,
and ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``
(the torch pool's peak). On CPU: the process's resident set (``VmRSS`` of
``/proc/self/status``) before and after, and its peak (``VmHWM``, reset
through ``/proc/self/clear_refs`` when the kernel lets us; otherwise the
process's peak so far). Warmup OOMs after the KV cache is allocated come from
memory not profiled (sampler workspaces, autotune scratch, lazily loaded
kernels), which is what a scenario that leaves less free memory shows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

#: Free memory a scenario may leave lower (bytes) before it is flagged:
#: allocator rounding and lazily created handles move a few MiB.
TOLERANCE_BYTES = 64 << 20


@dataclass
class MemoryReport:
    """Memory around one scenario (bytes)."""

    #: ``cuda:N`` or ``cpu``.
    device: str
    #: Free device memory before / after (CUDA ``mem_get_info``); on CPU the
    #: process's RSS is what is read, so these are None there.
    free_before: int | None = None
    free_after: int | None = None
    #: Memory in use by this process before / after: CUDA
    #: ``memory_allocated``, CPU ``VmRSS``.
    used_before: int = 0
    used_after: int = 0
    #: CUDA: this process's caching allocator (``memory_reserved``) before /
    #: after: on a device other processes share, free memory moves with
    #: theirs, this does not. None on CPU.
    reserved_before: int | None = None
    reserved_after: int | None = None
    #: Peak during the scenario: CUDA ``max_memory_allocated``, CPU
    #: ``VmHWM`` (since the reset; ``peak_reset`` False: since the process
    #: started).
    peak: int = 0
    peak_reset: bool = True
    #: The scenario left more than :data:`TOLERANCE_BYTES` less free memory
    #: (CUDA) or more resident memory (CPU) than it found.
    lower_after: bool = False

    @property
    def lost(self) -> int:
        """Bytes of free memory the scenario took and kept (negative: it freed)."""
        if self.free_before is not None and self.free_after is not None:
            return self.free_before - self.free_after
        return self.used_after - self.used_before


def lower_text(report: MemoryReport) -> str:
    """``"left M MiB less free memory on DEVICE than it found (...; peak P MiB)"``
    for a flagged report: on CUDA with this process's allocator growth; on the
    CPU (no free memory read) the process's resident memory growth, said so."""
    mine = ""
    if report.reserved_before is not None and report.reserved_after is not None:
        mine = (f"this process's allocator {(report.reserved_after - report.reserved_before) / 2**20:+.0f}"
                " MiB; ")
    if report.free_before is None or report.free_after is None:  # CPU: resident memory
        return (f"left this process {report.lost / 2**20:.0f} MiB more resident memory on "
                f"{report.device} than it found (peak {report.peak / 2**20:.0f} MiB)")
    return (f"left {report.lost / 2**20:.0f} MiB less free memory on {report.device} than it "
            f"found ({mine}peak {report.peak / 2**20:.0f} MiB)")


def flag(report: MemoryReport, tolerance: int = TOLERANCE_BYTES) -> MemoryReport:
    """Set ``report.lower_after`` when it lost more than ``tolerance`` bytes."""
    report.lower_after = report.lost > tolerance
    return report


def _proc_status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_cpu_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _cuda_device() -> int | None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return None


@contextlib.contextmanager
def measured() -> Iterator[MemoryReport]:
    """Measure the ``with`` block; the yielded report is filled in on exit
    (also when the block raises) and flagged (:func:`flag`)."""
    import torch

    device = _cuda_device()
    if device is not None:
        torch.cuda.synchronize(device)
        free, _ = torch.cuda.mem_get_info(device)
        torch.cuda.reset_peak_memory_stats(device)
        report = MemoryReport(device=f"cuda:{device}", free_before=free,
                              used_before=torch.cuda.memory_allocated(device),
                              reserved_before=torch.cuda.memory_reserved(device))
    else:
        reset = _reset_cpu_peak()
        report = MemoryReport(device="cpu", used_before=_proc_status("VmRSS"), peak_reset=reset)
    try:
        yield report
    finally:
        if device is not None:
            _read_cuda_after(report, device)
            report.peak = torch.cuda.max_memory_allocated(device)
        else:
            report.used_after = _proc_status("VmRSS")
            report.peak = max(_proc_status("VmHWM"), report.used_after)
        flag(report)


def free_text() -> str:
    """The device's free memory now, for an out-of-memory message."""
    device = _cuda_device()
    if device is None:
        return f"process RSS {_proc_status('VmRSS') / 2**30:.2f} GiB"
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return f"cuda:{device} has {free / 2**30:.2f} GiB free of {total / 2**30:.2f} GiB"


def give_back(report: MemoryReport, tolerance: int = TOLERANCE_BYTES) -> int:
    """After stepwarm's whole warmup (``report`` measured around it): vLLM
    sized the KV cache before stepwarm ran (0.26: allocated it; 0.34: measured
    what its extensible cache may commit), so blocks the torch allocator
    reserved for stepwarm's steps and kept cached are memory vLLM's budget
    does not hold. When this process's allocator grew by more than
    ``tolerance``, release its unused cached blocks (``torch.cuda.empty_cache``,
    as vLLM does after CUDA-graph capture) and measure again. Returns the bytes
    released (0 on CPU or when nothing grew); ``report`` then says what
    stepwarm keeps (:attr:`MemoryReport.lost`: lazily made buffers, loaded
    kernels)."""
    if report.reserved_before is None or report.reserved_after is None:
        return 0
    if report.reserved_after - report.reserved_before <= tolerance:
        return 0
    import gc

    import torch

    device = int(report.device.split(":")[1])
    grown = report.reserved_after
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    _read_cuda_after(report, device)
    flag(report, tolerance)
    return grown - (report.reserved_after or 0)


def _read_cuda_after(report: MemoryReport, device: int) -> None:
    """The ``*_after`` fields off CUDA device ``device``, the device synchronized first."""
    import torch

    torch.cuda.synchronize(device)
    report.free_after, _ = torch.cuda.mem_get_info(device)
    report.used_after = torch.cuda.memory_allocated(device)
    report.reserved_after = torch.cuda.memory_reserved(device)
