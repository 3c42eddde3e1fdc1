"""(a) Simulated bubble ratio and peak activation memory: DualPipe / DualPipeV vs 1F1B, ZB1P,
interleaved 1F1B and ZBV, for PP in {4, 8, 16, 32} and chunks in {2PP, 4PP, 8PP}; plus the time to
plan + simulate 1,024 ranks x 8,192 micro-batches for every schedule.

    python dualpipe/benchmarks/bench_simulated.py [--F 1 --B 2 --W 1 --fb-ratio 1.0] [--json PATH]

Costs are per rank-share of the model; F&B = fb_ratio * (F + B) (1.0: no overlap credit).
Activation memory is in units of one micro-batch over a rank's share of the layers. DPV/1F1B and
DPV/ZB1P are bubble-ratio ratios; "DPV t/best" is DualPipeV's step time over the best of 1F1B,
ZB1P, interleaved and ZBV (bubble ratios alone mislead when F&B < F + B shrinks the busy time).
"""
import argparse
import json
import time

from dualpipe import compare, simulate

KINDS = ("1F1B", "ZB1P", "interleaved", "ZBV", "DualPipe", "DualPipeV")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--F", type=float, default=1.0)
    ap.add_argument("--B", type=float, default=2.0)
    ap.add_argument("--W", type=float, default=1.0)
    ap.add_argument("--fb-ratio", type=float, default=1.0)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    fb = a.fb_ratio * (a.F + a.B)
    rows = []
    print(f"simulated, per-rank-share costs F={a.F} B={a.B} W={a.W} F&B={fb:g}; cells: bubble % / peak activation memory")
    print(f"{'PP':>4}{'chunks':>8}" + "".join(f"{k:>15}" for k in KINDS) + f"{'DPV/1F1B':>10}{'DPV/ZB1P':>10}{'DPV t/best':>12}")
    for P in (4, 8, 16, 32):
        for m in (2 * P, 4 * P, 8 * P):
            res = compare(P, m, a.F, a.B, a.W, fb, kinds=KINDS)
            row = {"PP": P, "chunks": m}
            cells = ""
            for k in KINDS:
                r = res[k]
                row[k] = {"bubble_ratio": r.bubble_ratio, "peak_activation_memory": float(r.peak_activation_memory.max()),
                          "makespan": r.makespan}
                cells += f"{100 * r.bubble_ratio:>9.1f}/{r.peak_activation_memory.max():<5.1f}"
            dpv = res["DualPipeV"].bubble_ratio
            rat1 = dpv / res["1F1B"].bubble_ratio
            rat2 = dpv / res["ZB1P"].bubble_ratio
            best_other = min(res[k].makespan for k in KINDS if k not in ("DualPipe", "DualPipeV"))
            row["dualpipev_step_vs_best_other"] = res["DualPipeV"].makespan / best_other
            rows.append(row)
            print(f"{P:>4}{m:>8}{cells}{rat1:>10.2f}{rat2:>10.2f}{row['dualpipev_step_vs_best_other']:>12.3f}")
    print("\nplan + simulate 1,024 ranks x 8,192 micro-batches (best of 3; CPU seconds of this process)")
    print(f"{'schedule':<12}{'ops':>12}{'plan s':>9}{'sim s':>9}{'cpu s':>9}")
    scale = []
    for k in KINDS:
        best = None
        for _ in range(3):
            c0 = time.process_time()
            r = simulate(k, 1024, 8192, F=1.0, B=2.0, W=1.0, FB=2.5)
            cpu = time.process_time() - c0
            if best is None or cpu < best[0]:
                best = (cpu, r.plan_seconds, r.simulate_seconds, r.num_ops)
        scale.append({"kind": k, "cpu_s": best[0], "plan_s": best[1], "sim_s": best[2], "ops": best[3]})
        print(f"{k:<12}{best[3]:>12,}{best[1]:>9.3f}{best[2]:>9.3f}{best[0]:>9.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"costs": {"F": a.F, "B": a.B, "W": a.W, "FB": fb}, "grid": rows, "scale_1024x8192": scale}, f, indent=1)


if __name__ == "__main__":
    main()
