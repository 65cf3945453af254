"""``stepwarm bench --plot FILE``: a benchmark's steps as a picture (PNG or SVG).

Two panels, a line per configuration (A, and B when comparing):

- **per step:** each step's median time (ms, log scale) with its p10-p90 band,
  the steps in plan order;
- **sweeps:** where the plan holds a sweep of batch sizes (a run of two or
  more consecutive decode steps whose request count grows, as a step with
  ``batch = { values = [...] }`` or ``{ buckets = ... }`` plans), the median
  time against the batch size, one line per sweep and configuration, named by
  the context its first step attends over (``ctx 65``): a batch x context
  grid is a scenario with one such sweep per prompt length.

matplotlib (the ``plot`` extra) draws it, without a display (its Agg backend).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from stepwarm.bench import BenchReport, StepSamples, percentile

#: What ``--plot`` writes, by the file's suffix.
FORMATS = (".png", ".svg")
#: Step kinds a batch sweep is read from.
SWEEP_KINDS = ("decode", "spec_decode")


def missing() -> str | None:
    """Why ``--plot`` cannot run here (matplotlib absent), or None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "--plot needs matplotlib: pip install 'stepwarm[plot]'"
    return None


def path_error(path: Path) -> str | None:
    """A ``--plot`` path this module cannot write: another suffix."""
    from stepwarm.output_path import names_a_file, shown

    if names_a_file(path) and path.suffix.lower() not in FORMATS:
        return f"--plot {shown(path)}: the file's suffix must be .png or .svg"
    return None


def sweeps(steps: Sequence[StepSamples]) -> list[list[StepSamples]]:
    """The batch sweeps among ``steps``: maximal runs of consecutive steps of a
    :data:`SWEEP_KINDS` kind, one kind a run, whose request count grows step
    to step, two steps or more."""
    out: list[list[StepSamples]] = []
    run: list[StepSamples] = []
    for s in steps:
        if run and s.kind == run[-1].kind and s.num_reqs > run[-1].num_reqs:
            run.append(s)
            continue
        if len(run) >= 2:
            out.append(run)
        run = [s] if s.kind in SWEEP_KINDS else []
    if len(run) >= 2:
        out.append(run)
    return out


def plot(reports: dict[str, BenchReport], path: Path) -> int:
    """Draw ``reports`` (configuration name -> report) into ``path`` (.png or
    .svg); returns the number of panels drawn (1, or 2 with sweeps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = next(iter(reports.values()))
    found = sweeps(first.steps)
    fig, axes = plt.subplots(1, 2 if found else 1, figsize=(12 if found else 7, 4.5),
                             squeeze=False)
    ax = axes[0][0]
    for name, rep in reports.items():
        xs = [s.index for s in rep.steps]
        ax.plot(xs, [percentile(s.times(), 50) for s in rep.steps], marker="o", ms=3,
                label=f"{name} p50")
        ax.fill_between(xs, [percentile(s.times(), 10) for s in rep.steps],
                        [percentile(s.times(), 90) for s in rep.steps], alpha=0.25)
    device = "device" if first.steps and first.steps[0].device_ms else "host"
    ax.set(xlabel="step", ylabel=f"{device} time (ms)", yscale="log",
           title=f"{first.scenario}: each step, p10-p90")
    ax.legend(fontsize="small")
    if found:
        ax = axes[0][1]
        # a colour per sweep (context), a line style per configuration
        for style, (name, rep) in zip(("-", "--", ":", "-."), reports.items()):
            by_index = {s.index: s for s in rep.steps}
            for colour, run in enumerate(found):
                got = [by_index[s.index] for s in run]
                ax.plot([s.num_reqs for s in got], [percentile(s.times(), 50) for s in got],
                        style, marker="o", ms=3, color=f"C{colour % 10}",
                        label=f"{name} ctx {run[0].context_tokens}")
        batches = sorted({s.num_reqs for run in found for s in run})
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.minorticks_off()
        ax.set(xlabel="batch (requests)", ylabel=f"{device} time p50 (ms)", title="batch sweeps")
        ax.legend(fontsize="small")
    fig.suptitle(_setup_line(first.setup), fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return len(axes[0])


def _setup_line(setup: dict) -> str:
    """``tiny-llama · cpu · vLLM 0.32.0 · torch 2.13.0+cpu`` (the model's
    folder name, not its path); what the setup lacks is left out."""
    named = {"model": Path(str(setup.get("model", ""))).name, "device": setup.get("device"),
             "vllm": f"vLLM {setup['vllm']}" if setup.get("vllm") else "",
             "torch": f"torch {setup['torch']}" if setup.get("torch") else ""}
    return " · ".join(str(v) for v in named.values() if v)
