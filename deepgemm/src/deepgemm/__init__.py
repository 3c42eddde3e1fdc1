"""deepgemm: FP8 (and BF16) GEMMs with fine-grained scaling for Hopper, JIT-compiled at run time.
API-compatible with DeepSeek's DeepGEMM: `import deepgemm as deep_gemm`."""
from ._version import __version__

# configs
from .utils import (
    ceil_div, set_num_sms, get_num_sms, get_tma_aligned_size,
    get_m_alignment_for_contiguous_layout, get_mk_alignment_for_contiguous_layout,
)

# layouts
from .utils import get_mn_major_tma_aligned_tensor, get_col_major_tma_aligned_tensor

# FP8 casts
from .utils import per_token_cast_to_fp8, per_block_cast_to_fp8

# dense GEMMs
from .gemm import fp8_gemm_nt, bf16_gemm_nt

# M-grouped GEMMs (MoE)
from .gemm import (
    m_grouped_fp8_gemm_nt_contiguous, m_grouped_fp8_gemm_nt_masked,
    m_grouped_bf16_gemm_nt_contiguous, m_grouped_bf16_gemm_nt_masked,
)

# first-release names
from .gemm import (
    gemm_fp8_fp8_bf16_nt, m_grouped_gemm_fp8_fp8_bf16_nt_contiguous, m_grouped_gemm_fp8_fp8_bf16_nt_masked,
)

# testing
from .ref import calc_diff
from . import testing
