// pybind11 bindings: dualpipe._C.plan / simulate / topology / with_cuda.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <chrono>
#include <deque>

#include "schedule.hpp"

namespace py = pybind11;
using namespace dualpipe;

namespace {

template <typename T>
py::array_t<T> to_array(const std::vector<T>& v) {
  py::array_t<T> a(v.size());
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

// Expand one rank's compact op list into rows [kind, zb, phase, chunk, phase1, chunk1]
// (micro-batch ids made explicit; -1 where a column does not apply).
py::array_t<int32_t> expand(const Topology& t, const std::vector<Op>& ops) {
  std::vector<std::array<int32_t, 6>> rows;
  rows.reserve(ops.size() * 2);
  std::vector<int> nf(t.phases), nb(t.phases), cnt[4];
  for (auto& c : cnt) c.assign(t.phases, 0);
  std::deque<std::pair<int, int>> wq;
  for_each_op(ops, [&](const Op& op) {
    int k = kind_of(op), p = op.arg, zb = (op.code & kZB) ? 1 : 0;
    std::array<int32_t, 6> row{k, zb, -1, -1, -1, -1};
    switch (k) {
      case kF: row[2] = p; row[3] = nf[p]++; break;
      case kB:
        row[2] = p; row[3] = nb[p]++;
        if (zb) wq.emplace_back(p, row[3]);
        break;
      case kW:
        if (!wq.empty()) { row[2] = wq.front().first; row[3] = wq.front().second; wq.pop_front(); }
        break;
      case kFB: {
        int p0 = p & 0x0F, p1 = p >> 4;
        row = {k, 0, p0, nf[p0]++, p1, nb[p1]++};
        break;
      }
      case kCommit:
        for (int i = 0; i < op.arg; ++i) {
          int pk = post_kind(op.post[i]), pp = post_phase(op.post[i]);
          rows.push_back({pk, 0, pp, cnt[pk - kRecvF][pp]++, -1, -1});
        }
        break;
      default: break;
    }
    rows.push_back(row);
  });
  py::array_t<int32_t> a({py::ssize_t(rows.size()), py::ssize_t(6)});
  std::copy(&rows[0][0], &rows[0][0] + rows.size() * 6, a.mutable_data());
  return a;
}

std::vector<std::vector<Op>> plan_all(Sched s, const Topology& t, int chunks, bool fwd_only) {
  std::vector<std::vector<Op>> plan(t.ranks);
  for (int r = 0; r < t.ranks; ++r) plan[r] = plan_rank(s, t, r, chunks, fwd_only);
  return plan;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "DualPipe native schedule planner and discrete-event simulator (CPU)";
  m.def("with_cuda", []() { return false; });
  m.def(
      "plan",
      [](const std::string& kind, int num_ranks, int num_chunks, int rank, bool forward_only, int virtual_stages) {
        Sched s = parse_sched(kind);
        check_args(s, num_ranks, num_chunks, virtual_stages);
        Topology t = make_topology(s, num_ranks, virtual_stages);
        py::list out;
        int lo = rank < 0 ? 0 : rank, hi = rank < 0 ? num_ranks : rank + 1;
        for (int r = lo; r < hi; ++r) {
          std::vector<Op> ops;
          {
            py::gil_scoped_release nogil;
            ops = plan_rank(s, t, r, num_chunks, forward_only);
          }
          out.append(expand(t, ops));
        }
        return out;
      },
      py::arg("kind"), py::arg("num_ranks"), py::arg("num_chunks"), py::arg("rank") = -1,
      py::arg("forward_only") = false, py::arg("virtual_stages") = 2,
      "Per-rank op lists; each an int32 array [n, 6] of (kind, zb, phase, chunk, phase1, chunk1).");
  m.def(
      "topology",
      [](const std::string& kind, int num_ranks, int virtual_stages) {
        Sched s = parse_sched(kind);
        check_args(s, num_ranks, std::max(1, 2 * num_ranks), virtual_stages);
        Topology t = make_topology(s, num_ranks, virtual_stages);
        py::dict d;
        d["phases"] = t.phases;
        d["prev"] = t.prev;
        d["next"] = t.next;
        d["stage_fraction"] = t.stage_fraction;
        return d;
      },
      py::arg("kind"), py::arg("num_ranks"), py::arg("virtual_stages") = 2);
  m.def(
      "simulate",
      [](const std::string& kind, int num_ranks, int num_chunks, double f, double b, double w, double fb, double p2p,
         double commit, int virtual_stages, bool timeline) {
        Sched s = parse_sched(kind);
        check_args(s, num_ranks, num_chunks, virtual_stages);
        for (auto [name, v] : {std::pair{"F", f}, {"B", b}, {"W", w}, {"FB", fb}, {"p2p", p2p}, {"commit", commit}})
          if (!(v >= 0)) throw std::invalid_argument(std::string("cost ") + name + " must be >= 0, got " + std::to_string(v));
        if (w > b) throw std::invalid_argument("cost W (weight-grad part) must be <= B (full backward)");
        Costs c{f, b, w, fb, p2p, commit};
        Topology t = make_topology(s, num_ranks, virtual_stages);
        SimResult r;
        double plan_s = 0, sim_s = 0;
        {
          py::gil_scoped_release nogil;
          auto t0 = std::chrono::steady_clock::now();
          auto plan = plan_all(s, t, num_chunks, false);
          auto t1 = std::chrono::steady_clock::now();
          r = simulate(t, plan, c, timeline);
          auto t2 = std::chrono::steady_clock::now();
          plan_s = std::chrono::duration<double>(t1 - t0).count();
          sim_s = std::chrono::duration<double>(t2 - t1).count();
        }
        py::dict d;
        d["makespan"] = r.makespan;
        d["busy"] = to_array(r.busy);
        d["end"] = to_array(r.end);
        d["peak_activations"] = to_array(r.peak_activations);
        d["num_ops"] = r.num_ops;
        d["stage_fraction"] = t.stage_fraction;
        d["plan_seconds"] = plan_s;
        d["simulate_seconds"] = sim_s;
        if (timeline) {
          py::dict tl;
          tl["rank"] = to_array(r.t_rank);
          tl["kind"] = to_array(r.t_kind);
          tl["phase"] = to_array(r.t_phase);
          tl["chunk"] = to_array(r.t_chunk);
          tl["phase1"] = to_array(r.t_phase1);
          tl["chunk1"] = to_array(r.t_chunk1);
          tl["start"] = to_array(r.t_start);
          tl["end"] = to_array(r.t_end);
          d["timeline"] = tl;
        }
        return d;
      },
      py::arg("kind"), py::arg("num_ranks"), py::arg("num_chunks"), py::arg("F") = 1.0, py::arg("B") = 2.0,
      py::arg("W") = 1.0, py::arg("FB") = 3.0, py::arg("p2p") = 0.0, py::arg("commit") = 0.0, py::arg("virtual_stages") = 2,
      py::arg("timeline") = false);
}
