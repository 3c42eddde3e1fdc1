// Issue rate of the instructions a register-fed FP8 consumer would run per value (H200 probe):
// e4m3x2 -> f16x2 conversion, f16x2 multiply, byte permute, fp32 FMA. Each thread runs 8 independent
// chains; the kernel reports SM clocks per warp-instruction per SM sub-partition.
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -o /tmp/op_rate flashmla/benchmarks/op_rate.cu && /tmp/op_rate
#include <cstdio>
#include <cuda_fp16.h>
constexpr int ITERS = 4096, CHAINS = 8;
template <int OP>
__global__ void probe(unsigned* out, long long* clk, unsigned seed) {
  unsigned r[CHAINS];
#pragma unroll
  for (int c = 0; c < CHAINS; ++c) r[c] = seed * (threadIdx.x + 1) + c * 0x01010101u;
  __syncthreads();
  long long t0 = clock64();
  for (int i = 0; i < ITERS; ++i) {
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) {
      if constexpr (OP == 0) {  // cvt.rn.f16x2.e4m3x2 (low 16 bits in, 32 bits out)
        unsigned short lo = (unsigned short)(r[c] ^ i);
        asm volatile("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r[c]) : "h"(lo));
      } else if constexpr (OP == 1) {  // HMUL2
        asm volatile("mul.rn.f16x2 %0, %0, %1;" : "+r"(r[c]) : "r"(0x3c013c01u));
      } else if constexpr (OP == 2) {  // PRMT
        asm volatile("prmt.b32 %0, %0, %1, 0x5140;" : "+r"(r[c]) : "r"(r[(c + 1) % CHAINS]));
      } else {  // FFMA
        float f = __uint_as_float(r[c]);
        asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(f) : "f"(1.0001f), "f"(0.5f));
        r[c] = __float_as_uint(f);
      }
    }
  }
  long long t1 = clock64();
  unsigned acc = 0;
#pragma unroll
  for (int c = 0; c < CHAINS; ++c) acc ^= r[c];
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  if (threadIdx.x == 0) clk[blockIdx.x] = t1 - t0;
}
template <int OP>
void run(const char* name, int threads) {
  unsigned* out; long long* clk;
  cudaMalloc(&out, 132 * 1024 * 4); cudaMalloc(&clk, 132 * 8);
  probe<OP><<<132, threads>>>(out, clk, 3);
  probe<OP><<<132, threads>>>(out, clk, 5);
  cudaDeviceSynchronize();
  long long h[132]; cudaMemcpy(h, clk, sizeof(h), cudaMemcpyDeviceToHost);
  double mean = 0; for (int i = 0; i < 132; ++i) mean += h[i] / 132.0;
  const double warp_instr_per_smsp = (double)ITERS * CHAINS * threads / 32 / 4;
  printf("%-28s threads/SM %4d: %.3f clocks per warp-instruction per sub-partition (%.1f lanes/clk/SM)\n", name,
         threads, mean / warp_instr_per_smsp, 4 * 32 * warp_instr_per_smsp / mean);
  cudaFree(out); cudaFree(clk);
}
int main() {
  for (int t : {256, 512, 1024}) {
    run<0>("cvt.rn.f16x2.e4m3x2", t);
    run<1>("mul.rn.f16x2", t);
    run<2>("prmt.b32", t);
    run<3>("fma.rn.f32", t);
  }
  return 0;
}
