"""Markdown tables from ``stepwarm coverage --compare --json`` files.

    python benchmarks/coverage_table.py NAME=FILE.json [NAME=FILE.json ...]

Prints one row per engine: first-traffic compiles, the sum of first-call
excess ms and flagged requests, baseline vs stepwarm, and the seconds
stepwarm's scenarios added to start-up; where the file has them (``coverage
--compare`` since its restarts), the restart figures and the start-up
compiles moved / vllm / extra with scenario time / compile time moved; then,
per engine, the requests that compiled or were flagged (baseline, stepwarm
and its restart). A file without vLLM's own runs (``coverage_jobs.py``'s
``"baseline": false``) gets "-" on their side. ``FILE`` may be
gzipped (``.json.gz``). Verdicts are made again by the installed stepwarm's
rules (``CoverageReport.from_dict``), not read from the file.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from stepwarm.coverage.report import CoverageReport


def _flagged(rep: dict) -> dict[str, str]:
    return rep["summary"]["flagged"]


def main(pairs: list[str]) -> None:
    rows, details = [], []
    for pair in pairs:
        name, _, path = pair.partition("=")
        raw = Path(path).read_bytes()
        both = json.loads(gzip.decompress(raw) if path.endswith(".gz") else raw)
        for mode in ("baseline", "stepwarm", "baseline_restart", "stepwarm_restart"):
            if both.get(mode):
                both[mode] = CoverageReport.from_dict(both[mode]).to_dict()
        # a job without vLLM's own runs (coverage_jobs.py's "baseline": false) has no baseline
        b, s = both.get("baseline"), both["stepwarm"]
        br, sr, att = both.get("baseline_restart"), both.get("stepwarm_restart"), both.get("attribution")
        restart = (f"{br['startup_s']:.1f} / {sr['startup_s']:.1f} ({sr['stepwarm_s']:.2f})"
                   if br and sr else f"- / {sr['startup_s']:.1f} ({sr['stepwarm_s']:.2f})" if sr else "-")
        moved = ("{moved} / {vllm} / {extra}".format(**att["totals"])
                 + (f", R = {att['ratio']:.2f}" if att.get("ratio") is not None else "")
                 if att else "-")
        bs = b["summary"] if b else {"traffic_compiles": "-", "excess_ms": None, "flagged": {}}
        rows.append(
            f"| {name} | {bs['traffic_compiles']} | {s['summary']['traffic_compiles']} "
            f"| {'-' if bs['excess_ms'] is None else format(bs['excess_ms'], '.0f')} "
            f"| {s['summary']['excess_ms']:.0f} "
            f"| {len(bs['flagged']) if b else '-'} | {len(_flagged(s))} "
            f"| {s['stepwarm_s']:.2f} | {format(b['startup_s'], '.1f') if b else '-'} / {s['startup_s']:.1f} "
            f"| {restart} | {moved} |")
        for mode, rep in (("baseline", b), ("stepwarm", s), ("stepwarm restart", sr)):
            if not rep:
                continue
            for r in rep["requests"]:
                k = {**r["compiles_first"], **r["compiles_second"]}
                if k or _flagged(rep).get(r["name"]):
                    details.append(f"| {name} | {mode} | {r['name']} | {r['first_ms']:.0f} / "
                                   f"{r['second_ms']:.0f} | {r.get('first_worker_ms', 0):.0f} / "
                                   f"{r.get('second_worker_ms', 0):.0f} | {', '.join(k) or '-'} |")
    print("| engine | compiles, baseline | compiles, stepwarm | excess ms, baseline "
          "| excess ms, stepwarm | flagged, baseline | flagged, stepwarm "
          "| stepwarm's scenarios (s) | engine start-up s (baseline / stepwarm) "
          "| restart s, baseline / stepwarm (its scenarios) "
          "| start-up compiles moved / vllm / extra |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    print()
    print("| engine | run | request | first / second ms | of which in the worker | compiled |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(details))


if __name__ == "__main__":
    main(sys.argv[1:])
