"""CPU tests of the public API: shapes, dtypes, reference dispatch, bad input, custom ops."""
import pytest
import torch

import flashmla
from flashmla.testing import make_inputs


def _call(q, kc, bt, sl, **kw):
    meta, splits = flashmla.get_mla_metadata(sl, q.shape[1] * q.shape[2] // kc.shape[2], kc.shape[2])
    return flashmla.flash_mla_with_kvcache(q, kc, bt, sl, 512, meta, splits, **kw)


def test_version_and_exports():
    assert flashmla.__version__.count(".") == 2
    for name in ("get_mla_metadata", "flash_mla_with_kvcache", "quantize_kvcache", "dequantize_kvcache"):
        assert callable(getattr(flashmla, name))


@pytest.mark.parametrize("s_q,h_q,causal", [(1, 16, False), (2, 8, True)])
def test_cpu_path_shapes_and_values(s_q, h_q, causal):
    lens = [0, 65, 130]
    q, kc, bt, sl = make_inputs(3, lens, h_q, s_q, seed=11)
    meta, splits = flashmla.get_mla_metadata(sl, s_q * h_q, 1)
    assert meta.dtype == torch.int32 and meta.shape == (132, 8)
    assert splits.dtype == torch.int32 and splits.shape == (4,)
    out, lse = flashmla.flash_mla_with_kvcache(q, kc, bt, sl, 512, meta, splits, causal=causal)
    assert out.shape == (3, s_q, h_q, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (3, h_q, s_q) and lse.dtype == torch.float32
    ro, rl = flashmla.mla_decode_ref(q, kc, bt, sl, 512, causal=causal)
    assert torch.allclose(out.float(), ro, atol=8e-4, rtol=2e-2)
    assert torch.equal(lse, rl)
    assert (out[0] == 0).all() and torch.isposinf(lse[0]).all()


def test_fp8_cpu_path_matches_dequantised_reference():
    q, kc, bt, sl = make_inputs(2, [70, 200], 16, 1, seed=5, poison=False)
    kq = flashmla.quantize_kvcache(kc)
    out, lse = _call(q, kq, bt, sl, is_fp8_kvcache=True)
    ro, rl = flashmla.mla_decode_ref(q, flashmla.dequantize_kvcache(kq), bt, sl, 512)
    assert torch.allclose(out.float(), ro, atol=8e-4, rtol=2e-2) and torch.allclose(lse, rl)
    exact, _ = flashmla.mla_decode_ref(q, kc, bt, sl, 512)
    cos = torch.nn.functional.cosine_similarity(out.float().flatten(), exact.flatten(), dim=0)
    assert cos > 0.999


def _good():
    return make_inputs(2, [100, 10], 16, 1, seed=3)


def _bad_cases():
    q, kc, bt, sl = _good()
    meta, splits = flashmla.get_mla_metadata(sl, 16, 1)
    base = dict(q=q, k_cache=kc, block_table=bt, cache_seqlens=sl, head_dim_v=512,
                tile_scheduler_metadata=meta, num_splits=splits)
    yield "q", TypeError, dict(base, q=q.float())
    yield "q", ValueError, dict(base, q=q[0])
    yield "q", ValueError, dict(base, q=torch.randn(2, 2, 16, 576).to(torch.bfloat16)[:, :1])
    yield "k_cache", TypeError, dict(base, k_cache=kc.half())
    yield "k_cache", ValueError, dict(base, k_cache=kc.view(-1, 32, 1, 576))
    yield "k_cache", ValueError, dict(base, k_cache=kc[..., :512].contiguous())
    yield "k_cache", ValueError, dict(base, k_cache=kc.repeat(1, 1, 3, 1))
    yield "block_table", TypeError, dict(base, block_table=bt.long())
    yield "block_table", ValueError, dict(base, block_table=bt[:1])
    yield "cache_seqlens", TypeError, dict(base, cache_seqlens=sl.long())
    yield "cache_seqlens", ValueError, dict(base, cache_seqlens=torch.tensor([100, 64 * bt.shape[1] + 1], dtype=torch.int32))
    yield "cache_seqlens", ValueError, dict(base, cache_seqlens=torch.tensor([100, -1], dtype=torch.int32))
    yield "tile_scheduler_metadata", ValueError, dict(base, tile_scheduler_metadata=meta[:, :4])
    yield "num_splits", ValueError, dict(base, num_splits=splits[:2])
    yield "head_dim_v", ValueError, dict(base, head_dim_v=600)
    yield "k_cache", TypeError, dict(base, is_fp8_kvcache=True)
    yield "softmax_scale", ValueError, dict(base, softmax_scale=float("nan"))
    yield "q", TypeError, dict(base, q=[1, 2])


@pytest.mark.parametrize("case", list(_bad_cases()), ids=lambda c: c[0])
def test_bad_input_raises_clear_error(case):
    name, exc, kw = case
    with pytest.raises(exc, match=name):
        flashmla.flash_mla_with_kvcache(**kw)


def test_seqlen_check_once_per_unchanged_tensor(monkeypatch):
    """The value check of cache_seqlens (a host sync on the GPU) runs once for a tensor that does not change between
    calls (the layers of a decode step) and again after an in-place write, for a new tensor with the same values,
    and for a block table of smaller capacity; a write that breaks the bound is caught."""
    q, kc, bt, sl = _good()
    meta, splits = flashmla.get_mla_metadata(sl, 16, 1)
    checks = []
    aminmax = torch.aminmax
    monkeypatch.setattr(torch, "aminmax", lambda t: checks.append(t) or aminmax(t))
    call = lambda s, b=bt: flashmla.flash_mla_with_kvcache(q, kc, b, s, 512, meta, splits)
    for _ in range(3):
        call(sl)
    assert len(checks) == 1
    call(sl.clone())
    assert len(checks) == 2
    call(sl)
    assert len(checks) == 3
    call(sl, torch.cat([bt, bt], 1))                      # larger capacity: the check of the smaller still holds
    assert len(checks) == 3
    call(sl, bt[:, :2])                                   # smaller capacity (128 keys, lengths 100 and 10)
    assert len(checks) == 4
    sl[1] = 64 * bt.shape[1] + 1                          # in place: the version counter moves
    with pytest.raises(ValueError, match="cache_seqlens"):
        call(sl)
    with pytest.raises(ValueError, match="cache_seqlens"):
        call(sl)                                          # a tensor that failed is never taken as checked
    with torch.inference_mode():                          # inference tensors: no version counter, checked each call
        sl_inf = sl.clone()
        sl_inf[1] = 10
        for n in range(2):
            call(sl_inf)
        assert len(checks) == 8
        sl_inf[1] = 64 * bt.shape[1] + 1
        with pytest.raises(ValueError, match="cache_seqlens"):
            call(sl_inf)


def test_auto_swapab_max_rows_follows_env(monkeypatch):
    """_C.auto_swapab_max_rows() reads FLASHMLA_SWAPAB_MAX_ROWS at each call: unset, empty or 32 -> 32
    (the default: swap-AB up to 32 FP8 rows), 16 -> 16 (the opt-out), anything else -> -1 (the
    launcher rejects it)."""
    c = flashmla.api._C
    if c is None:
        pytest.skip("flashmla._C not built")
    for env, want in ((None, 32), ("16", 16), ("32", 32), ("24", -1), ("320", -1), ("", 32), ("1", -1), ("3", -1)):
        if env is None:
            monkeypatch.delenv("FLASHMLA_SWAPAB_MAX_ROWS", raising=False)
        else:
            monkeypatch.setenv("FLASHMLA_SWAPAB_MAX_ROWS", env)
        assert c.auto_swapab_max_rows() == want, env


def test_metadata_bad_input():
    with pytest.raises(ValueError, match="cache_seqlens"):
        flashmla.get_mla_metadata(torch.zeros(3, dtype=torch.int64), 16, 1)
    with pytest.raises(ValueError, match="num_heads_k"):
        flashmla.get_mla_metadata(torch.zeros(3, dtype=torch.int32), 16, 0)
    with pytest.raises(TypeError, match="cache_seqlens"):
        flashmla.get_mla_metadata([1, 2], 16, 1)


def test_custom_ops_opcheck_and_compile():
    q, kc, bt, sl = make_inputs(2, [100, 0], 16, 2, seed=9)
    meta, splits = flashmla.get_mla_metadata(sl, 32, 1)
    torch.library.opcheck(torch.ops.flashmla.get_mla_metadata.default, (sl, 32, 1))
    torch.library.opcheck(torch.ops.flashmla.mla_decode.default,
                          (q, kc, bt, sl, 512, meta, splits, 576 ** -0.5, True, False),
                          test_utils=("test_schema", "test_faketensor"))

    def step(q, kc, bt, sl):
        m, s = torch.ops.flashmla.get_mla_metadata(sl, 32, 1)
        return torch.ops.flashmla.mla_decode(q, kc, bt, sl, 512, m, s, 576 ** -0.5, True, False)

    out, lse = torch.compile(step, backend="aot_eager", fullgraph=True)(q, kc, bt, sl)
    ro, rl = flashmla.mla_decode_ref(q, kc, bt, sl, 512, causal=True)
    assert torch.allclose(out.float(), ro, atol=8e-4, rtol=2e-2)
    assert torch.equal(torch.isinf(lse), torch.isinf(rl))


def test_main_cpu(capsys):
    from flashmla.__main__ import main
    assert main(["--cpu", "--batch", "2", "--seqlen", "150", "--heads", "16", "--s-q", "2", "--causal"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("summary: backend=CPU result=ok")
