// get_mla_metadata on the device: the tile scheduler of ref.schedule_ref, computed by one block so
// that it runs inside CUDA graphs without a host sync.
//
// Every segment (a request, or the piece of one that a part holds) costs its pages plus c (5 by
// default, FLASHMLA_SPLIT_OVH=c). Outputs:
//   meta[p]       = (b0, k0, b1, k1, first_split, 0, 0, 0)   part p covers [(b0,k0), (b1,k1)); an
//                   empty part has b0 = b1 = batch, k0 = k1 = 0, first_split = 0
//   num_splits[b] = segments of the requests < b               (prefix of splits per request)
#include <cuda_runtime.h>

#include "launch.h"

namespace flashmla {
namespace {

constexpr int THREADS = 1024;
constexpr int MAX_PARTS = 1024;

// Every segment costs c pages beside its own (ref.schedule_ref, same integers).
// Greedy fill of the parts in request order up to a budget of pages + c per segment; the budget is
// the smallest that places every request, one of the 2c + 2 candidates from max(ceil(T/P), c) on
// (T = sum of pages + c), each tested by its own thread (WRITE = false); thread 0 then writes the
// schedule with the same walk (WRITE = true).
__device__ __forceinline__ int pages_of(const int* seqlens, int b) { return (max(seqlens[b], 0) + 63) / 64; }

// Returns whether every request was placed; WRITE: fills meta (every part) and num_splits.
template <bool WRITE>
__device__ bool greedy_fill(const int* seqlens, int batch, int parts, int c, int budget, int* meta, int* num_splits) {
  int b = 0, k = 0, seg = 0, pre = 0;  // position, segments of b so far, splits prefix of b
  if (WRITE) num_splits[0] = 0;
  for (int p = 0; p < parts && (WRITE || b < batch); ++p) {
    const int b0 = b, k0 = k, first = pre + seg;
    int room = budget;
    while (b < batch) {
      const int need = pages_of(seqlens, b) - k + c;
      if (room >= need) {  // the rest of request b: its last segment
        room -= need;
        pre += seg + 1;
        ++b;
        if (WRITE) num_splits[b] = pre;
        k = 0;
        seg = 0;
      } else {
        if (room - c >= 1) {  // a piece of b
          k += room - c;
          ++seg;
        }
        break;
      }
    }
    if (WRITE) {
      int* row = meta + p * 8;
      row[0] = b0; row[1] = k0; row[2] = b; row[3] = k;
      row[4] = (b0 == b && k0 == k) ? 0 : first; row[5] = 0; row[6] = 0; row[7] = 0;
    }
  }
  return b == batch;
}

__global__ void __launch_bounds__(THREADS) mla_metadata_segments_kernel(const int* __restrict__ seqlens, int batch,
                                                                        int parts, int c, int* meta, int* num_splits) {
  __shared__ long long total_s;
  __shared__ int budget_s;
  const int tid = threadIdx.x;
  if (tid == 0) {
    total_s = 0;
    budget_s = 0x7fffffff;
  }
  __syncthreads();
  long long part = 0;
  for (int b = tid; b < batch; b += THREADS) part += pages_of(seqlens, b) + c;
  atomicAdd(reinterpret_cast<unsigned long long*>(&total_s), static_cast<unsigned long long>(part));
  __syncthreads();
  const long long lo = max((total_s + parts - 1) / parts, static_cast<long long>(c));
  if (tid < 2 * c + 2 && greedy_fill<false>(seqlens, batch, parts, c, static_cast<int>(lo) + tid, nullptr, nullptr))
    atomicMin(&budget_s, static_cast<int>(lo) + tid);
  __syncthreads();
  if (tid == 0) greedy_fill<true>(seqlens, batch, parts, c, budget_s, meta, num_splits);  // lo + 2c always fits
}

}  // namespace

const char* launch_mla_metadata(const int* seqlens, int batch, int parts, int* meta, int* num_splits, int seg_ovh,
                                void* stream) {
  if (parts < 1 || parts > MAX_PARTS) return "num_sm_parts out of range [1, 1024]";
  if (seg_ovh < 0 || seg_ovh > kMaxSegOverhead) return "FLASHMLA_SPLIT_OVH must be 0..255 (pages per segment)";
  mla_metadata_segments_kernel<<<1, THREADS, 0, static_cast<cudaStream_t>(stream)>>>(seqlens, batch, parts, seg_ovh,
                                                                                     meta, num_splits);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace flashmla
