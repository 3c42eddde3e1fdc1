// What compute-sanitizer's racecheck makes of the ordering the BF16 wgmma kernel uses for its alpha and 1/l slots
// (wgmma_common.cuh): a writer warp fills slot i & 1 and arrives on a named barrier, a reader warp syncs on it and
// reads; the writer may refill the slot two rounds later only after the reader's mbarrier arrival on "empty" has
// let a producer thread arrive on "full" (in the kernel: the producer's TMA load of the next page into that stage).
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo -I flashmla/csrc -o /tmp/rcp flashmla/benchmarks/racecheck_pattern.cu
//   for m in 0 1 2 4 5 6 7 8 3; do compute-sanitizer --tool racecheck /tmp/rcp $m; done
// mode 0: the writer's refill waits on a second named barrier the reader arrives on (control, race-free);
// mode 1: the refill waits on "full", which the producer arrives on after the reader's "empty" (the kernel's chain);
// mode 2: as 1, the producer's arrival an arrive.expect_tx completed by a bulk copy (the kernel's TMA);
// mode 4: as 2, with the writer arriving on "empty" too (64 arrivals), as both consumer warpgroups do in the kernel;
// mode 5: as 4, the producer's load a 2-D tensor-map TMA copy (cp.async.bulk.tensor, as the kernel's pages);
// mode 6: as 5, the producer warp's other lanes returning at the start (the kernel's producer warpgroup does);
// mode 3: the refill waits for nothing (a real race: racecheck must report it);
// mode 7: as 5, with the kernel's named barriers before session 28: the hand-over alternates between two ids by
//   round parity (P_FULL0 = 1, P_FULL1 = 4), the reader arrives on a third (P_EMPTY = 2) after each round and the
//   writer syncs on it before each round but the first and once at the end (the kernel's short, hi/lo requests);
//   then one more slot (1/l) handed over on id 3 (EPI0);
// mode 8: as 7 without P_EMPTY (its long requests). Session 28 replaced P_EMPTY by an mbarrier.
// Modes 0-6 give each round's hand-over a named barrier of its own (ids 1..8; mode 0's refill barriers 9..14), so
// that a writer running ahead (mode 3) never arrives twice on one barrier.
#include <cstdio>
#include "wgmma_common.cuh"

using namespace flashmla;
constexpr int ROUNDS = 8;

__global__ void pattern(int mode, const float* src, float* out, const __grid_constant__ CUtensorMap map) {
  __shared__ float slot[2][32], inv[32];
  __shared__ alignas(128) float landing[2][32];
  __shared__ alignas(8) uint64_t full[2], empty[2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t uFull = static_cast<uint32_t>(__cvta_generic_to_shared(full));
  const uint32_t uEmpty = static_cast<uint32_t>(__cvta_generic_to_shared(empty));
  const uint32_t uLand = static_cast<uint32_t>(__cvta_generic_to_shared(landing));
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; ++s) mbar_init(uFull + 8 * s, 1), mbar_init(uEmpty + 8 * s, mode >= 4 ? 64 : 32);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (mode == 6 && warp == 2 && lane != 0) return;
  float acc = 0.f;
  const bool kernel_ids = mode >= 7, p_empty = mode == 7;
  for (int i = 0; i < ROUNDS; ++i) {
    const int s = i & 1, hand_over = kernel_ids ? (s ? 4 : 1) : 1 + i;
    if (warp == 0) {  // writer
      if (mode == 0 && i >= 2) bar_sync(7 + i, 64);
      const bool chain = mode == 1 || mode == 2 || mode >= 4;
      if (chain && i >= 2) mbar_wait(uFull + 8 * s, ((i >> 1) - 1) & 1);
      if (p_empty && i >= 1) bar_sync(2, 64);
      slot[s][lane] = static_cast<float>(i + lane);
      bar_arrive(hand_over, 64);
      if (mode >= 4) mbar_arrive(uEmpty + 8 * s);
    } else if (warp == 1) {  // reader
      bar_sync(hand_over, 64);
      acc += slot[s][lane];
      if (p_empty) bar_arrive(2, 64);
      if (mode == 0 && i + 2 < ROUNDS) bar_arrive(9 + i, 64);
      if (mode == 1 || mode == 2 || mode >= 4) mbar_arrive(uEmpty + 8 * s);
    } else if (lane == 0 && (mode == 1 || mode == 2 || mode >= 4) && i + 2 < ROUNDS) {  // producer: releases round i + 2
      mbar_wait(uEmpty + 8 * s, (i >> 1) & 1);
      if (mode == 1) {
        mbar_arrive(uFull + 8 * s);
      } else if (mode <= 4) {
        mbar_expect_tx(uFull + 8 * s, 16);
        bulk_copy(uLand + 128 * s, src, 16, uFull + 8 * s);
      } else {  // one 128-byte row of the 4 x 64 bf16 tensor map
        mbar_expect_tx(uFull + 8 * s, 128);
        tma_load_2d(uLand + 128 * s, &map, 0, i & 3, uFull + 8 * s);
      }
    }
  }
  if (kernel_ids && warp == 0) {
    if (p_empty) bar_sync(2, 64);
    inv[lane] = 1.f;
    bar_arrive(3, 64);
  } else if (kernel_ids && warp == 1) {
    bar_sync(3, 64);
    acc *= inv[lane];
  }
  if (warp == 1) out[lane] = acc;
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : 1;
  float *src, *out;
  cudaMalloc(&src, 512);
  cudaMalloc(&out, 128);
  cudaMemset(src, 0, 512);
  CUtensorMap map;
  if (!make_map(&map, src, 64, 128, 4, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 64, CU_TENSOR_MAP_SWIZZLE_NONE, 1)) {
    printf("tensor map encoding failed\n");
    return 1;
  }
  pattern<<<1, 96>>>(mode, src, out, map);
  float h[32];
  cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
  const cudaError_t e = cudaGetLastError();
  float want = 0.f;
  for (int i = 0; i < ROUNDS; ++i) want += static_cast<float>(i);
  printf("mode %d: %s, lane 0 sum %.0f (expected %.0f)\n", mode, cudaGetErrorString(e), h[0], want);
  return e != cudaSuccess;
}
