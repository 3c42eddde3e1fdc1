// Python bindings of the chunk engine and CRC32C (module threefs._C).
#include <cerrno>
#include <cstring>
#include <unistd.h>
#include <memory>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "chunk_engine.h"
#include "crc32c.h"
#include "fastpath.h"
#include "sha256.h"

namespace py = pybind11;
using namespace threefs;

namespace {
py::object g_checksum_error, g_version_error;

py::dict meta_dict(const ChunkMeta& m) {
  py::dict d;
  d["committed_ver"] = m.committed_ver;
  d["pending_ver"] = m.pending_ver;
  d["chain_ver"] = m.chain_ver;
  d["size"] = m.size;
  d["crc"] = m.crc;
  d["pending_size"] = m.pending_size;
  d["pending_crc"] = m.pending_crc;
  return d;
}

// A contiguous buffer argument (writable: requested for writing, into)
struct Buf {
  char* ptr;
  size_t len;
  py::buffer_info info;
  explicit Buf(const py::buffer& b, bool writable = false) : info(b.request(writable)) {
    if (info.ndim > 1 && !(info.strides.size() && info.strides.back() == info.itemsize))
      throw py::type_error(writable ? "into must be a contiguous writable buffer"
                                    : "data must be a contiguous bytes-like object");
    ptr = static_cast<char*>(info.ptr);
    len = static_cast<size_t>(info.size * info.itemsize);
  }
};
// An open zero-copy read span (ChunkEngine::open_span); close() releases it (also on collection).
struct PySpan {
  ChunkEngine* e = nullptr;
  py::object owner;  // the engine's Python object: kept alive while the span is
  ChunkEngine::Span s;
  void close() {
    if (e && (s.fd >= 0 || s.lease)) e->close_span(&s);
  }
  ~PySpan() { close(); }
};
}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "threefs native module: chunk engine and CRC32C";
  m.def("with_cuda", [] { return false; });
  m.def("crc32c_hardware", &crc32c_hardware);
  m.def(
      "crc32c",
      [](py::buffer data, uint32_t crc) {
        Buf b(data);
        py::gil_scoped_release nogil;
        return crc32c(crc, b.ptr, b.len);
      },
      py::arg("data"), py::arg("crc") = 0);
  m.def(
      "crc32c_blocks",
      [](py::buffer data) {
        Buf b(data);
        std::vector<uint32_t> t((b.len + kBlockBytes - 1) / kBlockBytes);
        uint32_t crc;
        {
          py::gil_scoped_release nogil;
          crc = crc32c_blocks(b.ptr, b.len, t.data());
        }
        return py::make_tuple(crc, t);
      },
      py::arg("data"), "(CRC32C of data, [CRC32C of each 4 KiB block]) in one pass");

  m.def(
      "crc32c_sums",
      [](py::buffer data) {
        Buf b(data);
        std::string t(4 * ((b.len + kBlockBytes - 1) / kBlockBytes), '\0');
        uint32_t crc;
        {
          py::gil_scoped_release nogil;
          crc = crc32c_blocks(b.ptr, b.len, reinterpret_cast<uint32_t*>(&t[0]));
        }
        return py::make_tuple(crc, py::bytes(t));
      },
      py::arg("data"),
      "(CRC32C of data, bytes: little-endian u32 CRC32C per 4 KiB block) in one pass; "
      "ChunkEngine.update(sums=) takes it instead of computing them again");

  m.def(
      "verify_crc32c",
      [](py::buffer data, uint32_t crc, py::bytes blocks) {
        Buf b(data);
        std::string t = blocks;
        py::gil_scoped_release nogil;
        if (t.empty()) return crc32c(0, b.ptr, b.len) == crc;
        size_t nb = (b.len + kBlockBytes - 1) / kBlockBytes;
        if (t.size() != 4 * nb) return false;
        std::vector<uint32_t> got(nb);
        crc32c_blocks(b.ptr, b.len, got.data());
        return std::memcmp(got.data(), t.data(), t.size()) == 0;
      },
      py::arg("data"), py::arg("crc"), py::arg("block_crcs") = py::bytes(""),
      "True when data matches: CRC32C `crc` of the whole, or, when block_crcs (little-endian u32 "
      "per 4 KiB block) is given, every block's CRC32C");

  m.def(
      "read_verify",
      [](int fd, py::buffer into, uint64_t offset, uint32_t crc, py::bytes blocks) {
        Buf b(into, true);
        char* dst = b.ptr;
        const size_t n = b.len;
        std::string t = blocks;
        size_t nb = (n + kBlockBytes - 1) / kBlockBytes;
        if (!t.empty() && t.size() != 4 * nb) return py::make_tuple(size_t(0), false);
        std::vector<uint32_t> got_b(t.empty() ? 0 : nb);
        // pieces small enough to be CRCed from the cache right after the kernel's copy
        constexpr size_t kPiece = 256 << 10;
        size_t got = 0;
        uint32_t c = 0;
        int err = 0;
        {
          py::gil_scoped_release nogil;
          while (got < n) {
            size_t want = std::min(kPiece, n - got);
            ssize_t r = ::pread(fd, dst + got, want, static_cast<off_t>(offset + got));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
              err = errno;
              break;
            }
            if (r == 0) break;
            size_t k = static_cast<size_t>(r);
            if (t.empty())
              c = crc32c(c, dst + got, k);
            else if (got % kBlockBytes == 0 && (k % kBlockBytes == 0 || got + k == n))
              crc32c_blocks(dst + got, k, got_b.data() + got / kBlockBytes);
            else
              break;  // a short read inside a block: counted as not verified
            got += k;
          }
        }
        if (err) {
          errno = err;
          PyErr_SetFromErrno(PyExc_OSError);
          throw py::error_already_set();
        }
        bool ok = got == n && (t.empty() ? c == crc
                                         : std::memcmp(got_b.data(), t.data(), t.size()) == 0);
        return py::make_tuple(size_t(got), bool(ok));
      },
      py::arg("fd"), py::arg("into"), py::arg("offset"), py::arg("crc"),
      py::arg("block_crcs") = py::bytes(""),
      "(bytes read, ok): pread len(into) bytes of fd at offset into `into`, computing their "
      "CRC32C piece by piece right after each piece is read (one pass while the bytes are in "
      "the cache), ok when all were read and they match `crc` (whole) or, when block_crcs is "
      "given, every 4 KiB block's CRC32C; the GIL is released throughout");

  py::class_<PySpan>(m, "Span")
      .def_property_readonly("fd", [](const PySpan& p) { return p.s.fd; })
      .def_property_readonly("file_offset", [](const PySpan& p) { return p.s.file_offset; })
      .def_property_readonly("n", [](const PySpan& p) { return p.s.n; })
      .def_property_readonly("whole", [](const PySpan& p) { return p.s.whole; })
      .def_property_readonly("crc", [](const PySpan& p) { return p.s.crc; })
      .def_property_readonly("block_crcs", [](const PySpan& p) {
        return py::bytes(reinterpret_cast<const char*>(p.s.crcs.data()), p.s.crcs.size() * 4);
      })
      .def("close", &PySpan::close);

  g_checksum_error = py::exception<ChecksumError>(m, "ChecksumError", PyExc_IOError);
  g_version_error = py::exception<VersionError>(m, "VersionError", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const IoError& e) {
      py::object err = py::module_::import("builtins").attr("OSError")(e.err, e.what());
      PyErr_SetObject(PyExc_OSError, err.ptr());
    } catch (const ChecksumError& e) {
      PyErr_SetString(g_checksum_error.ptr(), e.what());
    } catch (const VersionError& e) {
      PyErr_SetString(g_version_error.ptr(), e.what());
    }
  });

  m.def(
      "hmac_sha256",
      [](py::bytes key, py::bytes msg) {
        std::string k = key, d = msg;
        uint8_t out[32];
        hmac_sha256(reinterpret_cast<const uint8_t*>(k.data()), k.size(), {{d.data(), d.size()}},
                    out);
        return py::bytes(reinterpret_cast<const char*>(out), 32);
      },
      py::arg("key"), py::arg("msg"), "HMAC-SHA256 of the C++ data path (tests compare it)");

  m.def(
      "_json_members",
      [](py::bytes text) -> py::object {
        std::map<std::string, JsonMember> o;
        if (!json_members(std::string(text), &o)) return py::none();
        py::dict d;
        for (auto& kv : o) {
          py::object v = py::str("<other>");
          if (kv.second.type == 'i') v = py::int_(kv.second.i);
          if (kv.second.type == 's') v = py::bytes(kv.second.s);
          if (kv.second.type == 'b') v = py::bool_(kv.second.i != 0);
          if (kv.second.type == 'n') v = py::none();
          d[py::bytes(kv.first)] = v;
        }
        return d;
      },
      py::arg("text"), "test hook: the data path's reading of a JSON meta (None: not taken)");
  m.def("gmac_available", &gmac_available, "libcrypto found for the C++ AES-GMAC");
  m.def(
      "gmac",
      [](py::bytes key, py::bytes nonce, py::buffer data) -> py::object {
        std::string k = key, n = nonce;
        if (k.size() != 16 || n.size() != 12) throw py::value_error("key 16 and nonce 12 bytes");
        Buf b(data);
        uint8_t tag[16];
        if (!gmac(reinterpret_cast<const uint8_t*>(k.data()),
                  reinterpret_cast<const uint8_t*>(n.data()), b.ptr, b.len, tag))
          return py::none();
        return py::bytes(reinterpret_cast<const char*>(tag), 16);
      },
      py::arg("key"), py::arg("nonce"), py::arg("data"),
      "AES-128-GMAC tag of data (the C++ data path's), None without libcrypto");

  py::class_<FastPath>(m, "FastPath", "The storage node's C++ full-chunk write path (fastpath.h)")
      .def(py::init([](py::bytes secret) { return new FastPath(std::string(secret)); }),
           py::arg("secret"))
      .def(
          "add_engine", [](FastPath& f, int64_t tid, ChunkEngine& e) { f.add_engine(tid, &e); },
          py::arg("tid"), py::arg("engine"), py::keep_alive<1, 3>())
      .def(
          "set_chains",
          [](FastPath& f, py::list rows) {
            std::unordered_map<int64_t, ChainInfo> t;
            for (auto r : rows) {  // (chain id, chain version, target id or -1, writes, successor, head)
              auto row = r.cast<py::tuple>();
              ChainInfo c;
              c.ver = row[1].cast<uint64_t>();
              c.tid = row[2].cast<int64_t>();
              c.writes = row[3].cast<bool>();
              c.succ_addr = row[4].cast<std::string>();
              c.head = row[5].cast<bool>();
              t[row[0].cast<int64_t>()] = c;
            }
            f.set_chains(std::move(t));
          },
          py::arg("rows"))
      .def(
          "lock",
          [](FastPath& f, py::bytes key) {
            std::string k = key;
            py::gil_scoped_release nogil;
            f.locks().acquire(k);
          },
          py::arg("key"))
      .def(
          "unlock", [](FastPath& f, py::bytes key) { f.locks().release(std::string(key)); },
          py::arg("key"))
      .def(
          "serve",
          [](FastPath& f, int fd, py::bytes key, int flags, uint64_t recv_seq,
             uint64_t send_seq, py::buffer buf) {
            std::string k = key;
            if (k.size() != 32) throw py::value_error("key must be 32 bytes");
            py::buffer_info bi = buf.request(true);
            RawFrame fr;
            std::string err;
            int st;
            {
              py::gil_scoped_release nogil;
              st = f.serve(fd, reinterpret_cast<const uint8_t*>(k.data()), flags, &recv_seq,
                           &send_seq,
                           static_cast<char*>(bi.ptr), size_t(bi.size * bi.itemsize), &fr, &err);
            }
            return py::make_tuple(st, py::bytes(fr.hdr), py::bytes(fr.meta), fr.have_data,
                                  recv_seq, send_seq, err);
          },
          py::arg("fd"), py::arg("key"), py::arg("flags"), py::arg("recv_seq"),
          py::arg("send_seq"),
          py::arg("buf"),
          "(status, header+MAC, meta, payload in buf, recv_seq, send_seq, error): status 0 a "
          "frame for Python, 1 closed, 2 malformed frame, 3 socket error")
      .def(
          "head_write",
          [](FastPath& f, int64_t tid, int64_t chain, uint64_t chain_ver, py::bytes cid,
             uint64_t ver, py::buffer data, py::tuple sums, std::string succ_addr) {
            std::string c = cid;
            Buf b(data);
            uint32_t crc = sums[0].cast<uint32_t>();
            std::string blocks = sums[1].cast<std::string>();
            if (blocks.size() != 4 * ((b.len + kBlockBytes - 1) / kBlockBytes))
              throw py::value_error("sums do not match the data");
            std::string err;
            int st;
            {
              py::gil_scoped_release nogil;
              st = f.head_write(tid, chain, chain_ver, c, ver, b.ptr, b.len, crc,
                                reinterpret_cast<const uint32_t*>(blocks.data()), succ_addr, &err);
            }
            return py::make_tuple(st, err);
          },
          py::arg("tid"), py::arg("chain"), py::arg("chain_ver"), py::arg("chunk_id"),
          py::arg("ver"), py::arg("data"), py::arg("sums"), py::arg("succ_addr"),
          "(0, '') done, (1, answer JSON) the successor refused, (2, text) it was unreachable")
      .def_property_readonly("handled", &FastPath::handled);

  py::class_<ChunkEngine>(m, "ChunkEngine")
      .def(py::init<const std::string&, const std::string&, uint64_t, uint32_t>(),
           py::arg("root"), py::arg("fsync_policy"), py::arg("capacity_bytes"),
           py::arg("max_chunk_size"))
      .def(
          "update",
          [](ChunkEngine& e, py::bytes id, uint64_t ver, uint64_t chain_ver, uint64_t offset,
             py::buffer data, int64_t truncate_to, bool full_replace, py::object sums) {
            std::string k = id;
            Buf b(data);
            std::string blocks;
            uint32_t scrc = 0;
            if (!sums.is_none()) {  // (crc, block CRCs as bytes) from crc32c_sums(data)
              auto t = sums.cast<py::tuple>();
              if (t.size() != 2) throw py::value_error("sums must be (crc, block_crcs)");
              scrc = t[0].cast<uint32_t>();
              blocks = t[1].cast<std::string>();
              if (blocks.size() != 4 * ((b.len + kBlockBytes - 1) / kBlockBytes))
                throw py::value_error("sums: block_crcs must hold 4 bytes per 4 KiB block of "
                                      "data, got " + std::to_string(blocks.size()) + " bytes");
            }
            ChunkMeta r;
            {
              py::gil_scoped_release nogil;
              r = e.update(k, ver, chain_ver, offset, b.ptr, b.len, truncate_to, full_replace,
                           sums.is_none() ? nullptr
                                          : reinterpret_cast<const uint32_t*>(blocks.data()),
                           scrc);
            }
            return meta_dict(r);
          },
          py::arg("chunk_id"), py::arg("ver"), py::arg("chain_ver"), py::arg("offset"),
          py::arg("data"), py::arg("truncate_to") = -1, py::arg("full_replace") = false,
          py::arg("sums") = py::none())
      .def(
          "commit",
          [](ChunkEngine& e, py::bytes id, uint64_t ver) {
            std::string k = id;
            py::gil_scoped_release nogil;
            return e.commit(k, ver);
          },
          py::arg("chunk_id"), py::arg("ver"))
      .def(
          "replace_committed",
          [](ChunkEngine& e, py::bytes id, uint64_t ver, uint64_t chain_ver, py::buffer data) {
            std::string k = id;
            Buf b(data);
            ChunkMeta r;
            {
              py::gil_scoped_release nogil;
              r = e.replace_committed(k, ver, chain_ver, b.ptr, b.len);
            }
            return meta_dict(r);
          },
          py::arg("chunk_id"), py::arg("ver"), py::arg("chain_ver"), py::arg("data"))
      .def(
          "read",
          [](ChunkEngine& e, py::bytes id, uint64_t offset, uint64_t length, bool verify,
             bool pending) -> py::object {
            std::string k = id;
            PyObject* out = nullptr;
            bool found;
            std::exception_ptr err;
            {
              py::gil_scoped_release nogil;
              // allocate the result bytes object once and read straight into it
              try {
                found = e.read(k, offset, length, verify, [&](size_t n) -> char* {
                  py::gil_scoped_acquire gil;
                  out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(n));
                  if (!out) throw std::bad_alloc();
                  return PyBytes_AS_STRING(out);
                }, pending);
              } catch (...) {
                err = std::current_exception();
              }
            }
            if (err) {
              Py_XDECREF(out);
              std::rethrow_exception(err);
            }
            if (!found) return py::none();
            return py::reinterpret_steal<py::object>(out);
          },
          py::arg("chunk_id"), py::arg("offset"), py::arg("length"), py::arg("verify") = true,
          py::arg("pending") = false)
      .def(
          "open_span",
          [](py::object self, py::bytes id, uint64_t offset, uint64_t length) {
            ChunkEngine& e = self.cast<ChunkEngine&>();
            std::string k = id;
            auto sp = std::make_unique<PySpan>();
            sp->e = &e;
            sp->owner = self;
            int st;
            {
              py::gil_scoped_release nogil;
              st = e.open_span(k, offset, length, &sp->s);
            }
            py::object o = py::none();
            if (st == 1) o = py::cast(std::move(sp));
            return py::make_tuple(st, o);
          },
          py::arg("chunk_id"), py::arg("offset"), py::arg("length"),
          "(status, Span|None): 0 no committed chunk, 2 range not block-aligned, 1 opened")
      .def(
          "abort",
          [](ChunkEngine& e, py::bytes id, uint64_t ver) { return e.abort(std::string(id), ver); },
          py::arg("chunk_id"), py::arg("ver"))
      .def(
          "reserve", [](ChunkEngine& e, py::bytes id, uint64_t n) { e.reserve(std::string(id), n); },
          py::arg("chunk_id"), py::arg("new_size"))
      .def(
          "unreserve", [](ChunkEngine& e, py::bytes id) { e.unreserve(std::string(id)); },
          py::arg("chunk_id"))
      .def(
          "meta",
          [](ChunkEngine& e, py::bytes id) -> py::object {
            auto m = e.meta(std::string(id));
            if (!m) return py::none();
            return meta_dict(*m);
          },
          py::arg("chunk_id"))
      .def(
          "list",
          [](ChunkEngine& e, py::bytes prefix, size_t limit) {
            py::list out;
            for (auto& kv : e.list(std::string(prefix), limit))
              out.append(py::make_tuple(py::bytes(kv.first), meta_dict(kv.second)));
            return out;
          },
          py::arg("prefix") = py::bytes(""), py::arg("limit") = size_t(1) << 62)
      .def(
          "remove", [](ChunkEngine& e, py::bytes id) { return e.remove(std::string(id)); },
          py::arg("chunk_id"))
      .def(
          "chunk_path",
          [](ChunkEngine& e, py::bytes id, bool pending) {
            return e.chunk_path(std::string(id), pending);
          },
          py::arg("chunk_id"), py::arg("pending") = false)
      .def("used_bytes", &ChunkEngine::used_bytes)
      .def("capacity_bytes", &ChunkEngine::capacity_bytes)
      .def("chunk_count", &ChunkEngine::chunk_count)
      .def("set_crash_point", &ChunkEngine::set_crash_point, py::arg("point"))
      .def_property_readonly("root", &ChunkEngine::root);
}
