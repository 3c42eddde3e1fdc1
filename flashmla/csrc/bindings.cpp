// pybind11 module flashmla._C: thin wrappers taking raw device pointers, sizes and a stream handle.
// The Python layer validates every tensor before anything here is called.
#include <pybind11/pybind11.h>
#include <stdexcept>
#include <string>

#include "launch.h"

namespace py = pybind11;

#ifdef FLASHMLA_WITH_CUDA
static void check(const char* err, const char* what) {
  if (err) throw std::runtime_error(std::string("flashmla: ") + what + " failed: " + err);
}
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "flashmla native kernels";
#ifdef FLASHMLA_WITH_CUDA
  m.def("with_cuda", []() { return true; });
  m.def("fp8_kernel", []() { return flashmla::fp8_kernel_built(); });
  m.def("last_kernel", []() { return std::string(flashmla::last_kernel()); });
  m.def("auto_wgmma_min_rows", [](bool is_fp8) { return is_fp8 ? flashmla::kFp8WgmmaMinRows : flashmla::kAutoWgmmaMinRows; });
  m.def("auto_swapab_max_rows", []() { return flashmla::swapab_max_rows(); });
  m.def("mla_metadata", [](int64_t seqlens, int batch, int parts, int64_t meta, int64_t num_splits, int seg_ovh,
                           int64_t stream) {
    check(flashmla::launch_mla_metadata(reinterpret_cast<const int*>(seqlens), batch, parts,
                                        reinterpret_cast<int*>(meta), reinterpret_cast<int*>(num_splits), seg_ovh,
                                        reinterpret_cast<void*>(stream)),
          "get_mla_metadata kernel");
  });
  m.def("mla_decode", [](int64_t q, int64_t kcache, int64_t k_stride, int64_t num_blocks, int is_fp8, int64_t bt,
                         int64_t bt_stride, int max_blocks, int64_t seqlens, int64_t meta, int parts,
                         int64_t num_splits, int64_t out, int64_t lse, int64_t oacc, int64_t lacc,
                         int batch, int s_q, int h_q, float scale, int causal, int64_t stream) {
    flashmla::DecodeArgs a;
    a.q = reinterpret_cast<const void*>(q);
    a.kcache = reinterpret_cast<const void*>(kcache);
    a.kcache_block_stride = k_stride;
    a.num_blocks = num_blocks;
    a.is_fp8 = is_fp8;
    a.block_table = reinterpret_cast<const int*>(bt);
    a.bt_stride = bt_stride;
    a.max_blocks = max_blocks;
    a.seqlens = reinterpret_cast<const int*>(seqlens);
    a.meta = reinterpret_cast<const int*>(meta);
    a.parts = parts;
    a.num_splits = reinterpret_cast<const int*>(num_splits);
    a.out = reinterpret_cast<void*>(out);
    a.lse = reinterpret_cast<float*>(lse);
    a.oacc = reinterpret_cast<float*>(oacc);
    a.lacc = reinterpret_cast<float*>(lacc);
    a.batch = batch;
    a.s_q = s_q;
    a.h_q = h_q;
    a.softmax_scale = scale;
    a.causal = causal;
    check(flashmla::launch_mla_decode(a, reinterpret_cast<void*>(stream)), "flash_mla_with_kvcache kernel");
  });
#else
  m.def("with_cuda", []() { return false; });
  m.def("fp8_kernel", []() { return false; });
  m.def("last_kernel", []() { return std::string(); });
  m.def("auto_wgmma_min_rows", [](bool is_fp8) { return is_fp8 ? flashmla::kFp8WgmmaMinRows : flashmla::kAutoWgmmaMinRows; });
  m.def("auto_swapab_max_rows", []() { return flashmla::swapab_max_rows(); });
#endif
}
