"""An SVG timeline of compiles: vLLM's start-up phases, each stepwarm scenario's
steps, then each traffic request, in the order they ran, one column each;
a column's bar is the number of kernels compiled there (its tooltip names
them). Steps take milliseconds and start-up a minute, so columns are in
order rather than to scale; each says its seconds after the engine start.
"""

from __future__ import annotations

from html import escape
from typing import Any

from stepwarm.coverage.report import CoverageReport

COLORS = {"vllm": "#9e9e9e", "stepwarm": "#3f7fbf", "traffic": "#e08a2c", "bad": "#d0342c"}
WIDE, NARROW, HEIGHT, BAR_MAX, TOP, MIN_WIDTH = 70, 16, 360, 150, 40, 900


def _columns(rep: CoverageReport) -> list[dict[str, Any]]:
    """One dict per column: owner, group (scenario / phase), label, at_s, kernels."""
    by_where = {(c.owner, c.phase, c.step): c for c in rep.startup_compiles}
    cols = []
    for name, at in rep.phases or [["vLLM start-up", 0.0]]:
        c = by_where.get(("vllm", name, None))
        cols.append({"owner": "vllm", "group": "vLLM", "label": name, "at_s": at,
                     "kernels": c.kernels if c else {}, "width": WIDE})
    for run in rep.scenario_runs:
        for index, label, start_s, _ in run["steps"]:
            c = by_where.get(("stepwarm", run["plan"], index))
            cols.append({"owner": "stepwarm", "group": run["plan"], "label": f"{index} {label}",
                         "at_s": start_s, "kernels": c.kernels if c else {}, "width": NARROW})
        cleanup = by_where.get(("stepwarm", run["plan"], None))
        if cleanup:
            cols.append({"owner": "stepwarm", "group": run["plan"], "label": "cleanup",
                         "at_s": run["end_s"], "kernels": cleanup.kernels, "width": NARROW})
    for r in rep.requests:
        kernels = dict(r["compiles_first"])
        for k, n in r["compiles_second"].items():
            kernels[k] = kernels.get(k, 0) + n
        cols.append({"owner": "traffic", "group": "traffic", "label": r["name"],
                     "at_s": r.get("at_s"), "kernels": kernels, "width": NARROW,
                     "bad": bool(rep.flagged(r))})
    return cols


def timeline_svg(rep: CoverageReport) -> str:
    """The SVG document (a string) for ``rep``."""
    cols = _columns(rep)
    peak = max([sum(c["kernels"].values()) for c in cols] + [1])
    width = max(sum(c["width"] for c in cols) + 40, MIN_WIDTH)
    base_y = TOP + BAR_MAX
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{HEIGHT + 40}" '
             f'font-family="sans-serif" font-size="10">',
             f'<text x="10" y="16" font-size="13">{escape(rep.mode)}: kernels compiled per '
             f'start-up phase, scenario step and traffic request ({escape(rep.model)}, '
             f'{escape(rep.runner)} runner, vLLM {escape(rep.vllm_version)})</text>',
             f'<line x1="10" y1="{base_y}" x2="{width - 10}" y2="{base_y}" stroke="#444"/>']
    x, group, group_x = 20, None, 20
    for c in cols + [None]:
        g = None if c is None else (c["owner"], c["group"])
        if g != group and group is not None:  # close the previous group's band
            parts.append(f'<rect x="{group_x}" y="{base_y + 4}" width="{x - group_x - 2}" '
                         f'height="8" fill="{COLORS[group[0]]}"/>'
                         f'<text x="{group_x}" y="{base_y + 24}">{escape(group[1])}</text>')
            group_x = x
        if c is None:
            break
        group = g
        n = sum(c["kernels"].values())
        h = BAR_MAX * n / peak
        color = COLORS["bad"] if c.get("bad") or (c["owner"] == "traffic" and n) else COLORS[c["owner"]]
        at = "" if c["at_s"] is None else f" at {c['at_s']:.2f} s"
        title = escape(f"{c['group']}: {c['label']}{at}: {n} compile(s)"
                       + (": " + ", ".join(f"{k} x{v}" if v > 1 else k
                                           for k, v in c["kernels"].items()) if n else ""))
        parts.append(f'<g><title>{title}</title><rect x="{x}" y="{base_y - max(h, 1)}" '
                     f'width="{c["width"] - 3}" height="{max(h, 1)}" fill="{color}"/>'
                     + (f'<text x="{x}" y="{base_y - h - 3}">{n}</text>' if n else "")
                     + f'<text transform="translate({x + 8},{base_y + 32}) rotate(60)">'
                     f'{escape(c["label"][:28])}</text></g>')
        x += c["width"]
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
