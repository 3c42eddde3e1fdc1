"""GPU tests of the CUDA kernels against the float32 reference (marked `gpu`)."""
import itertools
import math
import os
import random

import pytest
import torch

import flashmla
from flashmla import ref
from flashmla.testing import check_decode
from flashmla.testing import f16_dequantized, fp8_reference, live_slots, make_inputs, rf_reference, wide_tile_cache

pytestmark = pytest.mark.gpu
DEV = "cuda"

# FLASHMLA_FP8_Q=1: S's NoPE part on the FP8 tensor cores, whose sums of 32 products keep fewer bits than fp32
# (the per-128-column accumulators bound how far that goes): lse within this of its oracle, not 1e-5
FP8_Q_LSE_TOL = 2e-3


def check(out, lse, ro, rl, lse_tol=1e-5):
    """check_decode, with lse within FP8_Q_LSE_TOL where the register-fed kernel ran under FLASHMLA_FP8_Q=1 (so that
    the whole suite also runs under that switch: `FLASHMLA_FP8_Q=1 pytest -m gpu`; the oracles follow it)."""
    if os.environ.get("FLASHMLA_FP8_Q") == "1" and flashmla.api._C.last_kernel() == "swapab_rf":
        lse_tol = max(lse_tol, FP8_Q_LSE_TOL)
    check_decode(out, lse, ro, rl, lse_tol)


KERNELS = ["default", "wgmma"]  # FLASHMLA_KERNEL values, for BF16 and FP8 caches alike (FP8 under
# wgmma: mla_decode_wgmma_fp8.cu); unset or "auto" picks one per call: test_auto_kernel_choice


# the BF16 wgmma kernel's launcher settings each variant runs under (FP8 caches ignore them)
WGMMA_SETTINGS = {"wgmma": "256", "wgmma_split128": "128", "wgmma_ovh0": "128"}
# scheduler of a variant: FLASHMLA_SPLIT_OVH (read by get_mla_metadata); unset: 5 pages per segment,
# the default; 0: pure page balance, which splits nearly every request (the combine's heaviest use)
SPLIT_OVH_SETTINGS = {"wgmma_ovh0": "0"}


@pytest.fixture(params=["default"] + list(WGMMA_SETTINGS) + ["swapab"])
def kernel(request, monkeypatch):
    """Runs a decode test once per kernel variant (read by the launcher at every call); the BF16
    wgmma kernel under both FLASHMLA_WGMMA_SPLIT values (O columns of its S/softmax warpgroup), and
    once more under the scheduler's FLASHMLA_SPLIT_OVH=0 (SPLIT_OVH_SETTINGS); swapab: the swap-AB
    kernel for both caches up to 32 query rows (the default kernel above that)."""
    monkeypatch.setenv("FLASHMLA_KERNEL", request.param.split("_")[0])
    monkeypatch.setenv("FLASHMLA_WGMMA_SPLIT", WGMMA_SETTINGS.get(request.param, "256"))
    if request.param in SPLIT_OVH_SETTINGS:
        monkeypatch.setenv("FLASHMLA_SPLIT_OVH", SPLIT_OVH_SETTINGS[request.param])
    else:
        monkeypatch.delenv("FLASHMLA_SPLIT_OVH", raising=False)
    return request.param


def run_kernels(monkeypatch, kernels, q, kv, bt, sl, s_q, fp8=False, ref=None):
    """Run under each FLASHMLA_KERNEL value of `kernels` (each checked against ref = (out, lse) when given);
    the first two agree with each other: same inf pattern, outputs within the sum of their tolerances.
    Returns {kernel: (out, lse)}."""
    res = {}
    for k in kernels:
        monkeypatch.setenv("FLASHMLA_KERNEL", k)
        res[k] = run(q, kv, bt, sl, causal=s_q > 1, fp8=fp8)
        if ref is not None:
            check(*res[k], *ref)
    (o1, l1), (o2, l2) = res[kernels[0]], res[kernels[1]]
    assert torch.equal(torch.isinf(l1), torch.isinf(l2))
    torch.testing.assert_close(o2.float(), o1.float(), atol=1.6e-3, rtol=4e-2)
    return res


def need_kernel():
    if not flashmla.cuda_available():
        pytest.skip("flashmla was built without the CUDA kernels")


def check_replays(graph, g_out, g_lse, static_sl, cap, reference, page_tails=False):
    """Replays a captured decode 3 times with new random lengths (<= cap) written into static_sl:
    request `trial` of length 0 and, with page_tails, request `trial + 1` one token into a page;
    the outputs are NaN-poisoned before each replay and then checked against reference()."""
    batch = static_sl.numel()
    for trial in range(3):
        new = torch.randint(0, cap + 1, (batch,), dtype=torch.int32, device=DEV)
        new[trial] = 0
        if page_tails:
            new[trial + 1] = 64 * trial + 1
        static_sl.copy_(new)
        g_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(g_out, g_lse, *reference())


def capture(step):
    """Warms step() up on a side stream, then captures it in a CUDA graph: (graph, its outputs)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


def run(q, kc, bt, sl, causal=False, fp8=False):
    s_q, h_q = q.shape[1], q.shape[2]
    meta, splits = flashmla.get_mla_metadata(sl, s_q * h_q, 1)
    res = flashmla.flash_mla_with_kvcache(q, kc, bt, sl, 512, meta, splits, causal=causal, is_fp8_kvcache=fp8)
    # the variant that actually ran: wgmma when selected (BF16 or FP8 cache) or, under auto, from the
    # launcher's row thresholds on (_C.auto_wgmma_min_rows: 1 for a BF16 cache, 33 for FP8); the
    # swap-AB kernel for at most _C.auto_swapab_max_rows rows (32; 16 under FLASHMLA_SWAPAB_MAX_ROWS=16,
    # which the binding reads at each call) of either cache, under auto or swapab
    sel = os.environ.get("FLASHMLA_KERNEL") or "auto"
    auto_rows = flashmla.api._C.auto_wgmma_min_rows(fp8)
    want = "wgmma" if sel == "wgmma" or (sel == "auto" and s_q * h_q >= auto_rows) else "default"
    if sel in ("swapab", "auto") and s_q * h_q <= flashmla.api._C.auto_swapab_max_rows():
        want = "swapab"
        if fp8 and s_q * h_q <= RF_MAX_ROWS and os.environ.get("FLASHMLA_SWAPAB_RF") != "0":
            want = "swapab_rf"  # the register-fed FP8 kernel (FLASHMLA_SWAPAB_RF=0: the bf16-stage one)
    assert flashmla.api._C.last_kernel() == want
    return res


RF_MAX_ROWS = 32  # the register-fed swap-AB FP8 kernel's rows (16- and 32-row instantiations)


@pytest.mark.parametrize("ovh", [None, 0, 2, 8, 255])
@pytest.mark.parametrize("lens", [[4096] * 64, [0, 0, 5, 100000, 3], [1] * 300, [0], [16384] + [64] * 131,
                                  list(range(0, 20000, 97))])
@pytest.mark.parametrize("m", [16, 128, 512])
def test_metadata_matches_reference(lens, m, ovh, monkeypatch):
    """The metadata kernel computes the integers of ref.schedule_ref, at the default 5 pages per
    segment (FLASHMLA_SPLIT_OVH unset) and under FLASHMLA_SPLIT_OVH=c."""
    need_kernel()
    if ovh is None:
        monkeypatch.delenv("FLASHMLA_SPLIT_OVH", raising=False)
    else:
        monkeypatch.setenv("FLASHMLA_SPLIT_OVH", str(ovh))
    sl = torch.tensor(lens, dtype=torch.int32, device=DEV)
    meta, splits = flashmla.get_mla_metadata(sl, m, 1)
    parts = ref.num_sm_parts_for(torch.cuda.get_device_properties(0).multi_processor_count, m, 1)
    rm, rs = ref.schedule_ref(sl.cpu(), parts) if ovh is None else ref.schedule_ref(sl.cpu(), parts, ovh)
    assert torch.equal(meta.cpu(), rm) and torch.equal(splits.cpu(), rs)


@pytest.mark.parametrize("ovh", ["0", "5", "64"])
@pytest.mark.parametrize("lens,h_q,s_q", [([4096] * 132, 16, 1), ([1024] * 64, 64, 2),
                                          ([0, 1, 65, 4097, 64, 16384, 7] * 5, 32, 1)])
def test_split_overhead_scheduler_decodes(lens, h_q, s_q, ovh, monkeypatch):
    """Decodes with FLASHMLA_SPLIT_OVH schedules (0: many splits; 5, the default; 64: few or none)
    match the reference, under the wgmma and the mma.sync kernel, and with an FP8 cache under auto
    (swap-AB at 16 and 32 rows, FP8 wgmma at 128) and the mma.sync FP8 path, which read the same
    metadata."""
    need_kernel()
    monkeypatch.setenv("FLASHMLA_SPLIT_OVH", ovh)
    monkeypatch.setenv("FLASHMLA_WGMMA_SPLIT", "128")
    q, kc, bt, sl = make_inputs(len(lens), lens, h_q, s_q, device=DEV, seed=len(lens) + h_q)
    causal = s_q > 1
    ro, rl = flashmla.mla_decode_ref(q, kc, bt, sl, 512, causal=causal)
    for k in ("default", "wgmma"):
        monkeypatch.setenv("FLASHMLA_KERNEL", k)
        check(*run(q, kc, bt, sl, causal), ro, rl)
    k8 = flashmla.quantize_kvcache(kc)
    for k in ("auto", "default"):
        monkeypatch.setenv("FLASHMLA_KERNEL", k)
        out, lse = run(q, k8, bt, sl, causal, fp8=True)
        check(out, lse, *fp8_reference(q, k8, bt, sl, causal))


def test_split_overhead_rejects_bad_values(monkeypatch):
    """A FLASHMLA_SPLIT_OVH outside 0..255 is a ValueError naming it; nothing is launched."""
    need_kernel()
    q, kc, bt, sl = make_inputs(3, [100, 0, 7000], 16, 1, device=DEV, seed=9)
    for bad in ("256", "-1", "x"):
        monkeypatch.setenv("FLASHMLA_SPLIT_OVH", bad)
        with pytest.raises(ValueError, match="FLASHMLA_SPLIT_OVH"):
            run(q, kc, bt, sl)


SWEEP = list(itertools.product([1, 7, 64, 132], [1, 63, 64, 65, 1024, 4097, 16384], [1, 16, 64, 128], [1, 2]))


@pytest.mark.parametrize("batch,seqlen,h_q,s_q", SWEEP)
def test_decode_sweep(batch, seqlen, h_q, s_q, kernel):
    need_kernel()
    seed = hash((batch, seqlen, h_q, s_q)) % 10000
    rng = random.Random(seed)
    # request 0 has exactly `seqlen` keys; the others are ragged in [0, seqlen]
    lens = [seqlen] + [rng.randint(0, seqlen) for _ in range(batch - 1)]
    causal = s_q > 1 and seed % 2 == 0
    q, kc, bt, sl = make_inputs(batch, lens, h_q, s_q, device=DEV, seed=seed)
    out, lse = run(q, kc, bt, sl, causal)
    ro, rl = flashmla.mla_decode_ref(q, kc, bt, sl, 512, causal=causal)
    check(out, lse, ro, rl)


@pytest.mark.parametrize("h_q,s_q,causal", [(3, 4, True), (33, 3, True), (100, 1, False), (128, 4, True),
                                            (128, 4, False), (7, 2, False), (64, 4, True)])
def test_odd_heads_mtp_and_short_requests(h_q, s_q, causal, kernel):
    need_kernel()
    lens = [0, 1, 2, 3, 64, 65, 300, 5000, 0, 17]
    q, kc, bt, sl = make_inputs(len(lens), lens, h_q, s_q, device=DEV, seed=h_q * 10 + s_q)
    out, lse = run(q, kc, bt, sl, causal)
    ro, rl = flashmla.mla_decode_ref(q, kc, bt, sl, 512, causal=causal)
    check(out, lse, ro, rl)
    assert (out[0] == 0).all() and torch.isposinf(lse[0]).all()


def test_unshuffled_and_repeated_calls_are_deterministic(kernel):
    need_kernel()
    q, kc, bt, sl = make_inputs(16, [3000] * 16, 64, 1, device=DEV, seed=3, shuffle=False)
    a, la = run(q, kc, bt, sl)
    b, lb = run(q, kc, bt, sl)
    assert torch.equal(a, b) and torch.equal(la, lb)


def test_poisoned_output_is_fully_written(kernel):
    need_kernel()
    q, kc, bt, sl = make_inputs(5, [10, 700, 0, 64, 129], 16, 2, device=DEV, seed=4)
    meta, splits = flashmla.get_mla_metadata(sl, 32, 1)
    for _ in range(3):  # the caching allocator hands back the NaN-filled blocks
        junk = torch.full((1 << 22,), float("nan"), device=DEV)
        del junk
        out, lse = flashmla.flash_mla_with_kvcache(q, kc, bt, sl, 512, meta, splits, causal=True)
        assert not torch.isnan(out).any() and not torch.isnan(lse).any()


@pytest.mark.parametrize("h_q,s_q", [(64, 2), (16, 2), (8, 1)])
def test_cuda_graph_replay_with_new_seqlens(h_q, s_q, kernel):
    """A decode captured at one batch and replayed with new lengths (32 and 8 rows: the swap-AB kernel's two
    instantiations under `swapab`)."""
    need_kernel()
    batch, cap = 8, 4096
    q, kc, bt, sl = make_inputs(batch, [cap] * batch, h_q, s_q, device=DEV, seed=7)
    static_sl = sl.clone()

    def step():
        meta, splits = flashmla.get_mla_metadata(static_sl, s_q * h_q, 1)
        return flashmla.flash_mla_with_kvcache(q, kc, bt, static_sl, 512, meta, splits, causal=True)

    graph, (g_out, g_lse) = capture(step)
    # slots past the new lengths hold real (finite) values now: only the mask keeps them out
    check_replays(graph, g_out, g_lse, static_sl, cap,
                  lambda: flashmla.mla_decode_ref(q, kc, bt, static_sl, 512, causal=True))


def test_wrong_device_raises():
    need_kernel()
    q, kc, bt, sl = make_inputs(2, [100, 10], 16, 1, device=DEV, seed=1)
    meta, splits = flashmla.get_mla_metadata(sl, 16, 1)
    with pytest.raises(ValueError, match="block_table"):
        flashmla.flash_mla_with_kvcache(q, kc, bt.cpu(), sl, 512, meta, splits)


def test_long_ragged_batch(kernel):
    need_kernel()
    rng = random.Random(5)
    lens = [rng.randint(1, 32768) for _ in range(64)]
    q, kc, bt, sl = make_inputs(64, lens, 16, 1, device=DEV, seed=8)
    out, lse = run(q, kc, bt, sl)
    ro, rl = flashmla.mla_decode_ref(q, kc, bt, sl, 512)
    check(out, lse, ro, rl)


FP8_SWEEP = list(itertools.product([1, 7, 64], [1, 65, 4097], [16, 64, 128], [1, 2]))


@pytest.mark.parametrize("batch,seqlen,h_q,s_q", FP8_SWEEP)
def test_fp8_kvcache(batch, seqlen, h_q, s_q, kernel):
    """FP8 kernel vs the reference on the dequantised cache (same tolerances as BF16), and the
    accuracy of the FP8 cache against the unquantised BF16 reference (stated in the README)."""
    need_kernel()
    seed = hash((batch, seqlen, h_q, s_q, "fp8")) % 10000
    rng = random.Random(seed)
    lens = [seqlen] + [rng.randint(0, seqlen) for _ in range(batch - 1)]
    causal = s_q > 1
    q, kc, bt, sl = make_inputs(batch, lens, h_q, s_q, device=DEV, seed=seed)
    k8 = flashmla.quantize_kvcache(kc)
    out, lse = run(q, k8, bt, sl, causal, fp8=True)
    check(out, lse, *fp8_reference(q, k8, bt, sl, causal))
    exact, _ = flashmla.mla_decode_ref(q, kc, bt, sl, 512, causal=causal)
    if exact.abs().sum() > 0:
        cos = torch.nn.functional.cosine_similarity(out.float().flatten(), exact.flatten(), dim=0)
        assert cos > 0.999, f"fp8 cache cosine vs bf16 reference {cos.item()}"


def test_unknown_kernel_variant_raises(monkeypatch):
    need_kernel()
    q, kc, bt, sl = make_inputs(2, [100, 10], 16, 1, device=DEV, seed=1)
    monkeypatch.setenv("FLASHMLA_KERNEL", "mma")
    with pytest.raises(RuntimeError, match="FLASHMLA_KERNEL"):
        run(q, kc, bt, sl)
    monkeypatch.setenv("FLASHMLA_KERNEL", "wgmma")
    for var, bad in [("FLASHMLA_WGMMA_SPLIT", "192"), ("FLASHMLA_L2_PREFETCH", "9"), ("FLASHMLA_FP8_F16", "2")]:
        monkeypatch.setenv(var, bad)
        with pytest.raises(RuntimeError, match=var):
            run(q, kc, bt, sl)
        monkeypatch.delenv(var)


@pytest.mark.parametrize("h_q,s_q", [(64, 1), (128, 1), (64, 2), (128, 2), (16, 1)])
def test_wgmma_matches_default_kernel(h_q, s_q, monkeypatch):
    """The two variants against each other on the compute-bound shapes the wgmma kernel is for
    (both are also checked against the reference above): same inf pattern, outputs within the
    sum of their tolerances."""
    need_kernel()
    lens = [4097, 0, 64, 1, 2000, 65, 8191, 130]
    q, kc, bt, sl = make_inputs(len(lens), lens, h_q, s_q, device=DEV, seed=h_q + s_q)
    res = run_kernels(monkeypatch, KERNELS, q, kc, bt, sl, s_q)
    l1, l2 = res["default"][1], res["wgmma"][1]
    fin = torch.isfinite(l1)
    assert ((l1[fin] - l2[fin]).abs() / l1[fin].abs().clamp_min(1.0)).max() < 2e-5


@pytest.mark.parametrize("h_q,s_q", [(16, 1), (64, 1), (128, 2), (5, 3)])
def test_fp8_wgmma_matches_default_kernel(h_q, s_q, monkeypatch):
    """FP8 cache: the wgmma variant (TMA RoPE + dequantising producer warpgroup) against the default
    kernel on the same quantised cache, with requests on both sides of the exact-P threshold (1024
    keys), a page-aligned length, tails of 1 and 63 tokens (NaN bytes and NaN scales past them),
    and a zero-length request: same inf pattern, outputs within the sum of their tolerances, and
    each within the tolerances of the reference on the dequantised cache."""
    need_kernel()
    lens = [4097, 0, 64, 1, 2000, 65, 1023, 130, 127]
    q, kc, bt, sl = make_inputs(len(lens), lens, h_q, s_q, device=DEV, seed=31 * h_q + s_q)
    k8 = flashmla.quantize_kvcache(kc)
    ref = flashmla.mla_decode_ref(q, flashmla.dequantize_kvcache(k8), bt, sl, 512, causal=s_q > 1)
    run_kernels(monkeypatch, KERNELS, q, k8, bt, sl, s_q, fp8=True, ref=ref)


def shape_data(q, kc, data, seed):
    """randn: as drawn; wide: tile scales over 5.5 decades (wide_tile_cache); large_q: |Q| up to ~1.5e5 on every
    other request (E = 3 there) over K ~ 1e-4 (half of it f16 subnormals), logits ~3x the randn case's (at 3e5, 30x:
    the fp32 sums of S, reference and kernel alike, then differ by ~1e-5 of lse); small_q: |Q| ~ 1e-6 over K ~ 1e6
    (logits of order 1; outputs ~1e6, so compare them scaled back); jumpy: each page's RoPE columns times 1..17 at
    random (page maxima of the logits jump by more than the register-fed kernel's slack of 2^8, up and down; the
    values, V = K[:, :512], as drawn)."""
    if data == "jumpy":
        g = torch.Generator(device=kc.device).manual_seed(seed)
        f = 1 + 16 * torch.rand(kc.shape[0], 1, 1, 1, generator=g, device=kc.device)
        kc = torch.cat([kc[..., :512], (kc[..., 512:].float() * f).to(kc.dtype)], -1)
    if data == "wide":
        kc = wide_tile_cache(kc, seed)
    if data == "large_q":
        q[1::2] = (q[1::2].float() * 3e4).to(q.dtype)
        kc = (kc.float() * 1e-4).to(kc.dtype)
    if data == "small_q":
        q, kc = (q.float() * 1e-6).to(q.dtype), (kc.float() * 1e6).to(kc.dtype)
    return q, kc


@pytest.mark.parametrize("h_q,s_q", [(48, 1), (64, 1), (64, 2), (128, 1), (128, 2)])
@pytest.mark.parametrize("data", ["randn", "wide", "large_q"])
def test_fp8_f16_consumers(h_q, s_q, data, monkeypatch):
    """FLASHMLA_FP8_F16=1 (the FP8 wgmma kernel with f16 consumers: K = V and Q's NoPE part in f16, P in f16)
    within the tests' tolerances of the reference on the cache as it dequantises it
    (flashmla.testing.f16_dequantized): NaN bytes and scales past every length, a zero-length request, tails of
    1 and 63 tokens, both sides of the exact-P threshold; tiles over 5.5 decades (wide: f16 subnormal scales take the fp32 path); query rows
    beyond f16's range (large_q: Q scaled by 2^-E, S by 2^E)."""
    need_kernel()
    monkeypatch.setenv("FLASHMLA_KERNEL", "wgmma")
    monkeypatch.setenv("FLASHMLA_FP8_F16", "1")
    lens = [4097, 0, 64, 1, 2000, 65, 1023, 130, 127]
    q, kc, bt, sl = make_inputs(len(lens), lens, h_q, s_q, device=DEV, seed=17 * h_q + s_q)
    q, kc = shape_data(q, kc, data, 3)
    k8 = flashmla.quantize_kvcache(kc)
    out, lse = run(q, k8, bt, sl, causal=s_q > 1, fp8=True)
    check(out, lse, *flashmla.mla_decode_ref(q, f16_dequantized(k8), bt, sl, 512, causal=s_q > 1))


def test_fp8_wgmma_cuda_graph_replay(monkeypatch):
    """The FP8 wgmma path captured in a CUDA graph at one batch and replayed with new lengths
    (including 0 and lengths that end inside a page), each replay checked against the reference."""
    need_kernel()
    monkeypatch.setenv("FLASHMLA_KERNEL", "wgmma")
    batch, h_q, cap = 6, 64, 4160
    q, kc, bt, sl = make_inputs(batch, [cap] * batch, h_q, 1, device=DEV, seed=12)
    k8 = flashmla.quantize_kvcache(kc)
    static_sl = sl.clone()

    def step():
        meta, splits = flashmla.get_mla_metadata(static_sl, h_q, 1)
        return flashmla.flash_mla_with_kvcache(q, k8, bt, static_sl, 512, meta, splits, is_fp8_kvcache=True)

    graph, (g_out, g_lse) = capture(step)
    assert flashmla.api._C.last_kernel() == "wgmma"
    check_replays(graph, g_out, g_lse, static_sl, cap,
                  lambda: flashmla.mla_decode_ref(q, flashmla.dequantize_kvcache(k8), bt, static_sl, 512),
                  page_tails=True)


@pytest.mark.parametrize("h_q,s_q,fp8", [(16, 1, False), (16, 2, False), (32, 1, False), (128, 2, False),
                                         (64, 1, True), (16, 1, True), (8, 2, True), (32, 1, True),
                                         (40, 1, True), (24, 2, True)])
def test_auto_kernel_choice(h_q, s_q, fp8, monkeypatch):
    """Without FLASHMLA_KERNEL the launcher picks swap-AB up to 32 rows (either cache), wgmma from
    _C.auto_wgmma_min_rows query rows per request on above that (BF16 cache: always; FP8 cache: from 33
    rows), and the default kernel otherwise (run() asserts which ran); results meet the tolerances."""
    need_kernel()
    monkeypatch.delenv("FLASHMLA_KERNEL", raising=False)
    lens = [4097, 0, 63, 1025, 1]
    q, kc, bt, sl = make_inputs(len(lens), lens, h_q, s_q, device=DEV, seed=h_q * s_q)
    kv = flashmla.quantize_kvcache(kc) if fp8 else kc
    out, lse = run(q, kv, bt, sl, causal=s_q > 1, fp8=fp8)
    check(out, lse, *(fp8_reference(q, kv, bt, sl, s_q > 1) if fp8 else flashmla.mla_decode_ref(q, kc, bt, sl, 512, causal=s_q > 1)))


@pytest.mark.parametrize("kernel_name", KERNELS)
def test_p_rounding_threshold(kernel_name, monkeypatch):
    """FLASHMLA_P_BF16_MIN_KEYS moves the switch between exact (hi/lo) and bf16 P: a huge threshold
    keeps P exact for every request (full tolerances at all lengths); 0 rounds P to bf16 everywhere,
    which changes the output of short requests (so the switch works) by no more than bf16 rounding
    of P can (cosine > 1 - 1e-5, 4e-3 abs + 2e-2 rel)."""
    need_kernel()
    monkeypatch.setenv("FLASHMLA_KERNEL", kernel_name)
    lens = [4097, 63, 1024, 0, 65, 1023]
    q, kc, bt, sl = make_inputs(len(lens), lens, 64, 1, device=DEV, seed=7)
    ro, rl = flashmla.mla_decode_ref(q, kc, bt, sl, 512)
    monkeypatch.setenv("FLASHMLA_P_BF16_MIN_KEYS", "1000000000")
    exact, lse = run(q, kc, bt, sl)
    check(exact, lse, ro, rl)
    monkeypatch.setenv("FLASHMLA_P_BF16_MIN_KEYS", "0")
    rounded, lse2 = run(q, kc, bt, sl)
    assert not torch.equal(rounded[1:3], exact[1:3])
    torch.testing.assert_close(rounded.float(), ro, atol=4e-3, rtol=2e-2)
    cos = torch.nn.functional.cosine_similarity(rounded.float().flatten(), ro.flatten(), dim=0)
    assert cos > 1 - 1e-5
    assert torch.equal(torch.isinf(lse2), torch.isinf(rl))


# ---- the swap-AB FP8 kernel (mla_decode_swapab_fp8.cu, auto or FLASHMLA_KERNEL=swapab, s_q * h_q <= 32:
# 1..16 rows run its NR = 16 instantiation, 17..32 rows its NR = 32 one; <= 16 under FLASHMLA_SWAPAB_MAX_ROWS=16)
SWAPAB_SWEEP = list(itertools.product([1, 7, 64], [1, 65, 4097], [(1, 1), (1, 2), (8, 1), (8, 2), (16, 1), (5, 3),
                                                                   (32, 1), (16, 2), (17, 1), (9, 3)]))


def swapab_default_rows(monkeypatch, rf="0"):
    """FLASHMLA_SWAPAB_MAX_ROWS unset: the swap-AB kernel takes up to 32 query rows (NR = 32 above 16); the FP8
    cache in its bf16-stage kernel (FLASHMLA_SWAPAB_RF=0) unless rf = "1" (the register-fed one, <= 32 rows)."""
    monkeypatch.delenv("FLASHMLA_SWAPAB_MAX_ROWS", raising=False)
    monkeypatch.setenv("FLASHMLA_SWAPAB_RF", rf)
    assert flashmla.api._C.auto_swapab_max_rows() == 32


def poison_fp8_tails(k8, bt, sl):
    """0xFF (NaN e4m3 values and NaN fp32 scales) in every cache slot of the requests' last pages
    past their lengths, beyond the NaN that make_inputs already put in the bf16 cache."""
    for b, L in enumerate(sl.tolist()):
        if L % 64:
            k8[bt[b, L // 64].item(), L % 64:] = 0xFF


@pytest.mark.parametrize("batch,seqlen,hs,rf", [c + ("0",) for c in SWAPAB_SWEEP] +
                         [c + ("1",) for c in SWAPAB_SWEEP if c[2][0] * c[2][1] <= RF_MAX_ROWS])
def test_fp8_swapab_sweep(batch, seqlen, hs, rf, monkeypatch):
    """FP8 cache under the swap-AB kernels (rf "0": bf16-stage; "1": register-fed, both tiles) vs the reference
    of the kernel that ran (the BF16 tolerances), ragged lengths incl. 0, 0xFF bytes (NaN values and scales) past
    every length, causal when s_q > 1."""
    need_kernel()
    h_q, s_q = hs
    monkeypatch.setenv("FLASHMLA_KERNEL", "swapab")
    swapab_default_rows(monkeypatch, rf=rf)
    seed = hash((batch, seqlen, h_q, s_q, "swapab_rf" if rf == "1" else "swapab")) % 10000
    rng = random.Random(seed)
    lens = [seqlen] + [rng.randint(0, seqlen) for _ in range(batch - 1)]
    q, kc, bt, sl = make_inputs(batch, lens, h_q, s_q, device=DEV, seed=seed)
    k8 = flashmla.quantize_kvcache(kc)
    poison_fp8_tails(k8, bt, sl)
    out, lse = run(q, k8, bt, sl, s_q > 1, fp8=True)
    check(out, lse, *fp8_reference(q, k8, bt, sl, causal=s_q > 1))


@pytest.mark.parametrize("h_q,s_q", [(16, 1), (8, 2), (3, 5), (1, 1), (32, 1), (16, 2), (11, 3), (8, 4)])
def test_fp8_swapab_matches_default_kernel(h_q, s_q, monkeypatch):
    """Swap-AB against the default kernel on one quantised cache: both sides of the exact-P
    threshold (1024 keys), page-aligned and 1/63-token tails (0xFF past them), a zero-length request
    (out 0, lse +inf) and a long request split over several parts (17..32 rows: NR = 32)."""
    need_kernel()
    swapab_default_rows(monkeypatch)
    lens = [4097, 0, 64, 1, 2000, 65, 1023, 130, 127, 30000]
    q, kc, bt, sl = make_inputs(len(lens), lens, h_q, s_q, device=DEV, seed=17 * h_q + s_q)
    k8 = flashmla.quantize_kvcache(kc)
    poison_fp8_tails(k8, bt, sl)
    ref = flashmla.mla_decode_ref(q, flashmla.dequantize_kvcache(k8), bt, sl, 512, causal=s_q > 1)
    o2, l2 = run_kernels(monkeypatch, ("default", "swapab"), q, k8, bt, sl, s_q, fp8=True, ref=ref)["swapab"]
    assert (o2[1] == 0).all() and torch.isposinf(l2[1]).all()


def test_fp8_swapab_falls_back(monkeypatch):
    """FLASHMLA_KERNEL=swapab with more than 32 query rows (more than 16 under the opt-out
    FLASHMLA_SWAPAB_MAX_ROWS=16) runs the default kernel, for an FP8 and a BF16 cache (run() asserts
    which ran) and meets the tolerances; a FLASHMLA_SWAPAB_MAX_ROWS other than 16 or 32 is an error."""
    need_kernel()
    monkeypatch.setenv("FLASHMLA_SWAPAB_RF", "0")  # the bf16-stage kernel (the register-fed one: below)
    monkeypatch.setenv("FLASHMLA_KERNEL", "swapab")
    monkeypatch.delenv("FLASHMLA_SWAPAB_MAX_ROWS", raising=False)
    lens = [300, 0, 65]
    for h_q, s_q, env in ((33, 1, None), (16, 3, None), (32, 1, "16"), (17, 1, "16")):
        if env:
            monkeypatch.setenv("FLASHMLA_SWAPAB_MAX_ROWS", env)
        q, kc, bt, sl = make_inputs(len(lens), lens, h_q, s_q, device=DEV, seed=2 + h_q)
        k8 = flashmla.quantize_kvcache(kc)
        check(*run(q, k8, bt, sl, s_q > 1, fp8=True),
              *flashmla.mla_decode_ref(q, flashmla.dequantize_kvcache(k8), bt, sl, 512, causal=s_q > 1))
        assert flashmla.api._C.last_kernel() == "default"
    monkeypatch.setenv("FLASHMLA_SWAPAB_MAX_ROWS", "24")
    meta, splits = flashmla.get_mla_metadata(sl, s_q * h_q, 1)
    with pytest.raises(RuntimeError, match="FLASHMLA_SWAPAB_MAX_ROWS must be 16 or 32"):
        flashmla.flash_mla_with_kvcache(q, k8, bt, sl, 512, meta, splits, causal=True, is_fp8_kvcache=True)
    monkeypatch.delenv("FLASHMLA_SWAPAB_MAX_ROWS")
    for h_q in (33, 16):
        q, kc, bt, sl = make_inputs(len(lens), lens, h_q, 1, device=DEV, seed=3)
        check(*run(q, kc, bt, sl), *flashmla.mla_decode_ref(q, kc, bt, sl, 512))
        assert flashmla.api._C.last_kernel() == ("default" if h_q > 32 else "swapab")


@pytest.mark.parametrize("rf", ["0", "1"])
def test_fp8_swapab_deterministic_and_poisoned_output_written(rf, monkeypatch):
    """Two calls of either swap-AB FP8 kernel (rf "0": bf16-stage, "1": register-fed) give bit-identical results,
    and a NaN-poisoned output is fully overwritten."""
    need_kernel()
    monkeypatch.setenv("FLASHMLA_SWAPAB_RF", rf)
    monkeypatch.setenv("FLASHMLA_KERNEL", "swapab")
    q, kc, bt, sl = make_inputs(12, [3000, 10, 0, 700, 64, 129] * 2, 16, 1, device=DEV, seed=4)
    k8 = flashmla.quantize_kvcache(kc)
    meta, splits = flashmla.get_mla_metadata(sl, 16, 1)
    outs = []
    for _ in range(2):
        junk = torch.full((1 << 22,), float("nan"), device=DEV)  # the output reuses this memory
        del junk
        out, lse = flashmla.flash_mla_with_kvcache(q, k8, bt, sl, 512, meta, splits, is_fp8_kvcache=True)
        assert flashmla.api._C.last_kernel() == ("swapab_rf" if rf == "1" else "swapab")
        assert not torch.isnan(out).any() and not torch.isnan(lse).any()
        outs.append((out.clone(), lse.clone()))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("h_q,s_q,rf", [(8, 2, "0"), (16, 2, "0"), (16, 1, "1"), (8, 2, "1"), (16, 2, "1")])
def test_fp8_swapab_cuda_graph_replay(h_q, s_q, rf, monkeypatch):
    """The swap-AB FP8 kernels (rf "0": bf16-stage, 32 rows: NR = 32; "1": register-fed) captured in a CUDA graph
    and replayed with new lengths (0, tails inside a page), each replay checked against its reference."""
    need_kernel()
    monkeypatch.setenv("FLASHMLA_KERNEL", "swapab")
    swapab_default_rows(monkeypatch, rf=rf)
    batch, cap = 6, 4160
    q, kc, bt, sl = make_inputs(batch, [cap] * batch, h_q, s_q, device=DEV, seed=13 + int(rf))
    k8 = flashmla.quantize_kvcache(kc)
    static_sl = sl.clone()

    def step():
        meta, splits = flashmla.get_mla_metadata(static_sl, s_q * h_q, 1)
        return flashmla.flash_mla_with_kvcache(q, k8, bt, static_sl, 512, meta, splits, causal=True,
                                               is_fp8_kvcache=True)

    graph, (g_out, g_lse) = capture(step)
    assert flashmla.api._C.last_kernel() == ("swapab_rf" if rf == "1" else "swapab")
    check_replays(graph, g_out, g_lse, static_sl, cap, lambda: fp8_reference(q, k8, bt, static_sl, causal=True),
                  page_tails=True)


@pytest.mark.parametrize("fp8", [True, False])
@pytest.mark.parametrize("h_q,s_q", [(32, 1), (16, 2), (24, 1), (16, 1)])
def test_fp8_swapab32_auto_selection_follows_env(h_q, s_q, fp8, monkeypatch):
    """Auto: 17..32 rows run swap-AB by default (FLASHMLA_SWAPAB_MAX_ROWS unset or 32) and, under the
    opt-out FLASHMLA_SWAPAB_MAX_ROWS=16, the mma.sync FP8 path (FP8 cache) or the wgmma kernel (BF16
    cache) (run() asserts which kernel ran from _C.auto_swapab_max_rows); <= 16 rows run swap-AB under
    every setting; all meet the tolerances."""
    need_kernel()
    monkeypatch.delenv("FLASHMLA_KERNEL", raising=False)
    lens = [2000, 0, 63, 129, 9000]
    q, kc, bt, sl = make_inputs(len(lens), lens, h_q, s_q, device=DEV, seed=31 + h_q * s_q)
    kv = flashmla.quantize_kvcache(kc) if fp8 else kc
    ran = []
    for env in (None, "32", "16"):
        if env:
            monkeypatch.setenv("FLASHMLA_SWAPAB_MAX_ROWS", env)
        else:
            monkeypatch.delenv("FLASHMLA_SWAPAB_MAX_ROWS", raising=False)
        out, lse = run(q, kv, bt, sl, s_q > 1, fp8=fp8)
        check(out, lse, *(fp8_reference(q, kv, bt, sl, s_q > 1) if fp8 else flashmla.mla_decode_ref(q, kc, bt, sl, 512, causal=s_q > 1)))
        ran.append(flashmla.api._C.last_kernel())
    sab = "swapab_rf" if fp8 else "swapab"
    assert ran == ([sab, sab, "default" if fp8 else "wgmma"] if h_q * s_q > 16 else [sab] * 3)


@pytest.mark.parametrize("rf", ["0", "1"])
def test_fp8_swapab_l2_prefetch_settings_agree(rf, monkeypatch):
    """FLASHMLA_L2_PREFETCH (0..4; unset: kSwapabL2Prefetch, or kSwapabRfL2Prefetch for the register-fed kernel)
    only moves data into L2 early: every setting gives bit-identical results, which meet the tolerances."""
    need_kernel()
    monkeypatch.setenv("FLASHMLA_SWAPAB_RF", rf)  # the bf16-stage kernel, then the register-fed one
    monkeypatch.setenv("FLASHMLA_KERNEL", "swapab")
    lens = [5000, 1, 0, 700, 64, 4160]
    q, kc, bt, sl = make_inputs(len(lens), lens, 16, 1, device=DEV, seed=21)
    k8 = flashmla.quantize_kvcache(kc)
    monkeypatch.delenv("FLASHMLA_L2_PREFETCH", raising=False)
    base = run(q, k8, bt, sl, fp8=True)
    check(*base, *fp8_reference(q, k8, bt, sl))
    for pf in ("0", "1", "2", "4"):
        monkeypatch.setenv("FLASHMLA_L2_PREFETCH", pf)
        out, lse = run(q, k8, bt, sl, fp8=True)
        assert torch.equal(out, base[0]) and torch.equal(lse, base[1]), pf


# ---- the swap-AB FP8 kernel with register-fed consumers (mla_decode_swapab_rf.cu; 1..32 rows, the default there;
# FLASHMLA_SWAPAB_RF=0 runs the bf16-stage kernel). It is exact in the e4m3 values and applies K's scales in fp32,
# V's in f16 relative to each page's largest: its oracle (flashmla.testing.rf_reference) takes K from the
# float32-dequantised cache and V from flashmla.testing.rf_values.


def rf_env(monkeypatch, kernel="swapab"):
    monkeypatch.setenv("FLASHMLA_KERNEL", kernel)
    swapab_default_rows(monkeypatch, rf="1")


def rf_data_case(h_q, s_q, data, seed, shape_seed):
    """Inputs of the register-fed kernel's data tests: 10 requests (tails of 1 and 63 tokens, a zero-length one at
    index 1, one long enough to split), shaped by shape_data, the FP8 cache with 0xFF bytes past every length.
    Returns (q, bf16 cache, FP8 cache, block_table, seqlens)."""
    lens = [4097, 0, 64, 1, 2000, 65, 1023, 130, 127, 30000]
    q, kc, bt, sl = make_inputs(len(lens), lens, h_q, s_q, device=DEV, seed=seed)
    q, kc = shape_data(q, kc, data, shape_seed)
    k8 = flashmla.quantize_kvcache(kc)
    poison_fp8_tails(k8, bt, sl)
    return q, kc, k8, bt, sl


@pytest.mark.parametrize("h_q,s_q", [(16, 1), (8, 2), (3, 5), (1, 1), (11, 1), (32, 1), (16, 2), (17, 1), (9, 3)])
@pytest.mark.parametrize("data", ["randn", "wide", "large_q", "small_q", "jumpy"])
def test_fp8_swapab_rf_data(h_q, s_q, data, monkeypatch):
    """Both tiles (16 and 32 rows), both sides of the exact-P threshold, tails of 1 and 63 tokens, a zero-length
    request and one split over several parts; tile scales over 5.5 decades (wide: V's f16 products relative to the
    page's largest scale), |Q| far above f16's range (large_q) and far below its normal range (small_q: Q scaled by
    2^-E, S by 2^E), page maxima jumping past the slack of the reference max (jumpy)."""
    need_kernel()
    rf_env(monkeypatch, "auto")
    if data == "jumpy":  # P exact (hi + lo) at every length: what is compared is the moving reference max, not the
        monkeypatch.setenv("FLASHMLA_P_BF16_MIN_KEYS", "100000")  # f16 rounding of a sharp softmax's P
    q, kc, k8, bt, sl = rf_data_case(h_q, s_q, data, 23 * h_q + s_q, 5)
    out, lse = run(q, k8, bt, sl, s_q > 1, fp8=True)
    ro, rl = rf_reference(q, k8, bt, sl, s_q > 1)
    unit = 1e-6 if data == "small_q" else 1.0
    check((out.float() * unit).to(out.dtype), lse, ro * unit, rl)
    assert (out[1] == 0).all() and torch.isposinf(lse[1]).all()


@pytest.mark.parametrize("h_q,s_q", [(16, 1), (8, 2), (3, 5), (1, 1), (32, 1), (17, 1), (9, 3)])
@pytest.mark.parametrize("data", ["randn", "wide", "large_q", "small_q", "jumpy"])
def test_fp8_swapab_rf_fp8_query(h_q, s_q, data, monkeypatch):
    """FLASHMLA_FP8_Q=1 (Q's NoPE part rounded to e4m3 per query row, S by FP8 wgmma) on the data of
    test_fp8_swapab_rf_data, against the reference on that Q (flashmla.testing.fp8_query) and the register-fed
    kernel's cache; the same tolerances but lse's (FP8_Q_LSE_TOL); and against the float32 reference on the
    unquantised cache, 1 - cosine within 3x the default's (Q bf16) + 5e-4 (H200: 1.9e-3 against 8.3e-4 at
    worst, large_q, sharper softmax)."""
    need_kernel()
    rf_env(monkeypatch, "auto")
    monkeypatch.setenv("FLASHMLA_FP8_Q", "1")
    if data == "jumpy":
        monkeypatch.setenv("FLASHMLA_P_BF16_MIN_KEYS", "100000")
    q, kc, k8, bt, sl = rf_data_case(h_q, s_q, data, 29 * h_q + s_q, 6)
    out, lse = run(q, k8, bt, sl, s_q > 1, fp8=True)
    ro, rl = rf_reference(q, k8, bt, sl, s_q > 1, fp8_q=True)
    unit = 1e-6 if data == "small_q" else 1.0
    check((out.float() * unit).to(out.dtype), lse, ro * unit, rl, lse_tol=FP8_Q_LSE_TOL)
    assert (out[1] == 0).all() and torch.isposinf(lse[1]).all()
    # against the unquantised cache, Q in e4m3 adds little to what the cache's own rounding costs (Q in bf16)
    exact, _ = flashmla.mla_decode_ref(q, kc, bt, sl, 512, causal=s_q > 1)
    monkeypatch.setenv("FLASHMLA_FP8_Q", "0")
    out_bf16q, _ = run(q, k8, bt, sl, s_q > 1, fp8=True)
    miss = [1 - torch.nn.functional.cosine_similarity(o.float().flatten(), exact.flatten(), dim=0).item()
            for o in (out, out_bf16q)]
    assert miss[0] < 3 * miss[1] + 5e-4, f"1 - cosine vs the unquantised cache: Q e4m3 {miss[0]}, bf16 {miss[1]}"
    monkeypatch.setenv("FLASHMLA_FP8_Q", "2")
    meta, splits = flashmla.get_mla_metadata(sl, s_q * h_q, 1)
    with pytest.raises(RuntimeError, match="FLASHMLA_FP8_Q must be 0 or 1"):
        flashmla.flash_mla_with_kvcache(q, k8, bt, sl, 512, meta, splits, is_fp8_kvcache=True)


def fp8_pv_env(monkeypatch, min_keys):
    """The register-fed kernel under auto with FLASHMLA_FP8_PV=1: e4m3 P^T for requests of at least min_keys keys
    (FLASHMLA_P_BF16_MIN_KEYS; "default": unset, 1024)."""
    rf_env(monkeypatch, "auto")
    monkeypatch.setenv("FLASHMLA_FP8_PV", "1")
    if min_keys == "default":
        monkeypatch.delenv("FLASHMLA_P_BF16_MIN_KEYS", raising=False)
    else:
        monkeypatch.setenv("FLASHMLA_P_BF16_MIN_KEYS", min_keys)


def pow2_fp8_case(lens, h_q, s_q, seed):
    """Inputs on which FLASHMLA_FP8_PV=1 rounds nothing (with softmax_scale = ln 2): Q's only nonzeros are -1, 0 or 1 in
    three NoPE columns of tile 0, where K holds -1, 0 or 1 at scale 1, so every logit is an integer in [-3, 3] and P
    a power of two in [2^-6, 2^6]; the other tiles' scales are 2^-1, 1 or 2 per token, so P times scale over sigma
    is an e4m3 value (>= 2^-8); V's e4m3 values otherwise randn rounded (of order 1: FP8 wgmma keeps ~13 mantissa
    bits of each page's sums, ~1e-4 here, within the absolute tolerance), RoPE random bf16 (Q's RoPE is 0); 0xFF (NaN
    values and scales) in every slot past the lengths. Returns (q, FP8 cache, block_table, seqlens)."""
    q, kc, bt, sl = make_inputs(len(lens), lens, h_q, s_q, device=DEV, seed=seed)
    g = torch.Generator(device=DEV).manual_seed(seed)
    nb = kc.shape[0]
    cols = torch.randperm(128, generator=g, device=DEV)[:3]
    qf = torch.zeros(q.shape, device=DEV)
    qf[..., cols] = torch.randint(-1, 2, (*q.shape[:-1], 3), generator=g, device=DEV).float()
    vals = torch.randn(nb, 64, 1, 512, generator=g, device=DEV)
    vals[..., cols] = torch.randint(-1, 2, (nb, 64, 1, 3), generator=g, device=DEV).float()
    scales = torch.pow(2.0, torch.randint(-1, 2, (nb, 64, 1, 4), generator=g, device=DEV).float())
    scales[..., 0] = 1.0
    rope = torch.randn(nb, 64, 1, 64, generator=g, device=DEV).to(torch.bfloat16)
    k8 = torch.cat([vals.to(torch.float8_e4m3fn).view(torch.uint8), scales.view(torch.uint8), rope.view(torch.uint8)], -1)
    k8[~live_slots(bt, sl, nb)] = 0xFF
    return qf.to(torch.bfloat16), k8.contiguous(), bt, sl


@pytest.mark.parametrize("h_q,s_q", [(16, 1), (8, 2), (1, 1), (11, 1), (3, 5), (17, 1)])
@pytest.mark.parametrize("fp8_q", ["0", "1"])
@pytest.mark.parametrize("min_keys", ["0", "default"])
def test_fp8_swapab_rf_fp8_pv_exact(h_q, s_q, fp8_q, min_keys, monkeypatch):
    """FLASHMLA_FP8_PV=1 (e4m3 P^T with the tile scales folded in, V's side by FP8 wgmma; 1..16 rows) on data it
    rounds nothing of (pow2_fp8_case): against the float32 reference on the dequantised cache at the issue's
    tolerances, so any slip in the four P^T planes' key order, a tile's sigma, the masks or the epilogue's columns
    shows. Every request in e4m3 (P_BF16_MIN_KEYS=0), or only those of >= 1024 keys beside exact f16 P (the default);
    tails of 1 and 63 tokens, a zero-length request, one split over several parts; 17 rows keep f16 P."""
    need_kernel()
    fp8_pv_env(monkeypatch, min_keys)
    monkeypatch.setenv("FLASHMLA_FP8_Q", fp8_q)
    lens = [4097, 0, 64, 1, 2000, 65, 1023, 130, 127, 30000]
    q, k8, bt, sl = pow2_fp8_case(lens, h_q, s_q, 31 * h_q + s_q)
    meta, splits = flashmla.get_mla_metadata(sl, s_q * h_q, 1)
    out, lse = flashmla.flash_mla_with_kvcache(q, k8, bt, sl, 512, meta, splits, softmax_scale=math.log(2),
                                               causal=s_q > 1, is_fp8_kvcache=True)
    assert flashmla.api._C.last_kernel() == "swapab_rf"
    ro, rl = flashmla.mla_decode_ref(q, flashmla.dequantize_kvcache(k8, torch.float32), bt, sl, 512,
                                     softmax_scale=math.log(2), causal=s_q > 1)
    check_decode(out, lse, ro, rl)
    assert (out[1] == 0).all() and torch.isposinf(lse[1]).all()


@pytest.mark.parametrize("h_q,s_q", [(16, 1), (8, 2)])
@pytest.mark.parametrize("min_keys", ["0", "default"])
def test_fp8_swapab_rf_fp8_pv_cuda_graph_replay(h_q, s_q, min_keys, monkeypatch):
    """FLASHMLA_FP8_PV=1 captured in a CUDA graph and replayed with new lengths (0, tails inside a page; under the
    default threshold the e4m3 / f16 choice of each request moves with its length, on the device), each replay against
    the float32 reference on data the e4m3 P^T rounds nothing of (pow2_fp8_case)."""
    need_kernel()
    fp8_pv_env(monkeypatch, min_keys)
    batch, cap = 6, 4160
    q, k8, bt, sl = pow2_fp8_case([cap] * batch, h_q, s_q, 41 + h_q)
    static_sl = sl.clone()

    def step():
        meta, splits = flashmla.get_mla_metadata(static_sl, s_q * h_q, 1)
        return flashmla.flash_mla_with_kvcache(q, k8, bt, static_sl, 512, meta, splits, softmax_scale=math.log(2),
                                               causal=True, is_fp8_kvcache=True)

    graph, (g_out, g_lse) = capture(step)
    assert flashmla.api._C.last_kernel() == "swapab_rf"
    kd = flashmla.dequantize_kvcache(k8, torch.float32)
    check_replays(graph, g_out, g_lse, static_sl, cap,
                  lambda: flashmla.mla_decode_ref(q, kd, bt, static_sl, 512, softmax_scale=math.log(2), causal=True),
                  page_tails=True)


@pytest.mark.parametrize("h_q,s_q", [(16, 1), (8, 2), (1, 1), (3, 5)])
@pytest.mark.parametrize("data", ["randn", "wide", "jumpy"])
def test_fp8_swapab_rf_fp8_pv_accuracy(h_q, s_q, data, monkeypatch):
    """FLASHMLA_FP8_PV=1 on the data of test_fp8_swapab_rf_data, every request in e4m3 P^T: lse to 1e-5 as by default
    (l sums P unrounded); out against the float32 reference on the dequantised cache within what rounding P times
    scale over sigma to 3 mantissa bits allows (relative error <= 2^-4 each, ~2.5 % rms): ||out - ref|| < 0.05
    ||ref|| and 1 - cosine < 2e-3 (measured: flashmla/benchmarks/fp8_query_accuracy.py, BENCHMARKS.md)."""
    need_kernel()
    fp8_pv_env(monkeypatch, "0")
    q, kc, k8, bt, sl = rf_data_case(h_q, s_q, data, 37 * h_q + s_q, 7)
    out, lse = run(q, k8, bt, sl, s_q > 1, fp8=True)
    ro, rl = flashmla.mla_decode_ref(q, flashmla.dequantize_kvcache(k8, torch.float32), bt, sl, 512, causal=s_q > 1)
    o = out.float()
    assert torch.equal(torch.isnan(o), torch.isnan(ro)) and torch.equal(torch.isposinf(lse), torch.isposinf(rl))
    fin = torch.isfinite(rl)
    assert ((lse[fin] - rl[fin]).abs() / rl[fin].abs().clamp_min(1.0)).max() < 1e-5
    rel = ((o - ro).norm() / ro.norm()).item()
    cos = torch.nn.functional.cosine_similarity(o.flatten().double(), ro.flatten().double(), dim=0).item()
    assert rel < 0.05 and 1 - cos < 2e-3, f"||out - ref|| / ||ref|| {rel}, 1 - cosine {1 - cos}"
    assert (out[1] == 0).all()
    monkeypatch.setenv("FLASHMLA_FP8_PV", "2")
    meta, splits = flashmla.get_mla_metadata(sl, s_q * h_q, 1)
    with pytest.raises(RuntimeError, match="FLASHMLA_FP8_PV must be 0 or 1"):
        flashmla.flash_mla_with_kvcache(q, k8, bt, sl, 512, meta, splits, is_fp8_kvcache=True)


def test_fp8_swapab_rf_applies_only_to_fp8_up_to_32_rows(monkeypatch):
    """The register-fed kernel runs the FP8 cache at 1..32 rows and leaves every BF16 case to the swap-AB kernel
    (33 FP8 rows, beyond swap-AB, to the default one, as 17 under FLASHMLA_SWAPAB_MAX_ROWS=16; run() asserts which
    ran); a value other than 0 or 1 is an error, raised before anything is launched."""
    need_kernel()
    rf_env(monkeypatch)
    lens = [300, 0, 65]
    for h_q, fp8, ran in ((17, True, "swapab_rf"), (32, True, "swapab_rf"), (33, True, "default"), (16, False, "swapab")):
        q, kc, bt, sl = make_inputs(len(lens), lens, h_q, 1, device=DEV, seed=5 + h_q)
        kv = flashmla.quantize_kvcache(kc) if fp8 else kc
        out, lse = run(q, kv, bt, sl, fp8=fp8)
        check(out, lse, *(fp8_reference(q, kv, bt, sl) if fp8 else flashmla.mla_decode_ref(q, kc, bt, sl, 512)))
        assert flashmla.api._C.last_kernel() == ran
    monkeypatch.setenv("FLASHMLA_SWAPAB_RF", "2")
    meta, splits = flashmla.get_mla_metadata(sl, 16, 1)
    with pytest.raises(RuntimeError, match="FLASHMLA_SWAPAB_RF must be 0 or 1"):
        flashmla.flash_mla_with_kvcache(q, kc, bt, sl, 512, meta, splits)
    monkeypatch.setenv("FLASHMLA_SWAPAB_RF", "1")
    monkeypatch.setenv("FLASHMLA_SWAPAB_MAX_ROWS", "16")  # 17..32 rows leave swap-AB, register-fed included
    q, kc, bt, sl = make_inputs(len(lens), lens, 17, 1, device=DEV, seed=7)
    k8 = flashmla.quantize_kvcache(kc)
    check(*run(q, k8, bt, sl, fp8=True), *fp8_reference(q, k8, bt, sl))
    assert flashmla.api._C.last_kernel() == "default"
