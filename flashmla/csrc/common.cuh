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
// A CTA's scheduler part, row blockIdx.y of get_mla_metadata's table: requests b0..b1 from page k0 of b0 up to page
// k1 of b1 (exclusive), the split slot of its first split request, and the last request it touches.
struct Part {
  int b0, k0, b1, k1, first, last;
};
// Fills p from the table; false when the part is empty (the CTA has nothing to do).
__device__ __forceinline__ bool load_part(const int* table, int batch, Part& p) {
  const int* meta = table + blockIdx.y * 8;
  p.b0 = meta[0], p.k0 = meta[1], p.b1 = meta[2], p.k1 = meta[3], p.first = meta[4];
  if (p.b0 < 0 || p.b0 >= batch || p.b1 > batch || p.first < 0 || (p.b0 == p.b1 && p.k0 == p.k1)) return false;
  p.last = p.k1 > 0 ? p.b1 : p.b1 - 1;
  return true;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

}  // namespace flashmla
