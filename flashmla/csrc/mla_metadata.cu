// get_mla_metadata on the device: the tile scheduler of ref.schedule_ref, computed by one block so
// that it runs inside CUDA graphs without a host sync. (The opt-in per-segment cost model,
// FLASHMLA_SPLIT_OVH, is mla_metadata_segments_kernel at the end.)
//
// Request b costs ceil(L_b / 64) + OVH pages; the cost line (total T) is cut at x_p = ceil(p T / P).
// A cut at offset o inside request b lands on page max(0, o - OVH) of b. Cuts with page > 0 split a
// request; each distinct one adds one split. Outputs:
//   meta[p]       = (b0, k0, b1, k1, first_split, 0, 0, 0)   part p covers [(b0,k0), (b1,k1))
//   num_splits[b] = b + #internal cuts in requests < b       (prefix of splits per request)
#include <cuda_runtime.h>

#include "launch.h"

namespace flashmla {
namespace {

constexpr int OVH = 5;         // must equal ref.FIXED_OVERHEAD
constexpr int THREADS = 1024;
constexpr int MAX_PARTS = 1024;

__device__ __forceinline__ bool lex_le(int b, int k, int b2, int k2) { return b < b2 || (b == b2 && k <= k2); }

__global__ void __launch_bounds__(THREADS) mla_metadata_kernel(const int* __restrict__ seqlens, int batch,
                                                               int parts, int* cum, int* meta, int* num_splits) {
  __shared__ int warp_sums[THREADS / 32];
  __shared__ int carry_s;
  __shared__ int cb[MAX_PARTS + 1], ck[MAX_PARTS + 1], ib[MAX_PARTS + 1], ik[MAX_PARTS + 1];
  __shared__ int nint_s;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) carry_s = 0;
  __syncthreads();

  // 1) cum = exclusive prefix sum of the costs, chunk by chunk
  for (int base = 0; base < batch; base += THREADS) {
    const int i = base + tid;
    const int c = i < batch ? (max(seqlens[i], 0) + 63) / 64 + OVH : 0;
    int x = c;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      int y = __shfl_up_sync(0xffffffffu, x, d);
      if (lane >= d) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
      int w = warp_sums[lane];
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, w, d);
        if (lane >= d) w += y;
      }
      warp_sums[lane] = w;  // inclusive over warps
    }
    __syncthreads();
    const int incl = x + (warp > 0 ? warp_sums[warp - 1] : 0) + carry_s;
    if (i < batch) cum[i] = incl - c;
    __syncthreads();
    if (tid == THREADS - 1) carry_s = incl;
    __syncthreads();
  }
  const int total = carry_s;
  if (tid == 0) cum[batch] = total;
  __syncthreads();

  // 2) the cut positions
  for (int p = tid; p <= parts; p += THREADS) {
    const int x = (int)(((long long)p * total + parts - 1) / parts);
    if (x >= total) {
      cb[p] = batch;
      ck[p] = 0;
    } else {
      int lo = 0, hi = batch - 1;  // largest b with cum[b] <= x
      while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (cum[mid] <= x) lo = mid; else hi = mid - 1;
      }
      cb[p] = lo;
      ck[p] = max(0, x - cum[lo] - OVH);
    }
  }
  __syncthreads();

  // 3) distinct internal cuts, in order (parts is small: one thread)
  if (tid == 0) {
    int n = 0;
    for (int p = 0; p <= parts; ++p) {
      if (ck[p] > 0 && (n == 0 || ib[n - 1] != cb[p] || ik[n - 1] != ck[p])) {
        ib[n] = cb[p];
        ik[n] = ck[p];
        ++n;
      }
    }
    nint_s = n;
  }
  __syncthreads();
  const int nint = nint_s;

  // 4) metadata rows: first split = b0 + #internal cuts <= (b0, k0)
  for (int p = tid; p < parts; p += THREADS) {
    const int b0 = cb[p], k0 = ck[p];
    int lo = 0, hi = nint;  // first index with cut > (b0, k0)
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (lex_le(ib[mid], ik[mid], b0, k0)) lo = mid + 1; else hi = mid;
    }
    int* row = meta + p * 8;
    row[0] = b0; row[1] = k0; row[2] = cb[p + 1]; row[3] = ck[p + 1];
    row[4] = b0 + lo; row[5] = 0; row[6] = 0; row[7] = 0;
  }
  // 5) num_splits[b] = b + #internal cuts in requests < b
  for (int b = tid; b <= batch; b += THREADS) {
    int lo = 0, hi = nint;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (ib[mid] < b) lo = mid + 1; else hi = mid;
    }
    num_splits[b] = b + lo;
  }
}

// ---- FLASHMLA_SPLIT_OVH=c: every segment costs c pages (ref.schedule_segments_ref, same integers).
// Greedy fill of the parts in request order up to a budget of pages + c per segment; the budget is
// the smallest that places every request, one of the 2c + 2 candidates from max(ceil(T/P), c) on
// (T = sum of pages + c), each tested by its own thread; thread 0 then writes the schedule.
__device__ __forceinline__ int pages_of(const int* seqlens, int b) { return (max(seqlens[b], 0) + 63) / 64; }

__device__ bool fill_fits(const int* seqlens, int batch, int parts, int c, int budget) {
  int b = 0, k = 0;
  for (int p = 0; p < parts && b < batch; ++p) {
    int room = budget;
    while (b < batch) {
      const int need = pages_of(seqlens, b) - k + c;
      if (room >= need) {
        room -= need;
        ++b;
        k = 0;
      } else {
        if (room - c >= 1) k += room - c;
        break;
      }
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
  if (tid < 2 * c + 2 && fill_fits(seqlens, batch, parts, c, static_cast<int>(lo) + tid))
    atomicMin(&budget_s, static_cast<int>(lo) + tid);
  __syncthreads();
  if (tid != 0) return;
  const int budget = budget_s;  // always found: lo + 2c fits (see ref.segment_budget)
  int b = 0, k = 0, seg = 0, pre = 0;  // position, segments of b so far, splits prefix of b
  num_splits[0] = 0;
  for (int p = 0; p < parts; ++p) {
    const int b0 = b, k0 = k, first = pre + seg;
    int room = budget;
    while (b < batch) {
      const int need = pages_of(seqlens, b) - k + c;
      if (room >= need) {  // the rest of request b: its last segment
        room -= need;
        pre += seg + 1;
        num_splits[++b] = pre;
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
    int* row = meta + p * 8;
    row[0] = b0; row[1] = k0; row[2] = b; row[3] = k;
    row[4] = (b0 == b && k0 == k) ? 0 : first; row[5] = 0; row[6] = 0; row[7] = 0;
  }
}

}  // namespace

const char* launch_mla_metadata(const int* seqlens, int batch, int parts, int* cum, int* meta,
                                int* num_splits, int seg_ovh, void* stream) {
  if (parts < 1 || parts > MAX_PARTS) return "num_sm_parts out of range [1, 1024]";
  if (seg_ovh > kMaxSegOverhead) return "FLASHMLA_SPLIT_OVH must be 0..255 (pages per segment)";
  if (seg_ovh >= 0)
    mla_metadata_segments_kernel<<<1, THREADS, 0, static_cast<cudaStream_t>(stream)>>>(seqlens, batch, parts, seg_ovh,
                                                                                       meta, num_splits);
  else
    mla_metadata_kernel<<<1, THREADS, 0, static_cast<cudaStream_t>(stream)>>>(seqlens, batch, parts, cum, meta,
                                                                            num_splits);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace flashmla
