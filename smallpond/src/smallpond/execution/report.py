"""Job report: per-stage summary and a per-task timeline (one lane per worker), as a
self-contained HTML page (inline SVG) or a PNG (matplotlib)."""
from __future__ import annotations

import html
import os
from dataclasses import dataclass, field
from typing import List

from .task import TaskResult

COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"]


@dataclass
class StageStats:
    name: str
    start: float
    end: float
    results: List[TaskResult] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(r.num_rows for r in self.results)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.results)

    @property
    def cached(self) -> int:
        return sum(r.cached for r in self.results)


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def write_report(path: str, job_id: str, stages: List[StageStats]) -> str:
    """Write the report to ``path`` (.html or .png) and return the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    if path.endswith(".png"):
        _write_png(path, job_id, stages)
    else:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(render_html(job_id, stages))
        os.replace(tmp, path)
    return path


def _timeline(stages: List[StageStats]):
    tasks = [(si, r) for si, s in enumerate(stages) for r in s.results if not r.cached]
    t0 = min((r.start for _, r in tasks), default=0.0)
    lanes = sorted({r.worker for _, r in tasks})
    return tasks, t0, {w: i for i, w in enumerate(lanes)}


def render_html(job_id: str, stages: List[StageStats]) -> str:
    tasks, t0, lanes = _timeline(stages)
    t1 = max((r.end for _, r in tasks), default=t0 + 1)
    span = max(t1 - t0, 1e-6)
    W, lane_h, left = 1000, 18, 150
    H = lane_h * max(1, len(lanes)) + 30
    rects = []
    for si, r in tasks:
        x = left + (r.start - t0) / span * (W - left - 10)
        w = max(1.0, (r.end - r.start) / span * (W - left - 10))
        y = 5 + lanes[r.worker] * lane_h
        tip = (f"{r.node} partition {r.partition}: {r.end - r.start:.3f}s, {r.num_rows:,} rows, "
               f"{_fmt_bytes(r.bytes)}, attempts {r.attempts}")
        rects.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{lane_h - 4}" '
                     f'fill="{COLORS[si % len(COLORS)]}"><title>{html.escape(tip)}</title></rect>')
    labels = [f'<text x="4" y="{5 + i * lane_h + 11}" font-size="10">{html.escape(w)}</text>' for w, i in lanes.items()]
    axis = f'<text x="{left}" y="{H - 5}" font-size="10">0 s</text><text x="{W - 60}" y="{H - 5}" font-size="10">{span:.2f} s</text>'
    rows = []
    for si, s in enumerate(stages):
        durs = [r.end - r.start for r in s.results if not r.cached]
        rows.append(f"<tr><td><span style='color:{COLORS[si % len(COLORS)]}'>&#9632;</span> {html.escape(s.name)}</td>"
                    f"<td>{len(s.results)}</td><td>{s.cached}</td><td>{s.rows:,}</td><td>{_fmt_bytes(s.bytes)}</td>"
                    f"<td>{s.end - s.start:.3f}</td><td>{max(durs, default=0):.3f}</td></tr>")
    task_rows = [f"<tr><td>{html.escape(r.node)}</td><td>{r.partition}</td><td>{html.escape(r.worker)}</td>"
                 f"<td>{r.end - r.start:.3f}</td><td>{r.num_rows:,}</td><td>{_fmt_bytes(r.bytes)}</td>"
                 f"<td>{r.attempts}</td><td>{'yes' if r.cached else ''}</td></tr>" for s in stages for r in s.results]
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>smallpond job {html.escape(job_id)}</title>
<style>body{{font-family:sans-serif;margin:20px}}table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}td:first-child{{text-align:left}}</style></head><body>
<h2>smallpond job {html.escape(job_id)}</h2>
<h3>Stages</h3><table><tr><th>stage</th><th>tasks</th><th>cached</th><th>rows</th><th>output</th><th>wall s</th><th>slowest task s</th></tr>
{''.join(rows)}</table>
<h3>Timeline (one lane per worker; hover a task for details)</h3>
<svg width="{W}" height="{H}" xmlns="http://www.w3.org/2000/svg">{''.join(labels)}{''.join(rects)}{axis}</svg>
<h3>Tasks</h3><table><tr><th>node</th><th>partition</th><th>worker</th><th>seconds</th><th>rows</th><th>output</th><th>attempts</th><th>cached</th></tr>
{''.join(task_rows)}</table></body></html>"""


def _write_png(path: str, job_id: str, stages: List[StageStats]) -> None:
    try:
        import matplotlib
    except ImportError:
        raise ImportError("a PNG report needs matplotlib (pip install matplotlib); HTML reports need nothing") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks, t0, lanes = _timeline(stages)
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.35 * max(2, len(lanes))))
    for si, r in tasks:
        ax.barh(lanes[r.worker], r.end - r.start, left=r.start - t0, color=COLORS[si % len(COLORS)], edgecolor="white")
    ax.set_yticks(range(len(lanes)), list(lanes))
    ax.set_xlabel("seconds")
    from matplotlib.patches import Patch
    handles = [Patch(color=COLORS[si % len(COLORS)], label=f"{s.name}: {len(s.results)} tasks, {s.rows:,} rows")
               for si, s in enumerate(stages) if s.results]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"smallpond job {job_id}: task timeline (one lane per worker)", fontsize=9)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
