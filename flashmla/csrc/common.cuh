// Constants and small device helpers shared by the decode kernels (mla_decode.cu, mla_decode_wgmma.cu).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace flashmla {

constexpr int D_QK = 576, D_V = 512, PAGE = 64;  // head dims (K/Q, V) and tokens per page
constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;
#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

}  // namespace flashmla
