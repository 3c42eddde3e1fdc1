// Tensor-core issue rate of the small-N wgmma shapes the swap-AB kernels run (H200 probe): SM clocks per wgmma
// and FMA per clock per SM, one or two warpgroups per SM issuing back to back (operand values do not matter).
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -o /tmp/wgmma_rate flashmla/benchmarks/wgmma_rate.cu && /tmp/wgmma_rate
#include <cstdint>
#include <cstdio>
constexpr int ITERS = 2048, PER_GROUP = 8;

// B (and A in SS mode): K-major, no swizzle, 8x16-byte core matrices; the probe's smem is zeroed
__device__ __forceinline__ uint64_t desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (8ull << 16) | (16ull << 32);
}

#define ACC8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define ACC16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define OUT8(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#define OUT16(d) OUT8(d), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])

template <int V>
struct Shape;
// name, accumulator registers, FMA per wgmma
#define SHAPE(V, NAME, NACC, FMA) \
  template <>                     \
  struct Shape<V> {               \
    static constexpr const char* name = NAME; \
    static constexpr int acc = NACC;          \
    static constexpr long fma = FMA;          \
  };
SHAPE(0, "bf16 m64n16k16 RS", 8, 64 * 16 * 16)
SHAPE(1, "bf16 m64n16k16 SS", 8, 64 * 16 * 16)
SHAPE(2, "bf16 m64n32k16 SS", 16, 64 * 32 * 16)
SHAPE(3, "e4m3 m64n16k32 SS", 8, 64 * 16 * 32)
SHAPE(4, "e4m3 m64n16k32 RS", 8, 64 * 16 * 32)
SHAPE(5, "e4m3 m64n32k32 SS", 16, 64 * 32 * 32)
SHAPE(6, "e4m3 m64n32k32 RS", 16, 64 * 32 * 32)
SHAPE(7, "bf16 m64n32k16 RS", 16, 64 * 32 * 16)

template <int V>
__device__ __forceinline__ void issue(float* d, const uint32_t (&a)[4], uint64_t da, uint64_t db) {
  if constexpr (V == 0)
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " ACC8 ", {%8, %9, %10, %11}, %12, 1, 1, 1, 0;\n"
                 : OUT8(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
  else if constexpr (V == 1)
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " ACC8 ", %8, %9, 1, 1, 1, 0, 0;\n"
                 : OUT8(d) : "l"(da), "l"(db));
  else if constexpr (V == 2)
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " ACC16 ", %16, %17, 1, 1, 1, 0, 0;\n"
                 : OUT16(d) : "l"(da), "l"(db));
  else if constexpr (V == 3)
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 " ACC8 ", %8, %9, 1, 1, 1;\n"
                 : OUT8(d) : "l"(da), "l"(db));
  else if constexpr (V == 4)
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 " ACC8 ", {%8, %9, %10, %11}, %12, 1, 1, 1;\n"
                 : OUT8(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
  else if constexpr (V == 5)
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 " ACC16 ", %16, %17, 1, 1, 1;\n"
                 : OUT16(d) : "l"(da), "l"(db));
  else if constexpr (V == 6)
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 " ACC16 ", {%16, %17, %18, %19}, %20, 1, 1, 1;\n"
                 : OUT16(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
  else
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " ACC16 ", {%16, %17, %18, %19}, %20, 1, 1, 1, 0;\n"
                 : OUT16(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

template <int V>
__global__ void probe(float* out, long long* clk) {
  __shared__ __align__(1024) uint8_t smem[16384];
  for (int i = threadIdx.x; i < 4096; i += blockDim.x) reinterpret_cast<uint32_t*>(smem)[i] = 0;
  __syncthreads();
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint64_t da = desc(base), db = desc(base + 8192);
  const uint32_t a[4] = {0x3c003c00u ^ threadIdx.x, 0, 0, 0};
  float d[2][Shape<V>::acc] = {};
  long long t0 = clock64();
  for (int i = 0; i < ITERS; ++i) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int j = 0; j < PER_GROUP; ++j) issue<V>(d[j & 1], a, da, db);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  __syncthreads();
  long long t1 = clock64();
  float s = 0;
#pragma unroll
  for (int c = 0; c < 2; ++c)
#pragma unroll
    for (int k = 0; k < Shape<V>::acc; ++k) s += d[c][k];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) clk[blockIdx.x] = t1 - t0;
}

template <int V>
void run(int warpgroups) {
  float* out; long long* clk;
  cudaMalloc(&out, 132 * 256 * 4); cudaMalloc(&clk, 132 * 8);
  for (int rep = 0; rep < 2; ++rep) probe<V><<<132, 128 * warpgroups>>>(out, clk);
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) { printf("%s: %s\n", Shape<V>::name, cudaGetErrorString(e)); return; }
  long long h[132]; cudaMemcpy(h, clk, sizeof(h), cudaMemcpyDeviceToHost);
  double mean = 0; for (int i = 0; i < 132; ++i) mean += h[i] / 132.0;
  const double wgmmas = (double)ITERS * PER_GROUP * warpgroups;
  printf("%-20s warpgroups/SM %d: %6.2f clocks per wgmma per SM, %6.1f FMA/clk/SM\n", Shape<V>::name, warpgroups,
         mean / wgmmas, wgmmas * Shape<V>::fma / mean);
  cudaFree(out); cudaFree(clk);
}
int main() {
  for (int wg : {1, 2}) {
    run<0>(wg); run<7>(wg); run<1>(wg); run<2>(wg); run<3>(wg); run<4>(wg); run<5>(wg); run<6>(wg);
  }
  return 0;
}
