// pybind11 bindings of the native partitioner: smallpond._C
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "hash_partition.h"

namespace py = pybind11;
using smallpond::ColKind;
using smallpond::Column;

namespace {

// Columns arrive as tuples (kind, width, offset, validity|None, data, offsets|None) of objects that
// expose the buffer protocol (pyarrow.Buffer, numpy arrays). Views stay alive in `keep`.
std::vector<Column> unpack(const py::list& cols, std::vector<std::unique_ptr<py::buffer_info>>& keep) {
  std::vector<Column> out;
  auto ptr = [&](py::handle h) -> const uint8_t* {
    if (h.is_none()) return nullptr;
    keep.push_back(std::make_unique<py::buffer_info>(py::reinterpret_borrow<py::buffer>(h).request()));
    return static_cast<const uint8_t*>(keep.back()->ptr);
  };
  for (py::handle item : cols) {
    py::tuple t = py::reinterpret_borrow<py::tuple>(item);
    if (t.size() != 6) throw py::value_error("columns: each column must be a 6-tuple");
    Column c;
    int kind = t[0].cast<int>();
    if (kind < 0 || kind > 5) throw py::value_error("columns: kind must be in [0, 5], got " + std::to_string(kind));
    c.kind = static_cast<ColKind>(kind);
    c.width = t[1].cast<int>();
    c.offset = t[2].cast<int64_t>();
    c.validity = ptr(t[3]);
    c.data = ptr(t[4]);
    c.offsets = ptr(t[5]);
    if (c.data == nullptr) throw py::value_error("columns: data buffer is None");
    bool needs_offsets = c.kind == ColKind::Binary || c.kind == ColKind::LargeBinary;
    if (needs_offsets && c.offsets == nullptr) throw py::value_error("columns: binary column without offsets");
    if (!needs_offsets && c.width <= 0) throw py::value_error("columns: width must be positive");
    out.push_back(c);
  }
  return out;
}

py::array_t<uint64_t> hash_columns(const py::list& cols, int64_t nrows) {
  if (nrows < 0) throw py::value_error("nrows must be >= 0, got " + std::to_string(nrows));
  std::vector<std::unique_ptr<py::buffer_info>> keep;
  auto columns = unpack(cols, keep);
  if (columns.empty()) throw py::value_error("columns: at least one key column is required");
  py::array_t<uint64_t> out(nrows);
  uint64_t* o = out.mutable_data();
  {
    py::gil_scoped_release nogil;
    smallpond::hash_rows(columns, nrows, o);
  }
  return out;
}

py::tuple hash_partition(const py::list& cols, int64_t nrows, int64_t npartitions) {
  if (npartitions < 1 || npartitions > (1LL << 31))
    throw py::value_error("npartitions must be in [1, 2^31], got " + std::to_string(npartitions));
  if (nrows < 0) throw py::value_error("nrows must be >= 0, got " + std::to_string(nrows));
  std::vector<std::unique_ptr<py::buffer_info>> keep;
  auto columns = unpack(cols, keep);
  if (columns.empty()) throw py::value_error("columns: at least one key column is required");
  py::array_t<int64_t> indices(nrows), offsets(npartitions + 1);
  int64_t* idx = indices.mutable_data();
  int64_t* off = offsets.mutable_data();
  {
    py::gil_scoped_release nogil;
    std::vector<uint64_t> h(static_cast<size_t>(nrows));
    smallpond::hash_rows(columns, nrows, h.data());
    std::vector<uint32_t> b(static_cast<size_t>(nrows));
    uint32_t n = static_cast<uint32_t>(npartitions);
    for (int64_t r = 0; r < nrows; ++r) b[r] = smallpond::bucket_of(h[r], n);
    smallpond::group_by_bucket(b.data(), nrows, n, idx, off);
  }
  return py::make_tuple(indices, offsets);
}

// Partition ids given directly by an integer column; nulls and values outside [0, n) are errors.
py::tuple partition_by_values(const py::tuple& col, int64_t nrows, int64_t npartitions) {
  if (npartitions < 1 || npartitions > (1LL << 31))
    throw py::value_error("npartitions must be in [1, 2^31], got " + std::to_string(npartitions));
  std::vector<std::unique_ptr<py::buffer_info>> keep;
  py::list l;
  l.append(col);
  Column c = unpack(l, keep)[0];
  if (c.kind != ColKind::Int && c.kind != ColKind::UInt)
    throw py::type_error("partition column must be an integer column");
  std::vector<uint32_t> b(static_cast<size_t>(nrows));
  for (int64_t r = 0; r < nrows; ++r) {
    int64_t i = r + c.offset;
    if (c.validity && !((c.validity[i >> 3] >> (i & 7)) & 1))
      throw py::value_error("partition column: row " + std::to_string(r) + " is null, expected an id in [0, " +
                            std::to_string(npartitions) + ")");
    const uint8_t* p = c.data + i * c.width;
    int64_t v = 0;
    uint64_t u = 0;
    bool neg = false;
    if (c.kind == ColKind::Int) {
      switch (c.width) {
        case 1: v = *reinterpret_cast<const int8_t*>(p); break;
        case 2: v = *reinterpret_cast<const int16_t*>(p); break;
        case 4: v = *reinterpret_cast<const int32_t*>(p); break;
        default: v = *reinterpret_cast<const int64_t*>(p);
      }
      neg = v < 0;
      u = static_cast<uint64_t>(v);
    } else {
      switch (c.width) {
        case 1: u = p[0]; break;
        case 2: u = *reinterpret_cast<const uint16_t*>(p); break;
        case 4: u = *reinterpret_cast<const uint32_t*>(p); break;
        default: u = *reinterpret_cast<const uint64_t*>(p);
      }
    }
    if (neg || u >= static_cast<uint64_t>(npartitions))
      throw py::value_error("partition column: row " + std::to_string(r) + " has value " +
                            (neg ? std::to_string(v) : std::to_string(u)) + ", expected an id in [0, " +
                            std::to_string(npartitions) + ")");
    b[r] = static_cast<uint32_t>(u);
  }
  py::array_t<int64_t> indices(nrows), offsets(npartitions + 1);
  smallpond::group_by_bucket(b.data(), nrows, static_cast<uint32_t>(npartitions), indices.mutable_data(),
                             offsets.mutable_data());
  return py::make_tuple(indices, offsets);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "smallpond native hash partitioner (stable across machines; no libarrow linkage)";
  m.def("with_cuda", []() { return false; });
  m.def("hash_columns", &hash_columns, py::arg("columns"), py::arg("nrows"),
        "Stable 64-bit hash per row of the key columns -> uint64[nrows].");
  m.def("hash_partition", &hash_partition, py::arg("columns"), py::arg("nrows"), py::arg("npartitions"),
        "Group rows by hash bucket -> (indices int64[nrows], offsets int64[npartitions + 1]).");
  m.def("partition_by_values", &partition_by_values, py::arg("column"), py::arg("nrows"), py::arg("npartitions"),
        "Group rows by an integer partition-id column -> (indices, offsets); out-of-range ids raise ValueError.");
}
