// deepgemm._C: build information only. The GEMM kernels live as CUDA headers in
// src/deepgemm/include and are compiled at run time (NVRTC or nvcc) by deepgemm.jit.
#include <pybind11/pybind11.h>

static bool with_cuda() {
#ifdef DEEPGEMM_WITH_CUDA
  return true;
#else
  return false;
#endif
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "deepgemm build information (kernels are JIT-compiled at run time)";
  m.def("with_cuda", &with_cuda, "True if a CUDA compiler was found when the package was built");
}
