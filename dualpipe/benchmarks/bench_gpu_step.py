"""One training step of a transformer-block pipeline on N GPUs (NCCL): our DualPipe / DualPipeV beside
torch.distributed.pipelining's Schedule1F1B, ScheduleInterleaved1F1B, ScheduleZBVZeroBubble (and
ScheduleDualPipeV when the installed torch has it) on the same stages, in the same run; then our
simulator fed with the F / B / W costs measured in that run, and its prediction beside the measurement.

    python dualpipe/benchmarks/bench_gpu_step.py [--procs N] [--micro-batch 1,2] [--chunks-per-rank 4,8]
        [--layers-per-rank 2] [--steps 5] [--overlap] [--quick] [--json PATH]
    python dualpipe/benchmarks/bench_gpu_step.py --device cpu   # gloo dry run, tiny sizes

Model (default sizes = issue 8): pre-norm blocks of causal self-attention (hidden 4096, 32 heads of
128, flash SDPA) and a MoE-like FFN (8 experts, SwiGLU 4096 -> 2048 -> 4096 each, expert-choice
routing: every expert takes its top tokens.len * 2 / 8 tokens by router score, so shapes are fixed
and nothing syncs with the host), bf16, sequence 4096, micro-batch 1-2. The model has
``layers_per_rank * PP`` blocks. 1F1B: one stage of ``layers_per_rank`` blocks per rank;
interleaved, ZBV, DualPipeV (ours and torch's): two stages of half that per rank (V or looped
placement); DualPipe: stages of ``layers_per_rank`` blocks, each rank holding two of them (its
parameters are 2x, as in the paper). Stage s has the same weights under every schedule.

Weight-gradient split: torch's zero-bubble schedules split B and W through autograd (plain matmuls);
our runtime defers the weight matmuls through ``WeightGradStore`` (the same matmuls wrapped in an
autograd function). Everything else is identical.

Measured: step time = the median over ``--steps`` steps (after warm-ups) of the slowest rank's wall
time from a common barrier to its stream being idle. Per-rank timeline: CUDA events recorded around
every compute op (our runtime: F, B, W, F&B ops as executed; torch: forward_one_chunk,
backward_one_chunk, backward_weight_one_chunk), so a wait for a peer's p2p is outside every op.
Bubble = 1 - sum(rank busy) / (ranks x step time). Prediction: ``dualpipe.simulate`` of the same
schedule family with the mean op durations of that schedule's own run and the measured one-way p2p
time of one activation (for torch's schedules: our planner's 1F1B / interleaved / ZBV / DualPipeV op
order, which may differ in detail from torch's).

NCCL runs keep NVLink multicast off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1), set here before any process group exists.
"""
from __future__ import annotations

import argparse
import gc
import inspect
import json
import math
import os
import sys
import tempfile
import time
import traceback

SAFE_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(SAFE_NCCL_ENV)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402

from dualpipe import WeightGradStore, run_backward  # noqa: E402

OURS = ("DualPipeV", "DualPipe")
TORCH = ("Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleZBVZeroBubble", "ScheduleDualPipeV")
SIM_KIND = {"Schedule1F1B": "1F1B", "ScheduleInterleaved1F1B": "interleaved", "ScheduleZBVZeroBubble": "ZBV",
            "ScheduleDualPipeV": "DualPipeV", "DualPipeV": "DualPipeV", "DualPipe": "DualPipe"}
SIZES = {  # --device cuda (issue 8) / --device cpu (dry run)
    "cuda": dict(hidden=4096, heads=32, seq=4096, experts=8, ffn=2048, topk=2, dtype="bfloat16"),
    "cpu": dict(hidden=64, heads=4, seq=32, experts=4, ffn=32, topk=2, dtype="float32"),
}


# ---- the model -------------------------------------------------------------------------------------
class _ZBMatmul(torch.autograd.Function):
    """y = x @ w (w: [in, out], or [E, in, out] with x [E, n, in]); under WeightGradStore the
    weight gradient is queued for a later W op instead of computed now."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        # autograd runs this on the stream of the forward (a side stream under the overlap hook); a
        # deferred W op runs later on whatever stream is current then: order it after this backward
        # and keep x/g alive for that stream
        done, made_on = None, None
        if g.is_cuda and WeightGradStore.enabled:
            made_on = torch.cuda.current_stream(g.device)
            done = torch.cuda.Event()
            done.record(made_on)

        def weight_grad():
            if done is not None:
                cur = torch.cuda.current_stream(g.device)
                if cur != made_on:
                    cur.wait_event(done)
                    x.record_stream(cur)
                    g.record_stream(cur)
            if w.dim() == 2:
                gw = x.reshape(-1, x.shape[-1]).t() @ g.reshape(-1, g.shape[-1])
            else:
                gw = x.transpose(-1, -2) @ g
            w.grad = gw if w.grad is None else w.grad + gw

        if WeightGradStore.enabled:
            WeightGradStore.put(weight_grad)
        else:
            weight_grad()
        return g @ w.transpose(-1, -2), None


class Block(nn.Module):
    """Pre-norm block: x + attn(rms(x)), then + moe(rms(.)). x: [mb, seq, hidden] -> same shape/dtype.

    zb=True routes every weight matmul through ``_ZBMatmul`` (our runtime's W split); zb=False uses
    plain matmuls (torch.distributed.pipelining splits B/W through autograd itself).
    """

    def __init__(self, hidden, heads, experts, ffn, topk, zb, device, dtype):
        super().__init__()
        def p(*shape):
            return nn.Parameter(torch.randn(*shape, device=device, dtype=torch.float32)
                                .div_(math.sqrt(shape[-2])).to(dtype))
        self.heads, self.experts, self.topk, self.zb = heads, experts, topk, zb
        self.wqkv, self.wo, self.router = p(hidden, 3 * hidden), p(hidden, hidden), p(hidden, experts)
        self.w1, self.w3, self.w2 = p(experts, hidden, ffn), p(experts, hidden, ffn), p(experts, ffn, hidden)

    def mm(self, x, w):
        return _ZBMatmul.apply(x, w) if self.zb else x @ w

    def forward(self, x):
        mb, s, h = x.shape
        hd = h // self.heads
        qkv = self.mm(Fn.rms_norm(x, (h,)), self.wqkv).view(mb, s, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        o = Fn.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)  # [mb, heads, s, hd]
        x = x + self.mm(o.transpose(1, 2).reshape(mb, s, h), self.wo)
        # MoE-like FFN with expert-choice routing: expert e takes its `cap` best tokens
        t = Fn.rms_norm(x, (h,)).reshape(mb * s, h)
        cap = max(1, mb * s * self.topk // self.experts)
        scores = self.mm(t, self.router).float().softmax(-1)  # [tokens, E]
        gate, idx = scores.t().topk(cap, dim=1)  # [E, cap]: expert e's best tokens
        xe = t[idx]  # [E, cap, h]
        he = Fn.silu(self.mm(xe, self.w1)) * self.mm(xe, self.w3)  # [E, cap, ffn]
        ye = self.mm(he, self.w2) * gate.unsqueeze(-1).to(x.dtype)  # [E, cap, h]
        moe = torch.zeros_like(t).index_add(0, idx.reshape(-1), ye.reshape(-1, h))
        return x + moe.view(mb, s, h)


class OverlapBlocks(nn.Sequential):
    """Blocks whose ``overlapped_forward_backward`` runs one micro-batch's forward on a side CUDA stream
    while this stream runs another's backward (on the CPU: one after the other)."""

    _side = {}

    @classmethod
    def overlapped_forward_backward(cls, module0, inputs0, criterion0, labels0, module1, loss1, outputs1,
                                    output_grads1):
        dev = inputs0[0].device
        if dev.type != "cuda":
            out0 = module0(*inputs0)
            loss0 = criterion0(out0, *labels0) if criterion0 is not None else None
            _backward(loss1, outputs1, output_grads1)
            return [out0], loss0
        cur = torch.cuda.current_stream(dev)
        side = cls._side.setdefault(dev.index, torch.cuda.Stream(dev))
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            out0 = module0(*inputs0)
            loss0 = criterion0(out0, *labels0) if criterion0 is not None else None
        _backward(loss1, outputs1, output_grads1)
        cur.wait_stream(side)
        return [out0], loss0


def _backward(loss1, outputs1, output_grads1):
    if loss1 is not None:
        loss1.backward()
        loss1.detach_()
    else:
        run_backward(outputs1, output_grads1)


def make_stage(first_block, n_blocks, cfg, zb, device, overlap=False):
    """Blocks ``first_block .. first_block + n_blocks - 1`` of the model (seeded by block index)."""
    dt = getattr(torch, cfg["dtype"])
    blocks = []
    for b in range(first_block, first_block + n_blocks):
        torch.manual_seed(1000 + b)
        blocks.append(Block(cfg["hidden"], cfg["heads"], cfg["experts"], cfg["ffn"], cfg["topk"], zb, device, dt))
    return (OverlapBlocks if overlap else nn.Sequential)(*blocks)


def mse(out, target):
    return Fn.mse_loss(out.float(), target.float())


# ---- timing --------------------------------------------------------------------------------------
class Timeline:
    """Start/end marks around compute ops: CUDA events on the current stream, or perf_counter on CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.ops = []

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(self, a, b):
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def wrap(self, fn, name_of):
        def timed(*a, **kw):
            name = name_of(a, kw)
            if name is None:
                return fn(*a, **kw)
            t0 = self.mark()
            out = fn(*a, **kw)
            self.ops.append((name, t0, self.mark()))
            return out
        return timed

    def resolve(self, start):
        """[(name, start ms, end ms)] relative to the mark ``start`` (syncs the device)."""
        if self.cuda:
            torch.cuda.synchronize()
        return [(n, self.ms(start, a), self.ms(start, b)) for n, a, b in self.ops]


def instrument_ours(model, tl):
    from dualpipe.schedule import B, F, FB, W
    names = {F: "F", W: "W", FB: "FB"}

    def name_of(a, kw):
        row = a[0]
        return ("Bzb" if row[1] else "B") if row[0] == B else names.get(row[0])
    model._execute = tl.wrap(model._execute, name_of)


def instrument_torch(stage, tl):
    fwd, bwd, bww = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk
    sig = inspect.signature(bwd)

    def bwd_name(a, kw):
        full = sig.bind_partial(*a, **kw).arguments.get("full_backward", True)
        return "B" if full else "Bin"
    stage.forward_one_chunk = tl.wrap(fwd, lambda a, kw: "F")
    stage.backward_one_chunk = tl.wrap(bwd, bwd_name)
    stage.backward_weight_one_chunk = tl.wrap(bww, lambda a, kw: "W")


# ---- one process ---------------------------------------------------------------------------------
def _init(rank, P, port, device_type, timeout_s):
    import datetime
    torch.set_num_threads(1)
    if device_type == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=P, timeout=datetime.timedelta(seconds=timeout_s))
    return torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def p2p_one_way_ms(shape, dtype, dev, rounds=10):
    """Half the mean round trip of one activation between ranks 0 and 1 (batch_isend_irecv, as the
    runtime posts it). Other ranks return nan."""
    dist.barrier()  # the group's communicator exists before two ranks alone start p2p
    r = dist.get_rank()
    if r > 1:
        return float("nan")
    buf = torch.zeros(shape, dtype=dtype, device=dev)
    peer = 1 - r

    def once():
        ops = [dist.P2POp(dist.isend, buf, peer)], [dist.P2POp(dist.irecv, buf, peer)]
        for op in (ops if r == 0 else ops[::-1]):
            for rq in dist.batch_isend_irecv(op):
                rq.wait()
    once()
    _sync(dev)
    t0 = time.perf_counter()
    for _ in range(rounds):
        once()
    _sync(dev)
    return (time.perf_counter() - t0) / (2 * rounds) * 1e3


def build(name, rank, P, m, mb, cfg, L, dev, x, y):
    """One schedule on this rank: (step function, its parameters, instrument(Timeline) to time its ops)."""
    import dualpipe
    from torch.distributed import pipelining as pp
    hook = name.endswith("+hook")
    base = name.replace("+hook", "")
    if base in OURS:
        dualpipe.set_p2p_tensor_shapes([(mb, cfg["seq"], cfg["hidden"])])
        dualpipe.set_p2p_tensor_dtype(getattr(torch, cfg["dtype"]))
        if base == "DualPipeV":
            h = L // 2
            mods = (make_stage(rank * h, h, cfg, True, dev, hook), make_stage((2 * P - 1 - rank) * h, h, cfg, True, dev, hook))
            model = dualpipe.DualPipeV(mods)
            inp, lab = ((x,), (y,)) if rank == 0 else ((), ())
        else:
            mods = (make_stage(rank * L, L, cfg, True, dev, hook), make_stage((P - 1 - rank) * L, L, cfg, True, dev, hook))
            model = dualpipe.DualPipe(mods)
            xs, ys = x.chunk(2), y.chunk(2)
            inp = (xs[0],) if rank == 0 else ((xs[1],) if rank == P - 1 else ())
            lab = (ys[1],) if rank == 0 else ((ys[0],) if rank == P - 1 else ())
        return (lambda: model.step(*inp, num_chunks=m, criterion=mse, labels=lab)), list(model.parameters()), \
            (lambda tl: instrument_ours(model, tl))
    sched_cls = getattr(pp, base)
    kw = {"loss_fn": mse}
    if "scale_grads" in inspect.signature(sched_cls.__init__).parameters:
        kw["scale_grads"] = False  # like our runtime: gradients are sums over micro-batches
    if base == "Schedule1F1B":
        stages = [pp.PipelineStage(make_stage(rank * L, L, cfg, False, dev), rank, P, dev)]
        sched = sched_cls(stages[0], m, **kw)
        first, last = rank == 0, rank == P - 1
    else:
        h = L // 2
        ids = (rank, rank + P) if base == "ScheduleInterleaved1F1B" else (rank, 2 * P - 1 - rank)
        stages = [pp.PipelineStage(make_stage(i * h, h, cfg, False, dev), i, 2 * P, dev) for i in ids]
        sched = sched_cls(stages, m, **kw)
        first = rank == 0
        last = rank == P - 1 if base == "ScheduleInterleaved1F1B" else rank == 0

    def step():
        sched.step(*((x,) if first else ()), **(dict(target=y, losses=[]) if last else {}))

    def instrument(tl):
        for st in stages:
            instrument_torch(st, tl)
    return step, [q for st in stages for q in st.submod.parameters()], instrument


def batch(m, mb, cfg, dev):
    """Inputs and targets of one step, [m * mb, seq, hidden], drawn on the device (same on every rank)."""
    dt = getattr(torch, cfg["dtype"])
    g = torch.Generator(device=dev).manual_seed(7)
    shape = (m * mb, cfg["seq"], cfg["hidden"])
    return (torch.randn(shape, generator=g, device=dev, dtype=dt),
            torch.randn(shape, generator=g, device=dev, dtype=dt))


def run_schedule(name, rank, P, m, mb, cfg, L, dev, steps, warmup, x, y):
    """Time one schedule; returns this rank's {"wall": [s...], "ops": [[(name, t0, t1)...] per step], "peak_gib"}."""
    step, params, instrument = build(name, rank, P, m, mb, cfg, L, dev, x, y)

    def zero():
        for q in params:
            q.grad = None
    for _ in range(warmup):  # torch's stages infer shapes on their first step; kernels get picked
        zero()
        step()
    tl = Timeline(dev)
    instrument(tl)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    walls, timelines = [], []
    for _ in range(steps):
        zero()
        _sync(dev)
        dist.barrier()
        tl.ops = []
        w0 = time.perf_counter()
        start = tl.mark()
        step()
        end = tl.mark()
        _sync(dev)
        walls.append(time.perf_counter() - w0)
        ops = tl.resolve(start)
        ops.append(("END", tl.ms(start, end), tl.ms(start, end)))
        timelines.append(ops)
    peak = torch.cuda.max_memory_allocated(dev) / 2 ** 30 if dev.type == "cuda" else float("nan")
    del step, params, instrument
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"wall": walls, "ops": timelines, "peak_gib": peak}


def worker(rank, P, port, args, out_path):
    dev = _init(rank, P, port, args.device, args.nccl_timeout)
    cfg = dict(SIZES[args.device])
    for k in ("hidden", "seq"):
        if getattr(args, k):
            cfg[k] = getattr(args, k)
    from torch.distributed import pipelining as pp
    names = list(OURS) + [n for n in TORCH if hasattr(pp, n)]
    if args.overlap:
        names += [n + "+hook" for n in OURS]
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    results = {"procs": P, "device": args.device, "cfg": cfg, "layers_per_rank": args.layers_per_rank,
               "torch": torch.__version__, "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
               "runs": []}
    for mb in [int(v) for v in args.micro_batch.split(",")]:
        shape = (mb, cfg["seq"], cfg["hidden"])
        p2p = p2p_one_way_ms(shape, getattr(torch, cfg["dtype"]), dev)
        for cpr in [int(v) for v in args.chunks_per_rank.split(",")]:
            m = cpr * P
            x, y = batch(m, mb, cfg, dev)
            for name in names:
                t0 = time.perf_counter()
                try:
                    res = run_schedule(name, rank, P, m, mb, cfg, args.layers_per_rank, dev, args.steps,
                                       args.warmup, x, y)
                    err = None
                except Exception:  # recorded; a failure on some ranks only ends in the group timeout
                    res, err = None, traceback.format_exc()
                gathered = [None] * P
                dist.all_gather_object(gathered, {"res": res, "err": err})
                if rank == 0:
                    errs = [g["err"] for g in gathered if g["err"]]
                    run = {"schedule": name, "micro_batch": mb, "chunks": m, "p2p_ms": p2p,
                           "seconds_total": time.perf_counter() - t0, "error": errs[0] if errs else None}
                    if not errs:
                        walls = [max(g["res"]["wall"][i] for g in gathered) for i in range(args.steps)]
                        med = sorted(range(args.steps), key=walls.__getitem__)[args.steps // 2]
                        stats = {}  # op name -> [total ms, count] over every timed step and rank
                        for g in gathered:
                            for ops in g["res"]["ops"]:
                                for n, a, b in ops:
                                    if n != "END":
                                        st = stats.setdefault(n, [0.0, 0])
                                        st[0] += b - a
                                        st[1] += 1
                        run.update(wall=walls, median_step=med, op_stats_ms=stats,
                                   timelines=[g["res"]["ops"][med] for g in gathered],  # [rank][op], median step
                                   peak_gib=max(g["res"]["peak_gib"] for g in gathered))
                    results["runs"].append(run)
                    with open(out_path, "w") as f:  # after every schedule: a killed run keeps what it had
                        json.dump(results, f)
                    print(f"[{P} ranks, mb {mb}, {m} chunks] {name}: "
                          f"{'FAILED' if errs else 'ok'} in {time.perf_counter() - t0:.1f} s", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    # Everything is written (rank 0's JSON after each schedule). Leave without the interpreter's teardown:
    # a fresh-clone CI run once saw a rank abort there ("terminate called without an active exception",
    # a C++ thread object of the torch/gloo runtime destroyed while joinable) after all schedules were
    # done, which the parent reads as a crashed run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---- analysis (parent) ---------------------------------------------------------------------------
def analyse(run, P):
    """Step time, measured bubble, op means and our simulator's prediction for one schedule run."""
    from dualpipe import simulate
    step_s = run["wall"][run["median_step"]]
    busy = [sum(t1 - t0 for n, t0, t1 in ops if n != "END") / 1e3 for ops in run["timelines"]]
    span = [ops[-1][2] / 1e3 for ops in run["timelines"]]
    counts = {n: c for n, (_, c) in run["op_stats_ms"].items()}
    mean = {n: total / c / 1e3 for n, (total, c) in run["op_stats_ms"].items()}  # seconds
    F = mean.get("F", float("nan"))
    W = mean.get("W", 0.0)
    if "B" in mean:
        Bfull = mean["B"]
    elif "Bzb" in mean:
        Bfull = mean["Bzb"] + W
    else:
        Bfull = mean.get("Bin", float("nan")) + W
    FB = mean.get("FB", F + Bfull)
    kind = SIM_KIND[run["schedule"].replace("+hook", "")]
    p2p = run["p2p_ms"] / 1e3 if run["p2p_ms"] == run["p2p_ms"] else 0.0
    pred = float("nan")
    if F == F and Bfull == Bfull:
        pred = simulate(kind, P, run["chunks"], F=F, B=Bfull, W=min(W, Bfull), FB=FB, p2p=p2p).makespan
    return {"schedule": run["schedule"], "micro_batch": run["micro_batch"], "chunks": run["chunks"],
            "step_s": step_s, "steps_s": run["wall"], "bubble": 1 - sum(busy) / (P * step_s),
            "bubble_per_rank": [1 - b / step_s for b in busy], "span_s": span, "op_mean_s": mean,
            "op_counts": counts, "p2p_s": p2p, "simulated_s": pred, "measured_over_simulated": step_s / pred,
            "peak_gib": run.get("peak_gib"), "timeline_ms": run["timelines"]}  # per rank, the median step


def run_world(P, args):
    from dualpipe._testing import free_port, run_ranks
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        # rank 0 rewrites this after every schedule; beside --json it outlives a hard kill of this script
        out = args.json + f".raw{P}.json" if args.json else os.path.join(d, "res.json")
        procs, alive = run_ranks(worker, P, lambda r: (r, P, port, args, out), args.timeout)
        if not os.path.exists(out):
            raise RuntimeError(f"{P}-process run produced nothing (exit codes {[p.exitcode for p in procs]})")
        with open(out) as f:
            res = json.load(f)
        if args.json:
            os.remove(out)
        res["incomplete"] = bool(alive) or any(p.exitcode != 0 for p in procs)
        return res


def print_table(P, rows, head):
    print(f"\n{head}")
    print(f"{'schedule':<26}{'step ms':>9}{'bubble %':>10}{'vs best torch':>15}{'sim ms':>9}{'meas/sim':>10}"
          f"{'F ms':>8}{'B ms':>8}{'W ms':>8}{'F&B ms':>8}{'peak GiB':>10}")
    best = min((r["step_s"] for r in rows if r["schedule"].startswith("Schedule")), default=float("nan"))
    for r in rows:
        o = r["op_mean_s"]
        b = o.get("B", o.get("Bzb", o.get("Bin", float("nan"))))
        f = lambda v: f"{1e3 * v:.2f}" if v is not None and v == v else ""
        r["ratio_vs_best_torch"] = r["step_s"] / best
        print(f"{r['schedule']:<26}{1e3 * r['step_s']:>9.1f}{100 * r['bubble']:>10.1f}{r['step_s'] / best:>15.3f}"
              f"{1e3 * r['simulated_s']:>9.1f}{r['measured_over_simulated']:>10.3f}{f(o.get('F')):>8}{f(b):>8}"
              f"{f(o.get('W')):>8}{f(o.get('FB')):>8}{'' if r['peak_gib'] is None else format(r['peak_gib'], '.1f'):>10}")


def plot(rows, P, path, title):
    """Measured per-rank timelines (the median step) of every schedule in ``rows``, one panel each."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"F": "#4878d0", "B": "#6acc64", "Bzb": "#6acc64", "Bin": "#6acc64", "W": "#ee854a", "FB": "#956cb4"}
    fig, axes = plt.subplots(len(rows), 1, figsize=(14, 0.45 * P * len(rows) + 1.5), squeeze=False)
    span = max(r["step_s"] for r in rows) * 1e3
    for ax, r in zip(axes[:, 0], rows):
        for rank, ops in enumerate(r["timeline_ms"]):
            for n, t0, t1 in ops:
                if n != "END":
                    ax.broken_barh([(t0, t1 - t0)], (rank - 0.4, 0.8), facecolors=colors.get(n, "grey"))
        ax.set_xlim(0, span)
        ax.set_ylim(P - 0.5, -0.5)
        ax.set_yticks(range(P))
        ax.set_ylabel("rank")
        ax.set_title(f"{r['schedule']}: step {1e3 * r['step_s']:.1f} ms, bubble {100 * r['bubble']:.1f} %, "
                     f"simulated {1e3 * r['simulated_s']:.1f} ms", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("ms from step start (CUDA events on GPUs; F blue, B green, W orange, F&B purple)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--procs", default="", help="comma list; default: all GPUs (cuda) or 2,4 (cpu)")
    ap.add_argument("--micro-batch", default="1", help="comma list of micro-batch sizes (issue 8: 1-2)")
    ap.add_argument("--chunks-per-rank", default="4,8", help="chunks = this x PP (issue 8: 4 and 8)")
    ap.add_argument("--layers-per-rank", type=int, default=2, help="blocks per rank's share (even)")
    ap.add_argument("--hidden", type=int, default=0, help="override the hidden size")
    ap.add_argument("--seq", type=int, default=0, help="override the sequence length")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--overlap", action="store_true", help="also DualPipe/DualPipeV with the side-stream F&B hook")
    ap.add_argument("--only", default="", help="comma list of schedule names to run")
    ap.add_argument("--quick", action="store_true", help="3 steps, 1 warm-up, chunks 4xPP only")
    ap.add_argument("--timeout", type=float, default=500.0, help="seconds per world size")
    ap.add_argument("--nccl-timeout", type=float, default=120.0, help="process-group timeout, seconds")
    ap.add_argument("--json", default="")
    ap.add_argument("--plot", default="", help="PNG of the measured timelines (first world, micro-batch, chunks)")
    args = ap.parse_args()
    if args.layers_per_rank < 2 or args.layers_per_rank % 2:
        ap.error(f"--layers-per-rank must be even and >= 2, got {args.layers_per_rank}")
    if args.quick:
        args.steps, args.warmup, args.chunks_per_rank = 3, 1, args.chunks_per_rank.split(",")[0]
    if args.device == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        procs = [int(p) for p in args.procs.split(",")] if args.procs else [n]
        if n < 2 or max(procs) > n:
            ap.error(f"--device cuda needs >= 2 GPUs and at least max(--procs) of them; found {n}")
    else:
        procs = [int(p) for p in (args.procs or "2,4").split(",")]
    out = {"argv": sys.argv[1:], "date": time.strftime("%Y-%m-%d %H:%M:%S"), "worlds": []}
    for P in procs:
        res = run_world(P, args)
        rows = []
        for run in res["runs"]:
            if run["error"]:
                print(f"\n{P} ranks, {run['schedule']} mb {run['micro_batch']} chunks {run['chunks']} FAILED:\n"
                      f"{run['error'][-1500:]}")
                continue
            rows.append(analyse(run, P))
        cfg = res["cfg"]
        for mb in sorted({r["micro_batch"] for r in rows}):
            for m in sorted({r["chunks"] for r in rows}):
                sel = [r for r in rows if r["micro_batch"] == mb and r["chunks"] == m]
                if sel:
                    print_table(P, sel, f"{P} x {res['gpu']} ({res['device']}, torch {res['torch']}), hidden "
                                f"{cfg['hidden']}, seq {cfg['seq']}, micro-batch {mb}, {m} chunks, "
                                f"{args.layers_per_rank * P} blocks, {cfg['dtype']}; one-way p2p "
                                f"{1e3 * sel[0]['p2p_s']:.3f} ms")
        out["worlds"].append({"procs": P, "gpu": res["gpu"], "torch": res["torch"], "cfg": cfg,
                              "layers_per_rank": args.layers_per_rank, "incomplete": res["incomplete"],
                              "failed": [r["schedule"] for r in res["runs"] if r["error"]], "rows": rows})
        if args.plot and rows and len(out["worlds"]) == 1:
            first = [r for r in rows if (r["micro_batch"], r["chunks"]) == (rows[0]["micro_batch"], rows[0]["chunks"])]
            plot(first, P, args.plot, f"{P} x {res['gpu']}, micro-batch {first[0]['micro_batch']}, "
                 f"{first[0]['chunks']} chunks, hidden {cfg['hidden']}, seq {cfg['seq']}")
        if res["incomplete"]:
            print(f"\nWARNING: the {P}-rank run did not finish (timeout or crash); rows above are what it had")
        if args.json:  # after every world size
            with open(args.json, "w") as f:
                json.dump(out, f)
    ok = all(not w["incomplete"] and not w["failed"] for w in out["worlds"])
    print(f"\nsummary: backend={'NCCL' if args.device == 'cuda' else 'gloo'} worlds={procs} result={'ok' if ok else 'partial'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
