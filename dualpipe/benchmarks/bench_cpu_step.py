"""(b) Measured wall time of one training step on CPU (gloo, 4 and 8 processes) with a synthetic
stage whose F, B and W take controlled time (sleeps), for our DualPipe / DualPipeV and for
torch.distributed.pipelining's Schedule1F1B, ScheduleInterleaved1F1B, ScheduleZBVZeroBubble and
ScheduleDualPipeV on the same stages; plus our simulator's prediction of the step.

    python dualpipe/benchmarks/bench_cpu_step.py [--procs 4,8] [--chunks-per-rank 4]
        [--F 12 --B 24 --W 10 (ms per rank-share)] [--steps 3] [--json PATH]

The model is the same for every schedule: one rank's share costs F/B/W; V-shaped and interleaved
schedules cut it into two stages of half the cost. Measured bubble = 1 - busy / step time, with
busy = chunks * (F + B) per rank (the sleeps; overheads count as bubble).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from dualpipe import WeightGradStore


class _SleepIn(torch.autograd.Function):
    """Identity on the activation path; forward sleeps f, backward (input grad) sleeps b_in."""

    @staticmethod
    def forward(ctx, x, f, b_in):
        time.sleep(f)
        ctx.b_in = b_in
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        time.sleep(ctx.b_in)
        return g * 1.0, None, None


class _SleepW(torch.autograd.Function):
    """Identity on the weight path; its backward (the weight grad) sleeps w, deferred under WeightGradStore."""

    @staticmethod
    def forward(ctx, w, secs):
        ctx.secs = secs
        ctx.save_for_backward(w)
        return w * 1.0

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        if WeightGradStore.enabled:
            def weight_grad():
                time.sleep(ctx.secs)
                w.grad = g.clone() if w.grad is None else w.grad + g
            WeightGradStore.put(weight_grad)
            return None, None
        time.sleep(ctx.secs)
        return g * 1.0, None


class SleepStage(nn.Module):
    """y = x * w with F, B (= input part + W) and W costs given in seconds."""

    def __init__(self, hidden, f, b, w):
        super().__init__()
        self.w = nn.Parameter(torch.ones(hidden))
        self.f, self.b_in, self.w_secs = f, b - w, w

    def forward(self, x):
        if not x.requires_grad:  # first stage: still pay the input-grad cost, like every other stage
            x = x.detach().requires_grad_()
        return _SleepIn.apply(x, self.f, self.b_in) * _SleepW.apply(self.w, self.w_secs)


class OverlapSleepStage(SleepStage):
    """SleepStage with the overlapped_forward_backward hook: the forward of one micro-batch runs in a
    helper thread while this thread runs another's backward (sleeps release the GIL), the way a
    model would hide an all-to-all behind compute. torch.distributed.pipelining has no such hook
    on by default, so the rows that use it are labelled "+hook"."""

    @classmethod
    def overlapped_forward_backward(cls, module0, inputs0, criterion0, labels0, module1, loss1, outputs1,
                                    output_grads1):
        import threading
        from dualpipe import run_backward
        box = {}

        def forward():
            with torch.enable_grad():
                out = module0(*inputs0)
                box["out"] = [out]
                box["loss"] = criterion0(out, *labels0) if criterion0 is not None else None
        th = threading.Thread(target=forward)
        th.start()
        if loss1 is not None:
            loss1.backward()
            loss1.detach_()
        else:
            run_backward(outputs1, output_grads1)
        th.join()
        return box["out"], box["loss"]


def mse(out, target):
    return ((out - target) ** 2).mean()


def _time_steps(fn, steps):
    fn()  # warm-up (torch.distributed.pipelining infers shapes on its first step)
    ts = []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def worker(rank, P, port, args, out_path):
    import datetime
    from torch.distributed import pipelining as pp
    import dualpipe
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=P,
                            timeout=datetime.timedelta(seconds=300))
    F, B, W = args.F / 1e3, args.B / 1e3, args.W / 1e3
    m, hidden, mb = args.chunks_per_rank * P, 16, 2
    dev = torch.device("cpu")
    x = torch.randn(m * mb, hidden)
    y = torch.randn(m * mb, hidden)
    half = lambda: SleepStage(hidden, F / 2, B / 2, W / 2)
    full = lambda: SleepStage(hidden, F, B, W)
    res = {}

    def torch_sched(name):
        if name == "Schedule1F1B":
            st = pp.PipelineStage(full(), rank, P, dev)
            sched = pp.Schedule1F1B(st, m, loss_fn=mse)
            first, last = rank == 0, rank == P - 1
        else:
            if name == "ScheduleInterleaved1F1B":
                ids = (rank, rank + P)
                first, last = rank == 0, rank == P - 1
            else:
                ids = (rank, 2 * P - 1 - rank)
                first = last = rank == 0
            stages = [pp.PipelineStage(half(), i, 2 * P, dev) for i in ids]
            sched = getattr(pp, name)(stages, m, loss_fn=mse)

        def run():
            kw = {}
            if last:
                kw = dict(target=y, losses=[])
            sched.step(*((x,) if first else ()), **kw)
        return run

    def ours(name):
        dualpipe.set_p2p_tensor_shapes([(mb, hidden)])
        dualpipe.set_p2p_tensor_dtype(torch.float32)
        hook = name.endswith("+hook")
        name = name.replace("+hook", "")
        cls = OverlapSleepStage if hook else SleepStage
        half = lambda: cls(hidden, F / 2, B / 2, W / 2)
        full = lambda: cls(hidden, F, B, W)
        if name == "DualPipeV":
            model = dualpipe.DualPipeV((half(), half()))
            inp = (x,) if rank == 0 else ()
            lab = (y,) if rank == 0 else ()
        else:
            model = dualpipe.DualPipe((full(), full()))
            xs, ys = x.chunk(2), y.chunk(2)
            inp = (xs[0],) if rank == 0 else ((xs[1],) if rank == P - 1 else ())
            lab = (ys[1],) if rank == 0 else ((ys[0],) if rank == P - 1 else ())
        return model, (lambda: model.step(*inp, num_chunks=m, criterion=mse, labels=lab))

    def calibrate(model, step):
        """Mean measured duration of each compute op kind (as the runtime executes it) + p2p latency."""
        from dualpipe.schedule import B as kB, F as kF, FB as kFB, W as kW
        times = {}
        orig = model._execute

        from dualpipe.schedule import COMMIT, RECV_B, RECV_F
        posted = []

        def timed(row):
            t0 = time.perf_counter()
            orig(row)
            key = ("Bzb" if row[1] else "B") if row[0] == kB else {kF: "F", kW: "W", kFB: "FB"}.get(row[0])
            if row[0] == COMMIT:  # a batch of sends only never waits: its duration is the issue overhead
                key = None if any(k in (RECV_F, RECV_B) for k in posted) else "commit"
                posted.clear()
            elif row[0] > kFB:
                posted.append(row[0])
            if key:
                times.setdefault(key, []).append(time.perf_counter() - t0)
        model._execute = timed
        step()
        model._execute = orig
        local = torch.tensor([statistics.mean(times.get(k, [float("nan")])) for k in ("F", "B", "Bzb", "W", "FB", "commit")])
        allv = [torch.empty_like(local) for _ in range(P)]
        dist.all_gather(allv, local)
        mean = torch.stack(allv).nanmean(0).tolist()
        # p2p latency: ping-pong of one activation between ranks 0 and 1 through batch_isend_irecv
        buf, lat = torch.zeros(mb, hidden), float("nan")
        if rank < 2:
            peer = 1 - rank
            t0 = time.perf_counter()
            for _ in range(20):
                for op in ([dist.P2POp(dist.isend, buf, peer)], [dist.P2POp(dist.irecv, buf, peer)])[::1 if rank == 0 else -1]:
                    for rq in dist.batch_isend_irecv(op):
                        rq.wait()
            lat = (time.perf_counter() - t0) / 40
        return dict(zip(("F", "B", "Bzb", "W", "FB", "commit"), mean), p2p=lat)

    names = ["DualPipeV", "DualPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleZBVZeroBubble"]
    if hasattr(pp, "ScheduleDualPipeV"):
        names.append("ScheduleDualPipeV")
    if args.overlap:
        names += ["DualPipeV+hook", "DualPipe+hook"]
    for name in names:
        if name.startswith("DualPipe"):
            model, fn = ours(name)
            res[name] = _time_steps(fn, args.steps)
            res[name + ":ops"] = calibrate(model, fn)
        else:
            res[name] = _time_steps(torch_sched(name), args.steps)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


def run_world(P, args):
    import multiprocessing as mp
    from dualpipe._testing import free_port
    ctx = mp.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "res.json")
        procs = [ctx.Process(target=worker, args=(r, P, port, args, out)) for r in range(P)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(args.timeout)
        for p in procs:
            if p.is_alive():
                p.kill()
        if not os.path.exists(out):
            raise RuntimeError(f"{P}-process run failed (exit codes {[p.exitcode for p in procs]})")
        with open(out) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", default="4,8")
    ap.add_argument("--chunks-per-rank", type=int, default=4)
    ap.add_argument("--F", type=float, default=12.0, help="ms, forward of one micro-batch over a rank's share")
    ap.add_argument("--B", type=float, default=24.0, help="ms, full backward")
    ap.add_argument("--W", type=float, default=10.0, help="ms, weight-grad part of B")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--overlap", action="store_true", help="also run DualPipe/DualPipeV with the overlap hook")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    from dualpipe import simulate
    rows = []
    for P in [int(p) for p in args.procs.split(",")]:
        m = args.chunks_per_rank * P
        res = run_world(P, args)
        ops = {k.split(":")[0]: res.pop(k) for k in list(res) if k.endswith(":ops")}
        busy = m * (args.F + args.B) / 1e3
        nominal, calibrated = {}, {}
        for name in ops:
            frac = 0.5 if name.startswith("DualPipeV") else 1.0
            kind = name.replace("+hook", "")
            nominal[name] = simulate(kind, P, m, F=args.F * frac / 1e3, B=args.B * frac / 1e3,
                                     W=args.W * frac / 1e3).makespan
            o = ops[name]
            b_full = o["B"] if o["B"] == o["B"] else o["Bzb"] + o["W"]
            calibrated[name] = simulate(kind, P, m, F=o["F"], B=b_full, W=min(o["W"], b_full), FB=o["FB"],
                                        p2p=o["p2p"], commit=o["commit"]).makespan
            print(f"{P} procs {name}: measured op means (ms) " + ", ".join(f"{k}={1e3 * v:.2f}" for k, v in o.items()))
        best_torch = min(v for k, v in res.items() if k.startswith("Schedule"))
        nominal = {k: (v if "+hook" not in k else None) for k, v in nominal.items()}  # nominal F&B = F + B
        print(f"\n{P} gloo processes, {m} micro-batches, F/B/W = {args.F}/{args.B}/{args.W} ms per rank-share; "
              f"busy per rank {busy:.3f} s")
        print(f"{'schedule':<26}{'step s':>9}{'bubble %':>10}{'vs best torch':>15}{'sim nominal':>13}"
              f"{'sim measured-ops':>18}{'meas/sim':>10}")
        for name, t in res.items():
            nom, sim = nominal.get(name), calibrated.get(name)
            f3 = lambda v: "" if v is None else f"{v:.3f}"
            print(f"{name:<26}{t:>9.3f}{100 * (1 - busy / t):>10.1f}{t / best_torch:>15.3f}{f3(nom):>13}"
                  f"{f3(sim):>18}{'' if sim is None else f'{t / sim:.3f}':>10}")
            rows.append({"procs": P, "chunks": m, "schedule": name, "step_s": t, "bubble": 1 - busy / t,
                         "ratio_vs_best_torch": t / best_torch, "simulated_nominal_s": nom,
                         "simulated_measured_ops_s": sim, "measured_op_means_s": ops.get(name)})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"F_ms": args.F, "B_ms": args.B, "W_ms": args.W, "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
