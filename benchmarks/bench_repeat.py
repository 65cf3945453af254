"""Do two runs of the same ``stepwarm bench --against-...`` command agree?

Reads two ``--json`` reports (plain or ``.gz``) and prints, per step, each
run's ratio ``B / A`` with its interval, how far run 2's ratio lies from run
1's, and whether that is within ``--tolerance`` (default 5 %, issue 45's
bar). Steps at the timer's resolution (``idle``) are not compared.

    python benchmarks/bench_repeat.py RUN1.json RUN2.json [--tolerance 5]

Exit status: 0 every compared step within the tolerance; 1 some step is not;
2 the two reports do not hold the same steps (not the same command).
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any


def load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        report: dict[str, Any] = json.load(f)
    if "ratios" not in report:
        raise SystemExit(f"{path}: no 'ratios': not a bench --json report of an A/B run")
    return report


def rows(a: dict[str, Any], b: dict[str, Any], tolerance: float) -> tuple[list[list[str]], int]:
    """The table's rows and how many compared steps lie outside ``tolerance``."""
    out, misses = [], 0
    for r1, r2 in zip(a["ratios"], b["ratios"]):
        label = r1["label"]
        if r1.get("idle") or r2.get("idle"):
            out.append([label, "idle", "idle", "-", "not compared"])
            continue
        change = r2["ratio"] / r1["ratio"] - 1
        ok = abs(change) <= tolerance
        misses += not ok
        out.append([label, f"{r1['ratio']:.3f} [{r1['low']:.3f}, {r1['high']:.3f}]",
                    f"{r2['ratio']:.3f} [{r2['low']:.3f}, {r2['high']:.3f}]",
                    f"{change:+.1%}", "within" if ok else "OUTSIDE"])
    return out, misses


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run1", type=Path)
    p.add_argument("run2", type=Path)
    p.add_argument("--tolerance", type=float, default=5.0, metavar="PCT")
    args = p.parse_args(argv)
    a, b = load(args.run1), load(args.run2)
    labels1 = [r["label"] for r in a["ratios"]]
    labels2 = [r["label"] for r in b["ratios"]]
    if labels1 != labels2:
        print(f"the runs hold different steps:\n  {args.run1}: {labels1}\n  {args.run2}: {labels2}",
              file=sys.stderr)
        return 2
    table, misses = rows(a, b, args.tolerance / 100)
    head = ["step", "run 1: B / A [95 %]", "run 2: B / A [95 %]", "run 2 / run 1", f"±{args.tolerance:g} %"]
    widths = [max(len(r[i]) for r in [head, *table]) for i in range(len(head))]
    for r in [head, *table]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    compared = sum(r[4] != "not compared" for r in table)
    print(f"{compared - misses} of {compared} compared steps within ±{args.tolerance:g} %")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
