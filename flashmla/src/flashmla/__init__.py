"""flashmla: MLA decoding attention over a paged KV cache (FlashMLA's API), Hopper CUDA kernel + PyTorch reference."""
from ._version import __version__

# scheduling
from .api import get_mla_metadata

# decoding attention
from .api import flash_mla_with_kvcache

# FP8 KV cache helpers
from .quant import quantize_kvcache, dequantize_kvcache

# reference (the oracle, also the CPU path)
from .ref import mla_decode_ref

from .api import cuda_available

__all__ = ["__version__", "get_mla_metadata", "flash_mla_with_kvcache", "quantize_kvcache",
           "dequantize_kvcache", "mla_decode_ref", "cuda_available"]
