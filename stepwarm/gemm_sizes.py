"""cuBLAS's GEMM kernels for the token counts that steps run eagerly.

A step above the CUDA-graph sizes runs its linear layers eagerly, and cuBLAS
picks a GEMM kernel by the shape, the token count (M) included. The first
launch of a kernel in a process costs milliseconds (CUDA loads its module,
cuBLAS sets it up: 5-15 ms each on an H200, ``benchmarks/gpu_probe_gemm_ladder.py``),
compiles nothing, and falls to the first request whose prefill reaches a new
kernel: the restart outliers that ``stepwarm coverage --trace`` names
(docs/findings.md). Scenario steps at every token count would cost a deep
model more than they move; the GEMMs alone cost one layer per distinct shape.

:func:`warm_gemm_sizes` runs each distinct unquantized linear-layer shape of
the model once (through the layer's own ``quant_method.apply``, the call the
model makes) at every count of :func:`gemm_token_counts`, above the largest
CUDA-graph size (those steps replay captured graphs, whose kernels were
loaded at capture; from 1 where mixed batches get no graph) up to
``max_num_batched_tokens``. cuBLAS's choice follows the count's size and its
alignment: ``benchmarks/gpu_probe_gemm_choice.py`` ran Llama-3.1-8B's four
projections at every count from 1 to 16,384 on the H200 and saw 88-119
kernels per GEMM, the choice changing about every 8 counts, often at a
multiple of 8, 16 or 32 alone (2,400 = 32 x 75 ran ``..._256x160_...``,
2,399 and 2,401 ``..._256x152_...``). Sixteen counts an octave
(``ceil(2 ** (k / 16))``), each with the next odd multiple of 8, of 16 and
of 32 above it (:data:`ALIGNMENTS`), leave 0.5 % of the counts above 512
picking a kernel no count of the ladder loaded, on that map (305 counts);
eight an octave alone left 13 % (41 counts).

The logits GEMM (the LM head, ``UnquantizedEmbeddingMethod.apply``: the
input embedding where the head is tied) runs eagerly in every step, graphed
or not, at one row per sampled token: :func:`warm_gemm_sizes` runs it at
every row count from 1 to 256, then as the linear layers, up to ``max_num_seqs``
times one plus ``num_speculative_tokens`` (:func:`head_row_counts`). On the
H200 (run s15) the first 40-request prefill of Llama-3.1-8B and Gemma-3-12B,
and the first 8-request step of granite-4.0-h, each paid 5-6 ms in that
GEMM's first call (``aten::mm``, a cuBLAS kernel first launched) after every
scenario had run; with eight counts an octave (run s16) the tiny Llama's
40-row call still did.

A restart needs the kernels again (they are loaded per process), but not
the whole ladder: most calls reuse a kernel an earlier one loaded. Each call
is timed on the host; one of :data:`FIRST_LAUNCH_MS` or more loaded a kernel
(:attr:`GemmReport.loads`). With ``STEPWARM_SKIP_IDLE=1`` the idle record
keeps those calls (:mod:`stepwarm.idle_record`), the ladder runs before the
scenarios (so that what it loads does not depend on which segments ran), and
a restart with the same ladder on the same device runs those calls alone.

Inputs are zeros; outputs are dropped. Nothing random is drawn and nothing
is written to the model or the KV cache. On CPU, and for quantized layers
(their kernels are not cuBLAS's), it does nothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stepwarm.memory import MemoryReport, measured

if TYPE_CHECKING:
    from stepwarm.worker_view import WorkerView

#: Token counts per octave of the ladder (:func:`gemm_token_counts`).
PER_OCTAVE = 16
#: Each count of the ladder also runs at the next odd multiple of each of
#: these above it: cuBLAS picks kernels for counts with these factors alone
#: (module docstring).
ALIGNMENTS = (8, 16, 32)


def token_counts(low: int, high: int, per_octave: int = 8) -> list[int]:
    """The ladder: ``low`` (the first eager count), every
    ``ceil(2 ** (k / per_octave))`` in ``[low, high]``, and ``high`` itself
    (``max_num_batched_tokens``), ascending; empty when ``low > high``."""
    low = max(1, low)
    if low > high:
        return []
    out = {low, high}
    k = max(0, math.floor(per_octave * math.log2(low)) - 1)
    while True:
        m = math.ceil(2 ** (k / per_octave))
        if m > high:
            break
        if m >= low:
            out.add(m)
        k += 1
    return sorted(out)


def next_odd_multiple(m: int, a: int) -> int:
    """The smallest count ``>= m`` that is an odd multiple of ``a``
    (divisible by ``a``, not by ``2 * a``)."""
    k = -(-m // a)
    return (k + (k % 2 == 0)) * a


def gemm_token_counts(low: int, high: int) -> list[int]:
    """The GEMM ladder: :func:`token_counts` at :data:`PER_OCTAVE` counts an
    octave, and for each count the next odd multiple of each of
    :data:`ALIGNMENTS` at or above it, within ``[low, high]``; ascending."""
    base = token_counts(low, high, PER_OCTAVE)
    out = set(base)
    for m in base:
        out.update(a for a in (next_odd_multiple(m, k) for k in ALIGNMENTS) if a <= high)
    return sorted(out)


@dataclass
class GemmReport:
    """What :func:`warm_gemm_sizes` ran."""

    #: Distinct (out, in, dtype, bias) shapes run.
    shapes: int = 0
    #: The token counts each shape ran at.
    counts: list[int] = field(default_factory=list)
    #: Distinct logits GEMMs (LM heads) run, and the row counts they ran at.
    heads: int = 0
    head_counts: list[int] = field(default_factory=list)
    #: The ``(GEMM number, count)`` calls that took :data:`FIRST_LAUNCH_MS`
    #: or more on the host: they loaded a kernel (GEMM numbers:
    #: :meth:`GemmLadder.rungs`).
    loads: list[tuple[int, int]] = field(default_factory=list)
    #: The calls run, of the ladder's.
    calls_run: int = 0
    calls_total: int = 0
    wall_ms: float = 0.0
    #: Why nothing ran ("" when it ran).
    skipped: str = ""
    memory: MemoryReport | None = None


def gemm_text(g: GemmReport) -> str:
    """What :func:`warm_gemm_sizes` ran, for the log: ``"7 shapes x 20
    counts (513-16384 tokens); 1 LM head x 81 counts (1-1024 rows)"``."""
    said = []
    if g.counts:
        said.append(f"{g.shapes} shapes x {len(g.counts)} counts "
                    f"({g.counts[0]}-{g.counts[-1]} tokens)")
    if g.head_counts:
        said.append(f"{g.heads} LM head{'s' if g.heads != 1 else ''} x {len(g.head_counts)} "
                    f"counts ({g.head_counts[0]}-{g.head_counts[-1]} rows)")
    text = "; ".join(said) or "nothing"
    if g.calls_run < g.calls_total:
        text += f"; ran {g.calls_run} of its {g.calls_total} calls"
    return text


def _eager_floor(vllm_config: Any) -> int:
    """The smallest token count a prefill step runs eagerly: one above the
    largest CUDA-graph size; 1 when the engine captures no graph for mixed
    batches (``enforce_eager``, ``cudagraph_mode`` ``NONE`` or
    ``FULL_DECODE_ONLY``: ``CUDAGraphMode.mixed_mode()`` is ``NONE``)."""
    model_config = getattr(vllm_config, "model_config", None)
    if getattr(model_config, "enforce_eager", False):
        return 1
    cc = getattr(vllm_config, "compilation_config", None)
    mode = getattr(cc, "cudagraph_mode", None)
    mixed = getattr(mode, "mixed_mode", None)
    if mixed is not None:
        mode = mixed()
    if mode is not None and str(getattr(mode, "name", mode)) == "NONE":
        return 1
    sizes = list(getattr(cc, "cudagraph_capture_sizes", None) or ())
    top = getattr(cc, "max_cudagraph_capture_size", None) or (max(sizes) if sizes else 0)
    return int(top) + 1


def _unquantized(model: Any, method: str, device_type: str) -> Iterator[Any]:
    """The modules whose ``quant_method`` is of class ``method``, with a 2-D
    weight on a ``device_type`` device."""
    for module in model.modules():
        quant = getattr(module, "quant_method", None)
        weight = getattr(module, "weight", None)
        if quant is None or type(quant).__name__ != method:
            continue
        if weight is not None and getattr(weight, "dim", lambda: 0)() == 2 and \
                weight.device.type == device_type:
            yield module


def _is_vocab_table(module: Any) -> bool:
    """Whether ``module`` is a vocabulary table (vLLM's
    ``VocabParallelEmbedding``: input embeddings and ``ParallelLMHead``)."""
    return any(c.__name__ == "VocabParallelEmbedding" for c in type(module).__mro__)


def linear_layers(model: Any, device_type: str = "cuda") -> list[Any]:
    """One linear layer per distinct GEMM: unquantized (``quant_method`` an
    ``UnquantizedLinearMethod``), a 2-D weight on a ``device_type`` device,
    keyed by the weight's shape and dtype and whether it has a bias."""
    seen: dict[tuple[Any, ...], Any] = {}
    for module in _unquantized(model, "UnquantizedLinearMethod", device_type):
        if _is_vocab_table(module):
            continue  # an LM head left unquantized: logits_heads' ladder
        key = (tuple(module.weight.shape), module.weight.dtype,
               getattr(module, "bias", None) is not None)
        seen.setdefault(key, module)
    return list(seen.values())


def logits_heads(model: Any, device_type: str = "cuda") -> list[Any]:
    """One module per distinct logits GEMM: an unquantized vocabulary table
    (``quant_method`` an ``UnquantizedEmbeddingMethod``: vLLM's LM heads and
    the input embeddings a tied head is), a 2-D weight on a ``device_type``
    device, keyed by the weight's shape and dtype (an untied head and its
    input embedding have the same: one GEMM). A quant config that leaves the
    head out (ModelOpt's exclusions) gives the ``ParallelLMHead`` an
    ``UnquantizedLinearMethod``: a head all the same, not a linear layer."""
    seen: dict[tuple[Any, ...], Any] = {}
    tables = [m for m in _unquantized(model, "UnquantizedLinearMethod", device_type)
              if _is_vocab_table(m)]
    for module in [*_unquantized(model, "UnquantizedEmbeddingMethod", device_type), *tables]:
        seen.setdefault((tuple(module.weight.shape), module.weight.dtype), module)
    return list(seen.values())


def runner_logits_heads(worker: WorkerView, model: Any, device_type: str = "cuda") -> list[Any]:
    """:func:`logits_heads` of the worker's ``model`` where it computes logits:
    on the last pipeline-parallel rank only (a first rank's input embedding is
    the same kind of table and never multiplies)."""
    return logits_heads(model, device_type) if worker.is_last_pp_rank else []


def logits_rows(vllm_config: Any) -> int:
    """The most rows a step's logits GEMM has: ``max_num_seqs`` times one
    plus ``num_speculative_tokens`` (the drafts verified in the step), and
    no more than ``max_num_batched_tokens`` (a row per scheduled token at most)."""
    sched = vllm_config.scheduler_config
    spec = getattr(vllm_config, "speculative_config", None)
    drafts = int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0
    return min(int(sched.max_num_seqs) * (1 + drafts), int(sched.max_num_batched_tokens))


#: Up to this many rows the LM head's ladder runs every count (above it,
#: :func:`gemm_token_counts`).
HEAD_EVERY_ROWS = 256


def head_row_counts(rows: int) -> list[int]:
    """The LM head's ladder: every row count from 1 to ``rows`` up to
    :data:`HEAD_EVERY_ROWS`, then :func:`gemm_token_counts`. At a few rows cuBLAS picks
    a kernel whose tile follows the row count (``nvjet_..._64x40_...`` at 40
    rows): run s16 found the tiny Llama's first 40-request step loading
    ``..._64x40_...`` and ``..._64x24_...`` after a ladder of 39 and 42."""
    every = list(range(1, min(rows, HEAD_EVERY_ROWS) + 1))
    return every + [m for m in gemm_token_counts(HEAD_EVERY_ROWS, rows) if m > HEAD_EVERY_ROWS]


#: A GEMM call that takes this long on the host loaded a kernel (a launch
#: takes microseconds; CUDA's lazy module load and cuBLAS's set-up of a
#: kernel first launched in the process take 5-15 ms on the H200).
FIRST_LAUNCH_MS = 0.5
#: The ladder waits for the device (untimed) every this many calls, so that
#: no launch waits for room in the launch queue (1,024 entries) and reads as
#: a load.
SYNC_EVERY = 64


def _run_ladder(layer: Any, counts: list[int], bias: Any,
                only: frozenset[int] | None = None) -> list[int]:
    """``layer``'s GEMM at every count (those in ``only`` where given), the
    largest first: each output after the first fits in the block the caching
    allocator kept from it (in ascending order every output would be a new,
    larger block). Returns the counts whose call took
    :data:`FIRST_LAUNCH_MS` or more on the host: those that loaded a kernel."""
    import torch

    run = [m for m in counts if only is None or m in only]
    if not run:
        return []
    w = layer.weight
    x = torch.zeros(run[-1], w.shape[1], dtype=w.dtype, device=w.device)
    slow = []
    for i, m in enumerate(reversed(run)):
        if i % SYNC_EVERY == 0 and x.is_cuda:
            # untimed: launches queued behind a long queue would block and
            # read as loads
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        layer.quant_method.apply(layer, x[:m], bias)
        if (time.perf_counter() - t0) * 1e3 >= FIRST_LAUNCH_MS:
            slow.append(m)
    del x
    return sorted(slow)


@dataclass
class GemmLadder:
    """The GEMMs :func:`warm_gemm_sizes` runs: each distinct linear layer at
    the eager token counts, each LM head at its row counts."""

    layers: list[Any] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    heads: list[Any] = field(default_factory=list)
    head_counts: list[int] = field(default_factory=list)
    #: Why nothing runs ("" when something does).
    skipped: str = ""

    def rungs(self) -> list[tuple[Any, list[int]]]:
        """Each GEMM with its counts; a GEMM's number in :attr:`GemmReport.loads`
        is its place here."""
        return [*((m, self.counts) for m in self.layers if self.counts),
                *((h, self.head_counts) for h in self.heads)]

    def signature(self) -> str:
        """What decides the kernels the ladder loads, as text: the device,
        torch's and CUDA's versions, and each GEMM's weight shape, dtype,
        bias and counts."""
        import torch

        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        parts = [device, torch.__version__, str(torch.version.cuda)]
        for module, counts in self.rungs():
            w = module.weight
            parts.append(f"{tuple(w.shape)} {w.dtype} bias={getattr(module, 'bias', None) is not None} "
                         f"{counts}")
        return "\n".join(parts)


def gemm_ladder(worker: WorkerView) -> GemmLadder:
    """The ladder for ``worker``'s model and settings (module docstring)."""
    import torch

    if not torch.cuda.is_available():
        return GemmLadder(skipped="no CUDA device")
    model = worker.model
    layers = linear_layers(model) if model is not None else []
    heads = runner_logits_heads(worker, model) if model is not None else []
    if not layers and not heads:
        return GemmLadder(skipped="no unquantized linear layer or LM head on a CUDA device")
    config = worker.vllm_config
    high = int(config.scheduler_config.max_num_batched_tokens)
    counts = gemm_token_counts(_eager_floor(config), high) if layers else []
    head_counts = head_row_counts(logits_rows(config)) if heads else []
    if not counts and not head_counts:
        return GemmLadder(skipped="every token count replays a CUDA graph, and no LM head")
    return GemmLadder(layers=layers if counts else [], counts=counts,
                      heads=heads, head_counts=head_counts)


def run_gemm_ladder(ladder: GemmLadder,
                    only: frozenset[tuple[int, int]] | None = None) -> GemmReport:
    """Run ``ladder``: every call, or only the ``(GEMM number, count)`` pairs
    in ``only`` (those that loaded a kernel at the last start, from the idle
    record: a restart in a new process loads the same kernels with them)."""
    import torch

    report = GemmReport(skipped=ladder.skipped)
    if ladder.skipped:
        return report
    rungs = ladder.rungs()
    report.calls_total = sum(len(c) for _, c in rungs)
    t0 = time.perf_counter()
    with torch.inference_mode(), measured() as report.memory:
        for i, (module, counts) in enumerate(rungs):
            mine = None if only is None else frozenset(m for g, m in only if g == i)
            if mine is not None:
                report.calls_run += sum(1 for m in counts if m in mine)
            report.loads += [(i, m) for m in
                             _run_ladder(module, counts, getattr(module, "bias", None), mine)]
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    if only is None:
        report.calls_run = report.calls_total
    report.shapes, report.counts = len(ladder.layers), ladder.counts
    report.heads, report.head_counts = len(ladder.heads), ladder.head_counts
    report.wall_ms = (time.perf_counter() - t0) * 1e3
    return report


def warm_gemm_sizes(worker: WorkerView) -> GemmReport:
    """Run the model's GEMMs at every count of the ladder (module docstring)."""
    return run_gemm_ladder(gemm_ladder(worker))
