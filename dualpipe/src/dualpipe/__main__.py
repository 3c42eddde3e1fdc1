"""``python -m dualpipe``: simulate and compare schedules; ``python -m dualpipe run``: a 4-process check.

    python -m dualpipe [--ranks 8 --chunks 20 --F 1 --B 2 --W 1 --FB 2.5 --p2p 0] [--plot FILE.png]
    python -m dualpipe run [--procs 4 --chunks 8]
    python -m dualpipe --version

Costs are for one rank's share of the model (layers / ranks); schedules with smaller stages
(ZBV, DualPipeV: half; interleaved: 1/v) get proportionally smaller per-op costs. The last line
is ``summary: backend=CPU result=...`` (exit code 0 on success).
"""
from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional

from ._version import __version__
from .schedule import FB, SCHEDULES, B, F, SimResult, W, compare

GLYPH = {F: "F", B: "B", W: "W", FB: "X"}


def text_gantt(res: SimResult, width: int = 96) -> List[str]:
    """One line per rank: F forward, B backward (input grad when zero-bubble), W weight grad,
    X overlapped forward+backward, '.' idle; lower case = phase 1 (second local stage)."""
    tl = res.timeline
    scale = width / res.makespan
    lines = []
    for r in range(res.num_ranks):
        row = ["."] * width
        sel = tl["rank"] == r
        for k, p, s, e in zip(tl["kind"][sel], tl["phase"][sel], tl["start"][sel], tl["end"][sel]):
            g = GLYPH[int(k)]
            g = g.lower() if p == 1 and k != W else g
            a, b = int(round(s * scale)), max(int(round(e * scale)), int(round(s * scale)) + 1)
            for i in range(a, min(b, width)):
                row[i] = g
        lines.append(f"  rank {r:>3} |{''.join(row)}|")
    return lines


def published_bubble(kind: str, P: int, f: float, b: float, w: float, fb: float, v: int) -> Optional[float]:
    """The published per-rank bubble formula in this run's per-stage costs (None: no formula)."""
    if kind == "1F1B":
        return (P - 1) * (f + b)
    if kind == "ZB1P":
        return (P - 1) * (f + b - 2 * w)
    if kind == "interleaved":
        return (P - 1) * (f + b)
    if kind == "DualPipe":
        return (P / 2 - 1) * (fb + b - 3 * w)
    if kind == "DualPipeV":
        return (P - 1) * (fb + b - 3 * w)  # PP = 2P stages
    return None


def plot_gantt(results: Dict[str, SimResult], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    colors = {(F, 0): "#4c72b0", (F, 1): "#8fb0e0", (B, 0): "#55a868", (B, 1): "#a5d6a7",
              (W, 0): "#c44e52", (FB, 0): "#8172b2", (FB, 1): "#b9a9e8"}
    fig, axes = plt.subplots(len(results), 1, figsize=(14, 1.0 + 0.32 * sum(r.num_ranks for r in results.values())),
                             squeeze=False)
    span = max(r.makespan for r in results.values())
    for ax, (kind, res) in zip(axes[:, 0], results.items()):
        tl = res.timeline
        for k, p, rk, s, e, c in zip(tl["kind"], tl["phase"], tl["rank"], tl["start"], tl["end"], tl["chunk"]):
            key = (int(k), 0 if k == W else int(p))
            ax.barh(int(rk), e - s, left=s, height=0.8, color=colors.get(key, "gray"), edgecolor="white", linewidth=0.4)
        ax.set_xlim(0, span)
        ax.set_ylim(res.num_ranks - 0.5, -0.5)
        ax.set_yticks(range(res.num_ranks))
        ax.set_ylabel("rank")
        ax.set_title(f"{kind}: bubble {100 * res.bubble_ratio:.1f}%, peak activations "
                     f"{res.peak_activation_memory.max():.1f}", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("time")
    legend = [Patch(color=colors[(F, 0)], label="F (stage 0)"), Patch(color=colors[(F, 1)], label="F (stage 1)"),
              Patch(color=colors[(B, 0)], label="B (stage 0)"), Patch(color=colors[(B, 1)], label="B (stage 1)"),
              Patch(color=colors[(W, 0)], label="W"), Patch(color=colors[(FB, 0)], label="F&B")]
    fig.legend(handles=legend, loc="upper right", ncol=6, fontsize=8)
    fig.suptitle(title, x=0.01, ha="left", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cmd_simulate(a) -> int:
    kinds = a.kinds.split(",") if a.kinds else list(SCHEDULES)
    fb = a.FB if a.FB is not None else a.F + a.B
    results, skipped = {}, []
    for kind in kinds:  # schedules whose constraints this PP/chunks violates are listed, not fatal
        try:
            results.update(compare(a.ranks, a.chunks, a.F, a.B, a.W, fb, a.p2p, kinds=[kind],
                                   virtual_stages=a.virtual_stages, timeline=True))
        except ValueError as e:
            if a.kinds:
                raise
            skipped.append(str(e))
    if not results:
        raise SystemExit("no schedule accepts these arguments:\n" + "\n".join(skipped))
    print(f"dualpipe {__version__}: PP={a.ranks} ranks, {a.chunks} micro-batches, per-rank-share costs "
          f"F={a.F} B={a.B} W={a.W} F&B={fb} p2p={a.p2p}")
    hdr = f"{'schedule':<12}{'step time':>10}{'bubble %':>10}{'max bubble':>12}{'published':>11}" \
          f"{'peak act.':>11}{'act. memory':>13}{'params':>8}"
    print(hdr)
    print("-" * len(hdr))
    for kind, res in results.items():
        frac = res.stage_fraction
        pub = published_bubble(kind, a.ranks, a.F * frac, a.B * frac, a.W * frac, fb * frac, a.virtual_stages)
        params = "2x" if kind == "DualPipe" else "1x"
        print(f"{kind:<12}{res.makespan:>10.2f}{100 * res.bubble_ratio:>10.1f}{res.bubble.max():>12.2f}"
              f"{'-' if pub is None else f'{pub:.2f}':>11}{res.peak_activations.max():>11.0f}"
              f"{res.peak_activation_memory.max():>13.2f}{params:>8}")
    for msg in skipped:
        print(f"skipped {msg}")
    print("(bubble % = idle share of all rank-time; max bubble = worst rank's idle time; published = the\n"
          " paper formula in these costs; peak act. = live stage-micro-batches on the worst rank; act. memory =\n"
          " the same in units of one micro-batch over a rank's share of the layers)")
    if not a.quiet and a.ranks <= 16:
        for kind, res in results.items():
            print(f"\n{kind}  (F/B/W/X = forward/backward/weight/overlapped F&B; lower case = second stage)")
            for line in text_gantt(res):
                print(line)
    if a.plot:
        plot_gantt(results, a.plot, f"PP={a.ranks}, {a.chunks} micro-batches, F={a.F} B={a.B} W={a.W} F&B={fb}")
        print(f"wrote {a.plot}")
    best = min(results, key=lambda k: results[k].bubble_ratio)
    base = results.get("1F1B")
    phrase = f"best bubble {best} {100 * results[best].bubble_ratio:.1f}%"
    if base is not None:
        phrase += f" vs 1F1B {100 * base.bubble_ratio:.1f}% (PP={a.ranks}, {a.chunks} chunks)"
    print(f"summary: backend=CPU result={phrase}")
    return 0


def cmd_run(a) -> int:
    from ._testing import launch
    cases = []
    for kind in ("DualPipe", "DualPipeV"):
        for overlap in (False, True):
            cases.append(dict(kind=kind, num_chunks=a.chunks, overlap=overlap, return_outputs=True, trace=True))
    print(f"launching {a.procs} gloo processes on 127.0.0.1: DualPipe and DualPipeV, {a.chunks} micro-batches, float64")
    outs = launch(a.procs, cases, timeout_s=a.timeout)
    worst = {"loss": 0.0, "outputs": 0.0, "grads": 0.0}
    ok = True
    for o in outs:
        if o["error"]:
            print(f"rank {o['rank']} failed:\n{o['error']}")
            ok = False
            continue
        for case, res in zip(cases, o["results"]):
            for k in worst:
                worst[k] = max(worst[k], res[k])
            ok &= res.get("trace_ok") == 1.0
    ok &= all(v <= 1e-12 for v in worst.values())
    print(f"max relative error vs the non-pipelined reference: loss {worst['loss']:.1e}, "
          f"outputs {worst['outputs']:.1e}, grads {worst['grads']:.1e}; executed ops == planned ops: {ok}")
    print(f"summary: backend=CPU result={'pass' if ok else 'FAIL'}: {a.procs}-process training step matches "
          f"the reference (max grad rel err {worst['grads']:.1e})")
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dualpipe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="store_true", help="print the version and exit")
    sub = ap.add_subparsers(dest="cmd")
    for p in (ap, sub.add_parser("simulate", help="simulate and compare schedules (default)")):
        p.add_argument("--ranks", type=int, default=8, help="pipeline ranks PP")
        p.add_argument("--chunks", type=int, default=20, help="micro-batches per step")
        p.add_argument("--F", type=float, default=1.0, help="forward cost of one micro-batch (rank share)")
        p.add_argument("--B", type=float, default=2.0, help="full backward cost (input + weight grad)")
        p.add_argument("--W", type=float, default=1.0, help="weight-grad part of B")
        p.add_argument("--FB", type=float, default=None, help="overlapped forward+backward (default F+B)")
        p.add_argument("--p2p", type=float, default=0.0, help="p2p latency per transfer")
        p.add_argument("--virtual-stages", type=int, default=2, help="stages per rank for interleaved 1F1B")
        p.add_argument("--kinds", default="", help=f"comma-separated subset of {','.join(SCHEDULES)}")
        p.add_argument("--plot", default="", help="write a per-rank Gantt chart PNG here")
        p.add_argument("--quiet", action="store_true", help="no text Gantt charts")
    r = sub.add_parser("run", help="4-process CPU training step checked against the reference")
    r.add_argument("--procs", type=int, default=4)
    r.add_argument("--chunks", type=int, default=8)
    r.add_argument("--timeout", type=float, default=300.0)
    a = ap.parse_args(argv)
    if a.version:
        print(f"dualpipe {__version__}")
        return 0
    if a.cmd == "run":
        return cmd_run(a)
    return cmd_simulate(a)


if __name__ == "__main__":
    sys.exit(main())
