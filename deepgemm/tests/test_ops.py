"""torch.library custom ops: schema/fake-impl checks and torch.compile tracing (CPU)."""
import torch

import deepgemm as dg
from generators import rand

# test_schema compares fp8 tensors with ops torch lacks for float8; the rest run.
UTILS = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")


def _args(m=32, n=64, k=128):
    a, sa = dg.per_token_cast_to_fp8(rand((m, k), 1, "cpu"))
    b, sb = dg.per_block_cast_to_fp8(rand((n, k), 2, "cpu"))
    return a, dg.get_mn_major_tma_aligned_tensor(sa), b, sb, torch.empty(m, n, dtype=torch.bfloat16)


def test_opcheck_gemm_nt():
    a, sa, b, sb, d = _args()
    torch.library.opcheck(torch.ops.deepgemm.gemm_nt.default, (a, sa, b, sb, d, None), test_utils=UTILS)
    c = torch.randn(32, 64)
    torch.library.opcheck(torch.ops.deepgemm.gemm_nt.default, (a, sa, b, sb, torch.empty(32, 64), c), test_utils=UTILS)


def test_opcheck_grouped():
    g, m, n, k = 2, 16, 64, 128
    a, sa = dg.per_token_cast_to_fp8(rand((g, m, k), 3, "cpu"))
    b, sb = dg.per_block_cast_to_fp8(rand((g, n, k), 4, "cpu"))
    d = torch.zeros(g, m, n, dtype=torch.bfloat16)
    mm = torch.tensor([16, 3], dtype=torch.int32)
    torch.library.opcheck(torch.ops.deepgemm.m_grouped_gemm_nt_masked.default,
                          (a, dg.get_mn_major_tma_aligned_tensor(sa), b, sb, d, mm, 8), test_utils=UTILS)
    a2, sa2 = dg.per_token_cast_to_fp8(rand((256, k), 5, "cpu"))
    idx = dg.testing.make_contiguous_m_indices([100, 128])
    torch.library.opcheck(torch.ops.deepgemm.m_grouped_gemm_nt_contiguous.default,
                          (a2, dg.get_mn_major_tma_aligned_tensor(sa2), b, sb, torch.zeros(256, n, dtype=torch.bfloat16),
                           idx), test_utils=UTILS)


def test_torch_compile_fullgraph():
    m, n, k = 32, 64, 256
    x, y = rand((m, k), 6, "cpu"), rand((n, k), 7, "cpu")
    a, b = dg.per_token_cast_to_fp8(x), dg.per_block_cast_to_fp8(y)

    def f(a0, a1, b0, b1):
        d = torch.empty(m, n, dtype=torch.bfloat16)
        dg.fp8_gemm_nt((a0, a1), (b0, b1), d)
        return d.float() * 2

    eager = f(*a, *b)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(*a, *b)
    assert torch.equal(eager, compiled)
