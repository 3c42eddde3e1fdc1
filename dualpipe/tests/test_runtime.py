"""DualPipe / DualPipeV against the non-pipelined oracle, on gloo (CPU) and on NCCL (one GPU each).

For every case each rank checks: loss and outputs equal the reference, every parameter gradient
matches (the two DualPipe copies of a stage summed), and the ops the runtime executed (with its
own micro-batch counters) are exactly the planner's op list for that rank. Cases: both kinds, the
minimum and a larger num_chunks, with and without the overlapped_forward_backward hook, with and
without return_outputs, forward-only, a permuted rank mapping (4 ranks), a 1-rank subgroup (2).

Configurations (one launch each; process start-up dominates the cost):
* gloo, 2/4/8 processes, float64: relative 1e-12.
* gloo, 2 processes, float32 + bfloat16: the GPU configurations' test body, run on the CPU.
* nccl, 2/4/8 GPUs (``multigpu``; skipped without that many CUDA devices), float32 + bfloat16.
  ``DUALPIPE_MULTIGPU_ON_CPU=1`` runs these with gloo on the CPU instead (a dry run of the same
  code path on a machine without GPUs).
Tolerances (max |a - b| / max |b|): float64 1e-12; float32 1e-6 (TF32 off; only the summation
order of gradient accumulation differs); bfloat16 3e-2 for gradients, 1e-2 for loss/outputs
(8-bit mantissa, unit roundoff 2^-9 = 2e-3; gradients are sums of up to 2·PP + 6 bf16 terms
accumulated in another order than the oracle's).
"""
import json
import os

import pytest
import torch

from dualpipe._testing import launch

TOL = {  # dtype -> (loss/outputs, grads)
    "float64": (1e-12, 1e-12),
    "float32": (1e-6, 1e-6),
    "bfloat16": (1e-2, 3e-2),
}
ON_CPU = os.environ.get("DUALPIPE_MULTIGPU_ON_CPU") == "1"
NUM_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def runtime_cases(P, dtypes=("float64",)):
    cases = []
    for dtype in dtypes:
        for kind in ("DualPipe", "DualPipeV"):
            larger = 2 * P + (6 if kind == "DualPipe" else 3)
            for chunks in (2 * P, larger):
                for overlap in (False, True):
                    for ret in (False, True):
                        cases.append(dict(kind=kind, num_chunks=chunks, overlap=overlap, return_outputs=ret,
                                          trace=True, dtype=dtype))
            for overlap in (False, True):  # inference (torch.no_grad): forward-only plan
                cases.append(dict(kind=kind, num_chunks=2 * P, overlap=overlap, return_outputs=True,
                                  forward_only=True, trace=True, dtype=dtype))
        if P == 4:  # a permuted rank mapping
            for kind in ("DualPipe", "DualPipeV"):
                cases.append(dict(kind=kind, num_chunks=12, overlap=True, return_outputs=True, trace=True,
                                  rank_mapping=[2, 0, 3, 1], dtype=dtype))
        if P == 2:  # 1-rank DualPipeV on a subgroup (the V turns on the only rank)
            for ret in (False, True):
                cases.append(dict(kind="DualPipeV", num_chunks=3, overlap=ret, return_outputs=ret, trace=True,
                                  subgroup=[1], dtype=dtype))
    return cases


def _gpu_config(P):
    backend = "gloo" if ON_CPU else "nccl"
    marks = [pytest.mark.multigpu]
    if not ON_CPU:
        marks.append(pytest.mark.skipif(NUM_GPUS < P, reason=f"needs {P} CUDA devices, found {NUM_GPUS}"))
    return pytest.param((backend, P, ("float32", "bfloat16")), id=f"nccl-{P}gpu", marks=marks)


CONFIGS = [pytest.param(("gloo", P, ("float64",)), id=f"gloo-{P}proc-f64") for P in (2, 4, 8)]
CONFIGS.append(pytest.param(("gloo", 2, ("float32", "bfloat16")), id="gloo-2proc-f32-bf16"))
CONFIGS += [_gpu_config(P) for P in (2, 4, 8)]


@pytest.fixture(scope="module", params=CONFIGS)
def launched(request):
    backend, P, dtypes = request.param
    cases = runtime_cases(P, dtypes)
    # NCCL launches get a tighter bound: a hang there must not eat the device call's pytest budget
    # NCCL on 2 H200s takes ~15 s (communicator set-up included); more ranks set up more communicators
    return backend, P, cases, launch(P, cases, timeout_s=300 if backend == "gloo" else 60 + 15 * P, backend=backend)


def test_all_cases_match_reference(launched):
    backend, P, cases, outs = launched
    for o in outs:
        assert o["error"] is None, o["error"]
    bad = []
    for o in outs:
        for case, res in zip(cases, o["results"]):
            if res is None:
                continue
            tol_out, tol_grad = TOL[case["dtype"]]
            for key, tol in (("loss", tol_out), ("outputs", tol_out), ("grads", tol_grad)):
                if not res[key] <= tol:
                    bad.append((o["rank"], case, key, res[key]))
            if res.get("trace_ok") != 1.0:
                bad.append((o["rank"], case, "trace", res.get("trace_ok")))
    _report(backend, P, cases, outs)
    assert not bad, bad[:5]


def _report(backend, P, cases, outs):
    """With DUALPIPE_TEST_REPORT=DIR: write the worst error per dtype/kind/quantity to DIR (a record of
    how close the GPU runs come to the tolerances)."""
    folder = os.environ.get("DUALPIPE_TEST_REPORT")
    if not folder:
        return
    worst = {}
    for o in outs:
        for case, res in zip(cases, o["results"]):
            if res is None:
                continue
            for key in ("loss", "outputs", "grads"):
                k = f"{case['dtype']}/{case['kind']}/{key}"
                worst[k] = max(worst.get(k, 0.0), res[key])
    os.makedirs(folder, exist_ok=True)
    name = f"runtime_errors_{backend}_{P}_{'-'.join(sorted({c['dtype'] for c in cases}))}.json"
    with open(os.path.join(folder, name), "w") as f:
        json.dump({"ranks": P, "backend": backend, "torch": torch.__version__, "tolerances": TOL,
                   "worst": worst}, f, indent=1)


def test_every_rank_checked_every_case(launched):
    _, P, cases, outs = launched
    assert len(outs) == P
    for o in outs:
        assert len(o["results"]) == len(cases)
    # the subgroup case ran on its member only
    for i, case in enumerate(cases):
        members = case.get("subgroup", range(P))
        assert all((outs[r]["results"][i] is not None) == (r in members) for r in range(P))
