// pybind11 bindings: numpy arrays in and out; the Python layer (eplb/planner.py) validates inputs.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>

#include "planner.h"

namespace py = pybind11;
using F64 = py::array_t<double, py::array::c_style | py::array::forcecast>;
using I64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

static py::tuple rebalance(F64 weight, int64_t num_replicas, int64_t num_groups, int64_t num_nodes,
                           int64_t num_gpus, bool refine, bool spread, double migration_tolerance,
                           std::optional<I64> previous) {
  int64_t L = weight.shape(0), E = weight.shape(1), R = num_replicas;
  I64 phy2log({L, R}), rank({L, R}), logcnt({L, E});
  eplb::Options opt{refine, spread, migration_tolerance};
  const int64_t* prev = previous ? previous->data() : nullptr;
  const double* w = weight.data();
  int64_t *p = phy2log.mutable_data(), *r = rank.mutable_data(), *c = logcnt.mutable_data();
  {
    py::gil_scoped_release nogil;
    eplb::rebalance(w, L, E, R, num_groups, num_nodes, num_gpus, opt, prev, p, r, c);
  }
  // log2phy [L, E, max replicas]: slot of replica r of expert e, -1 past logcnt
  int64_t width = 1;
  for (int64_t i = 0; i < L * E; ++i) width = std::max(width, c[i]);
  I64 log2phy({L, E, width});
  int64_t* q = log2phy.mutable_data();
  std::fill(q, q + L * E * width, -1);
  for (int64_t l = 0; l < L; ++l)
    for (int64_t i = 0; i < R; ++i) q[(l * E + p[l * R + i]) * width + r[l * R + i]] = i;
  return py::make_tuple(phy2log, log2phy, logcnt);
}

static I64 redistribute(I64 phy2log, I64 tokens, int64_t num_gpus) {
  int64_t L = phy2log.shape(0), R = phy2log.shape(1), E = tokens.shape(1);
  I64 out({L, R});
  const int64_t *p = phy2log.data(), *t = tokens.data();
  int64_t* o = out.mutable_data();
  {
    py::gil_scoped_release nogil;
    eplb::redistribute(p, t, L, E, R, num_gpus, o);
  }
  return out;
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "eplb C++ core (CPU)";
  m.def("rebalance", &rebalance, py::arg("weight"), py::arg("num_replicas"), py::arg("num_groups"),
        py::arg("num_nodes"), py::arg("num_gpus"), py::arg("refine") = false,
        py::arg("spread") = false, py::arg("migration_tolerance") = 0.0,
        py::arg("previous") = py::none());
  m.def("redistribute", &redistribute, py::arg("phy2log"), py::arg("tokens"), py::arg("num_gpus"));
  m.def("with_cuda", [] { return false; });
}
