// Host launchers of the CUDA kernels (defined in the .cu files, called from bindings.cpp).
#pragma once
#include <cstdint>
#include <cstdlib>

namespace flashmla {

struct DecodeArgs {
  const void* q;            // bf16 [batch, s_q, h_q, 576], contiguous
  const void* kcache;       // bf16 [num_blocks, 64, 1, 576] or uint8 [num_blocks, 64, 1, 656]
  int64_t kcache_block_stride;  // elements (bf16) or bytes (fp8) between pages
  int64_t num_blocks;       // pages in kcache (bounds of the TMA tensor map)
  int is_fp8;
  const int* block_table;   // int32 [batch, max_blocks], row stride bt_stride
  int64_t bt_stride;
  int max_blocks;
  const int* seqlens;       // int32 [batch]
  const int* meta;          // int32 [parts, 8]
  int parts;
  const int* num_splits;    // int32 [batch + 1]
  void* out;                // bf16 [batch, s_q, h_q, 512]
  float* lse;               // fp32 [batch, h_q, s_q]
  float* oacc;              // fp32 [batch + parts, s_q*h_q, 512]  split partials
  float* lacc;              // fp32 [batch + parts, s_q*h_q]
  int batch, s_q, h_q;
  float softmax_scale;
  int causal;
  int p_bf16_min_keys;      // wgmma kernel: requests with at least this many keys round P to bf16
  int l2_prefetch_pages;    // BF16 wgmma producer: L2 prefetch distance ahead of its TMA loads (0: off)
  int wg1_cols;             // BF16 wgmma kernel: O columns of consumer WG1 (128 or 256 of 512)
  int fp8_f16;              // FP8 wgmma kernel: f16 consumers (FLASHMLA_FP8_F16=1, opt-in)
  int fp8_q;                // register-fed swap-AB kernel: Q's NoPE part in e4m3, S by FP8 wgmma (FLASHMLA_FP8_Q=1)
  int fp8_pv;               // register-fed swap-AB kernel, 1..16 rows: e4m3 P^T, V by FP8 wgmma (FLASHMLA_FP8_PV=1)
};

// FLASHMLA_KERNEL unset or 'auto': the wgmma kernel runs from this many query rows (s_q * h_q) per
// request on, for a BF16 cache and for the FP8 cache, where the swap-AB kernel does not (it takes up
// to swapab_max_rows() rows of either cache). BF16: every row count above swap-AB's (measured on the
// H200: its TMA stream beats the mma.sync kernel even at 16 rows, padded to its 64-row tile). FP8 cache:
// from 33 rows, above the swap-AB kernel's 32 (H200, session 14: the FP8 wgmma kernel is 2.6x the
// mma.sync FP8 path at 40-56 rows, 0.78-0.82x vs 0.30x the BF16 cache; 1.7-2.0x before at 64-128).
// The GPU tests read both via _C.auto_wgmma_min_rows.
constexpr int kAutoWgmmaMinRows = 1;
constexpr int kFp8WgmmaMinRows = 33;
// BF16 wgmma kernel defaults of FLASHMLA_L2_PREFETCH and FLASHMLA_WGMMA_SPLIT (mla_decode.cu), from
// an A/B run on the H200 (BENCHMARKS.md): a bulk L2 prefetch 3 pages ahead cost 30% on memory-bound
// shapes (132 CTAs x 5 pages of 72 KiB in flight crowd the L2), so it is off; WG1 owning 128 of
// the 512 O columns is 0-6% faster than an even split on compute-bound shapes, equal elsewhere.
constexpr int kWgmmaL2Prefetch = 0;
constexpr int kWgmmaWg1Cols = 128;
// Swap-AB FP8 kernel: L2 bulk prefetch distance in pages when FLASHMLA_L2_PREFETCH is unset (its
// chunk ring keeps only 4 (16 rows) or 3 (32 rows) x 10.25 KiB of copies in flight per SM; H200 A/B,
// sessions 12 and 15: 2 and 0 within 1-3 %, 4 slower by up to 8 %).
constexpr int kSwapabL2Prefetch = 2;
// Register-fed swap-AB kernel (FP8, 1..32 rows): its ring keeps 4 whole pages (164 KiB) in flight per SM, and
// prefetching ahead of them only crowds the L2 (H200, session 24: distance 0 1.00-1.06x distance 2, 4 0.87-0.92x).
constexpr int kSwapabRfL2Prefetch = 0;
// FLASHMLA_KERNEL unset or 'auto': the swap-AB kernel up to this many query rows, 1..16 rows in its
// 16-row instantiation, 17..32 in its 32-row one (wgmma m64n32k16). FP8 cache, H200 (BENCHMARKS.md,
// session 15): 1.20-1.29x the BF16 cache at 8-16 rows; 0.98-1.03x at 24/32 rows, where the mma.sync FP8
// path it replaced ran at 0.60-0.64x. BF16 cache (session 22): 0.98-1.23x the BF16 wgmma kernel.
constexpr int kSwapabMaxRows = 32;
// FLASHMLA_SWAPAB_MAX_ROWS: unset or 32: kSwapabMaxRows; 16 (opt-out): 17..32 rows go back to the
// mma.sync FP8 path (FP8 cache) or the wgmma kernel (BF16 cache) under auto, to the default kernel
// under FLASHMLA_KERNEL=swapab. Any other value: swapab_max_rows()
// returns -1 (launch_mla_decode reports it).
inline int swapab_max_rows() {
  const char* v = std::getenv("FLASHMLA_SWAPAB_MAX_ROWS");
  if (!v || !v[0] || (v[0] == '3' && v[1] == '2' && !v[2])) return kSwapabMaxRows;
  return v[0] == '1' && v[1] == '6' && !v[2] ? 16 : -1;
}

// Returns a CUDA error string, or nullptr on success.
const char* launch_mla_decode(const DecodeArgs& a, void* stream);
// Main kernel of the wgmma variant only (BF16 cache); returns a cudaError_t value, or -1 without
// launching anything when the tensors do not suit TMA (FP8 cache, pages not back to back, pointers
// not 16-byte aligned): the caller then runs the default kernel. The caller (launch_mla_decode)
// runs the shared combine kernel after it.
int launch_mla_decode_wgmma(const DecodeArgs& a, void* stream);
// The same for the FP8 cache (mla_decode_wgmma_fp8.cu): -1 without launching when a.is_fp8 is
// false, the pages are not back to back or the pointers are not 16-byte aligned.
int launch_mla_decode_wgmma_fp8(const DecodeArgs& a, void* stream);
// Swap-AB kernel for few query rows, FP8 or BF16 cache (mla_decode_swapab_fp8.cu, auto or
// FLASHMLA_KERNEL=swapab): -1 without launching when s_q * h_q > max_rows (16 or 32: swapab_max_rows()),
// the pages are not back to back or the pointers are not 16-byte aligned.
int launch_mla_decode_swapab(const DecodeArgs& a, void* stream, int max_rows);
// Swap-AB FP8 kernel with register-fed consumers (mla_decode_swapab_rf.cu; where the swap-AB kernel runs, unless
// FLASHMLA_SWAPAB_RF=0): -1 without launching unless the cache is FP8, s_q * h_q <= 32, the pages are back to back
// and the pointers 16-byte aligned.
int launch_mla_decode_swapab_rf(const DecodeArgs& a, void* stream);
// get_mla_metadata's scheduler (ref.schedule_ref): every segment costs seg_ovh pages beside its
// own, 0..kMaxSegOverhead (api.py passes 5, or FLASHMLA_SPLIT_OVH)
constexpr int kMaxSegOverhead = 255;
const char* launch_mla_metadata(const int* seqlens, int batch, int parts, int* meta, int* num_splits, int seg_ovh,
                                void* stream);
bool fp8_kernel_built();
const char* last_kernel();  // "default", "wgmma" or "swapab": the main kernel of the last launch_mla_decode

}  // namespace flashmla
