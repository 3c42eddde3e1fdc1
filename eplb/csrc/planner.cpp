// Placement planner: groups -> nodes, replication within nodes, replicas -> GPUs (ref.py has the
// same algorithm in plain PyTorch), with the `refine`, `spread` and migration options.
#include "planner.h"

#include <algorithm>
#include <numeric>

#include "detail.h"

namespace eplb {
namespace detail {
namespace {

Replicas from_counts(const std::vector<int64_t>& cnt) {
  Replicas r{{}, {}, cnt};
  for (size_t e = 0; e < cnt.size(); ++e)
    for (int64_t k = 0; k < cnt[e]; ++k) r.p2m.push_back(int(e)), r.prank.push_back(int(k));
  return r;
}

// Packs a node's replicas onto its GPUs; item weights are load / replicas.
struct NodePacking {
  std::vector<double> w;
  Packing P;
  double max_load() const { return *std::max_element(P.load.begin(), P.load.end()); }
};

NodePacking pack_node(const std::vector<double>& nw, const Replicas& r, int gpus, int per_node,
                      int packs_per_node, bool refine, bool spread) {
  NodePacking np;
  for (int m : r.p2m) np.w.push_back(nw[m] / double(r.cnt[m]));
  Spread sp{r.p2m, per_node, packs_per_node};
  np.P = greedy_pack(np.w, gpus, spread ? &sp : nullptr);
  if (spread) repair_spread(np.P, np.w, gpus, sp);
  if (refine) refine_pack(np.P, np.w, gpus, spread ? &sp : nullptr);
  return np;
}

// Better replica counts for packing: move one replica from expert a to expert b while that lowers
// the node's max GPU load (e.g. 9 replicas on 8 GPUs put two on one GPU; 8 + 1 elsewhere do not).
void search_counts(const std::vector<double>& nw, Replicas& r, NodePacking& best, int gpus,
                   int packs_per_node, bool spread) {
  int n = int(nw.size());
  for (int iter = 0; iter < 8; ++iter) {
    auto top = [&](auto key, int k, bool need_two) {  // the k experts with the highest key
      std::vector<int> o;
      for (int e = 0; e < n; ++e)
        if (!need_two || r.cnt[e] > 1) o.push_back(e);
      k = std::min<int>(k, int(o.size()));
      std::partial_sort(o.begin(), o.begin() + k, o.end(),
                        [&](int a, int b) { return key(a) > key(b); });
      o.resize(k);
      return o;
    };
    auto from = top([&](int e) { return nw[e] / double(r.cnt[e]); }, 4, true);
    auto to = top([&](int e) { return nw[e] / double(r.cnt[e] + 1); }, 4, false);
    double target = best.max_load() * (1 - 1e-12);
    std::vector<int64_t> best_cnt;
    for (int a : from)
      for (int b : to) {
        if (a == b) continue;
        std::vector<int64_t> c = r.cnt;
        --c[a], ++c[b];
        NodePacking t = pack_node(nw, from_counts(c), gpus, n, packs_per_node, false, false);
        if (t.max_load() < target) target = t.max_load(), best_cnt = c;
      }
    if (best_cnt.empty()) return;  // candidates are scored by plain greedy packing (fast)
    Replicas cand = from_counts(best_cnt);
    NodePacking t = pack_node(nw, cand, gpus, n, packs_per_node, true, spread);
    if (t.max_load() >= best.max_load()) return;
    r = std::move(cand), best = std::move(t);
  }
}

// One layer with the hierarchical algorithm (the global policy is groups = nodes = 1).
LayerPlan plan_layer(const double* w, const Shape& s, bool refine_nodes, bool improve,
                     bool spread) {
  int64_t gsize = s.E / s.groups, per_node = s.E / s.nodes, ppn = s.R / s.nodes;
  int gpus_pn = int(s.gpus / s.nodes), packs_per_node = int(std::max<int64_t>(1, s.gpus / s.real_nodes));
  int64_t ppg = s.R / s.gpus;
  // 1. groups -> nodes; mlog numbers experts node-major (node, group slot, position in group)
  std::vector<double> gload(s.groups, 0.0);
  for (int64_t g = 0; g < s.groups; ++g) {
    gload[g] = w[g * gsize];
    for (int64_t j = 1; j < gsize; ++j) gload[g] += w[g * gsize + j];
  }
  Packing gp = greedy_pack(gload, int(s.nodes), nullptr);
  if (refine_nodes) refine_pack(gp, gload, int(s.nodes), nullptr);
  std::vector<int64_t> mlog2log(s.E);
  for (int64_t g = 0; g < s.groups; ++g)
    for (int64_t j = 0; j < gsize; ++j)
      mlog2log[(gp.pack[g] * (s.groups / s.nodes) + gp.rank[g]) * gsize + j] = g * gsize + j;

  LayerPlan out{std::vector<int64_t>(s.R), std::vector<int64_t>(s.R), std::vector<int64_t>(s.E)};
  for (int64_t node = 0; node < s.nodes; ++node) {
    const int64_t* m2l = mlog2log.data() + node * per_node;
    std::vector<double> nw(per_node);
    for (int64_t i = 0; i < per_node; ++i) nw[i] = w[m2l[i]];
    // 2. replicate within the node, 3. pack its replicas onto its GPUs
    Replicas r = replicate_greedy(nw, ppn);
    NodePacking np = pack_node(nw, r, gpus_pn, int(per_node), packs_per_node, improve, spread);
    if (improve) search_counts(nw, r, np, gpus_pn, packs_per_node, spread);
    for (int64_t i = 0; i < ppn; ++i) {
      int64_t slot = node * ppn + np.P.pack[i] * ppg + np.P.rank[i];
      out.phy2log[slot] = m2l[r.p2m[i]];
      out.rank[slot] = r.prank[i];
    }
    for (int64_t i = 0; i < per_node; ++i) out.logcnt[m2l[i]] = r.cnt[i];
  }
  return out;
}

}  // namespace

// Max GPU load of a plan; loads split evenly over replicas. cnt recomputed from phy2log.
double max_gpu_load(const double* w, const std::vector<int64_t>& phy2log, int64_t E, int64_t gpus) {
  std::vector<int64_t> cnt(E, 0);
  for (int64_t e : phy2log) ++cnt[e];
  int64_t ppg = int64_t(phy2log.size()) / gpus;
  double mx = 0;
  for (int64_t g = 0; g < gpus; ++g) {
    double load = 0;
    for (int64_t k = 0; k < ppg; ++k) {
      int64_t e = phy2log[g * ppg + k];
      load += w[e] / double(cnt[e]);
    }
    mx = std::max(mx, load);
  }
  return mx;
}

}  // namespace detail

using namespace detail;

void rebalance(const double* weight, int64_t L, int64_t E, int64_t R, int64_t groups,
               int64_t nodes, int64_t gpus, const Options& opt, const int64_t* prev,
               int64_t* phy2log, int64_t* phy_rank, int64_t* logcnt) {
  Shape s{E, R, groups, nodes, gpus, nodes};
  if (groups % nodes != 0) s.groups = 1, s.nodes = 1;  // global policy
  for (int64_t l = 0; l < L; ++l) {
    const double* w = weight + l * E;
    LayerPlan best = plan_layer(w, s, false, false, opt.spread);
    if (opt.refine) {  // keep whichever candidate has the lowest max GPU load; greedy on ties
      double best_max = max_gpu_load(w, best.phy2log, E, gpus);
      for (bool refine_nodes : {false, true}) {
        LayerPlan c = plan_layer(w, s, refine_nodes, true, opt.spread);
        double m = max_gpu_load(w, c.phy2log, E, gpus);
        if (m < best_max) best = std::move(c), best_max = m;
      }
    }
    if (prev) {  // fewest moves among: previous plan, repaired plan, fresh plan renumbered
      const int64_t* pv = prev + l * R;
      relabel(best, pv, E, R, nodes, gpus);
      double limit = (1.0 + opt.migration_tolerance) * max_gpu_load(w, best.phy2log, E, gpus);
      int64_t fewest = moves(best.phy2log, pv);
      for (auto& c : {std::vector<int64_t>(pv, pv + R), sticky_plan(w, pv, s, opt.spread)})
        if (!c.empty() && moves(c, pv) < fewest && max_gpu_load(w, c, E, gpus) <= limit)
          best = from_phy2log(c, E), fewest = moves(c, pv);
    }
    std::copy(best.phy2log.begin(), best.phy2log.end(), phy2log + l * R);
    std::copy(best.rank.begin(), best.rank.end(), phy_rank + l * R);
    std::copy(best.logcnt.begin(), best.logcnt.end(), logcnt + l * E);
  }
}

}  // namespace eplb
