// Host launchers of the CUDA kernels (defined in the .cu files, called from bindings.cpp).
#pragma once
#include <cstdint>

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
};

// FLASHMLA_KERNEL unset or 'auto': the wgmma kernel runs from this many query rows (s_q * h_q) per
// request on, for a BF16 cache and for the FP8 cache. The FP8 value is the one-line switch for the
// FP8 wgmma kernel (mla_decode_wgmma_fp8.cu): "never" until it has been measured on a GPU; set it to 1
// (or 32) to make it the FP8 default. The GPU tests read both through _C.auto_wgmma_min_rows.
constexpr int kAutoWgmmaMinRows = 32;
constexpr int kFp8WgmmaMinRows = 1 << 30;

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
const char* launch_mla_metadata(const int* seqlens, int batch, int parts, int* cum, int* meta,
                                int* num_splits, void* stream);
bool fp8_kernel_built();
const char* last_kernel();  // "default" or "wgmma": the main kernel of the last launch_mla_decode

}  // namespace flashmla
