// Placement planner: groups -> nodes, replication within nodes, replicas -> GPUs (see ref.py for
// the same algorithm in plain PyTorch), plus the options: swap refinement, spreading replicas,
// and migration-aware relabelling against a previous plan.
#include "planner.h"

#include <algorithm>
#include <numeric>

namespace eplb {
namespace {

// Items packed into `packs` packs of equal item count.
struct Packing {
  std::vector<int> pack, rank;  // per item
  std::vector<double> load;     // per pack
};

// What spreading needs: the expert of each item and which node each pack is on.
struct Spread {
  std::vector<int> label;  // expert (local id) of each item
  int num_labels = 0, packs_per_node = 1;
};

// Where the labels (experts) sit, for the spreading rules: the labels on each pack (a few) and
// a count per node and label.
struct LabelCounts {
  const Spread* sp;
  std::vector<std::vector<int>> on_pack;
  std::vector<int> on_node;
  LabelCounts(const Spread* s, int packs) : sp(s) {
    if (!sp) return;
    on_pack.resize(packs);
    on_node.assign(size_t(packs / sp->packs_per_node + 1) * sp->num_labels, 0);
  }
  int pack(int p, int item) const {
    return int(std::count(on_pack[p].begin(), on_pack[p].end(), sp->label[item]));
  }
  int node(int p, int item) const {
    return on_node[size_t(p / sp->packs_per_node) * sp->num_labels + sp->label[item]];
  }
  void add(int p, int item, int d) {
    int l = sp->label[item];
    if (d > 0) on_pack[p].push_back(l);
    else on_pack[p].erase(std::find(on_pack[p].begin(), on_pack[p].end(), l));
    on_node[size_t(p / sp->packs_per_node) * sp->num_labels + l] += d;
  }
  // May item x leave pack a for pack b while y goes the other way, creating no duplicate?
  bool swap_ok(int x, int a, int y, int b) const {
    if (!sp) return true;
    if (pack(b, x) > 0 || pack(a, y) > 0) return false;
    bool same_node = a / sp->packs_per_node == b / sp->packs_per_node;
    return same_node || (node(b, x) == 0 && node(a, y) == 0);
  }
};

std::vector<std::vector<int>> members(const Packing& P, int packs) {
  std::vector<std::vector<int>> m(packs);
  for (size_t i = 0; i < P.pack.size(); ++i) m[P.pack[i]].push_back(int(i));
  return m;
}

void do_swap(Packing& P, std::vector<std::vector<int>>& m, const std::vector<double>& w, int x,
             int y) {
  int a = P.pack[x], b = P.pack[y];
  std::swap(P.pack[x], P.pack[y]);
  std::swap(P.rank[x], P.rank[y]);
  std::replace(m[a].begin(), m[a].end(), x, y);
  std::replace(m[b].begin(), m[b].end(), y, x);
  P.load[a] += w[y] - w[x];
  P.load[b] += w[x] - w[y];
}

// Heaviest item first into the lightest pack with room (ties: lower pack). With spreading, packs
// holding fewer copies of the item's expert (then: whose node holds fewer) come first.
Packing greedy_pack(const std::vector<double>& w, int packs, const Spread* sp) {
  int n = int(w.size()), per = n / packs;
  Packing P{std::vector<int>(n), std::vector<int>(n), std::vector<double>(packs, 0.0)};
  if (per == 1) {  // one item per pack: item i -> pack i, as the original
    for (int i = 0; i < n; ++i) P.pack[i] = i, P.rank[i] = 0, P.load[i] = w[i];
    return P;
  }
  std::vector<int> order(n), count(packs, 0);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return w[a] > w[b]; });
  if (!sp) {  // lightest pack with room from a heap ordered by (load, index)
    auto later = [&](int a, int b) { return P.load[a] != P.load[b] ? P.load[a] > P.load[b] : a > b; };
    std::vector<int> heap(packs);
    std::iota(heap.begin(), heap.end(), 0);
    for (int item : order) {
      std::pop_heap(heap.begin(), heap.end(), later);
      int p = heap.back();
      P.pack[item] = p, P.rank[item] = count[p]++, P.load[p] += w[item];
      if (count[p] < per) std::push_heap(heap.begin(), heap.end(), later);
      else heap.pop_back();
    }
    return P;
  }
  LabelCounts lc(sp, packs);
  for (int item : order) {
    int best = -1;
    for (int p = 0; p < packs; ++p) {
      if (count[p] >= per) continue;
      if (best < 0) { best = p; continue; }
      if (sp) {  // fewest copies on the GPU, then on its node
        int dp = lc.pack(p, item), db = lc.pack(best, item);
        if (dp != db) { if (dp < db) best = p; continue; }
        int np = lc.node(p, item), nb = lc.node(best, item);
        if (np != nb) { if (np < nb) best = p; continue; }
      }
      if (P.load[p] < P.load[best]) best = p;
    }
    P.pack[item] = best;
    P.rank[item] = count[best]++;
    P.load[best] += w[item];
    if (sp) lc.add(best, item, 1);
  }
  return P;
}

// Removes duplicate experts on one pack by the swap that keeps the pair's max load lowest.
void repair_spread(Packing& P, const std::vector<double>& w, int packs, const Spread& sp) {
  auto m = members(P, packs);
  LabelCounts lc(&sp, packs);
  for (size_t i = 0; i < w.size(); ++i) lc.add(P.pack[i], int(i), 1);
  for (size_t i = 0; i < w.size(); ++i) {
    int x = int(i), a = P.pack[x];
    if (lc.pack(a, x) < 2) continue;
    int by = -1;
    double best = 0;
    for (int b = 0; b < packs; ++b) {
      if (b == a || lc.pack(b, x) > 0) continue;
      for (int y : m[b]) {
        if (lc.pack(a, y) > 0) continue;
        double cost = std::max(P.load[a] - w[x] + w[y], P.load[b] - w[y] + w[x]);
        if (by < 0 || cost < best) by = y, best = cost;
      }
    }
    if (by < 0) continue;  // no room anywhere: the duplicate stays
    lc.add(a, x, -1), lc.add(P.pack[by], by, -1);
    do_swap(P, m, w, x, by);
    lc.add(P.pack[x], x, 1), lc.add(P.pack[by], by, 1);
  }
}

// Local search: move weight off the heaviest pack by the best single swap with another pack, until
// no swap lowers it. Every accepted swap lowers the heaviest pack and keeps the partner below it.
void refine_pack(Packing& P, const std::vector<double>& w, int packs, const Spread* sp) {
  int n = int(w.size());
  if (n / packs <= 1) return;  // one item per pack: a swap changes nothing
  auto m = members(P, packs);
  LabelCounts lc(sp, packs);
  if (sp)
    for (int i = 0; i < n; ++i) lc.add(P.pack[i], i, 1);
  for (int iter = 0; iter < 20 * n; ++iter) {
    int a = int(std::max_element(P.load.begin(), P.load.end()) - P.load.begin());
    double best_gain = P.load[a] * 1e-12;
    int bx = -1, by = -1;
    for (int b = 0; b < packs; ++b) {
      double gap = P.load[a] - P.load[b];
      if (b == a || gap <= best_gain) continue;
      for (int x : m[a])
        for (int y : m[b]) {
          double d = w[x] - w[y];
          if (d <= 0 || d >= gap) continue;
          double gain = P.load[a] - std::max(P.load[a] - d, P.load[b] + d);
          if (gain > best_gain && lc.swap_ok(x, a, y, b)) best_gain = gain, bx = x, by = y;
        }
    }
    if (bx < 0) break;
    int b = P.pack[by];
    if (sp) lc.add(a, bx, -1), lc.add(b, by, -1);
    do_swap(P, m, w, bx, by);
    if (sp) lc.add(b, bx, 1), lc.add(a, by, 1);
  }
}

struct LayerPlan {
  std::vector<int64_t> phy2log, rank, logcnt;
};

struct Shape {
  int64_t E, R, groups, nodes, gpus, real_nodes;
};

// Replicas of one node's experts: expert (local id) and replica index of each physical expert.
struct Replicas {
  std::vector<int> p2m, prank;
  std::vector<int64_t> cnt;
};

// Each extra slot to the expert with the highest load per replica (ties: lower id).
Replicas replicate_greedy(const std::vector<double>& nw, int64_t slots) {
  int64_t n = int64_t(nw.size());
  Replicas r{std::vector<int>(slots), std::vector<int>(slots, 0), std::vector<int64_t>(n, 1)};
  std::iota(r.p2m.begin(), r.p2m.begin() + n, 0);
  std::vector<double> per(nw);  // load per replica; heap top: highest, then lowest id
  auto below = [&](int a, int b) { return per[a] != per[b] ? per[a] < per[b] : a > b; };
  std::vector<int> heap(n);
  std::iota(heap.begin(), heap.end(), 0);
  std::make_heap(heap.begin(), heap.end(), below);
  for (int64_t slot = n; slot < slots; ++slot) {
    std::pop_heap(heap.begin(), heap.end(), below);
    int best = heap.back();
    r.p2m[slot] = best;
    r.prank[slot] = int(r.cnt[best]++);
    per[best] = nw[best] / double(r.cnt[best]);
    std::push_heap(heap.begin(), heap.end(), below);
  }
  return r;
}

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
  int n = int(nw.size()), per_node = n;
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  for (int iter = 0; iter < 8; ++iter) {
    auto top = [&](auto key, int k, bool need_two) {
      std::vector<int> o;
      for (int e : order)
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
        NodePacking t = pack_node(nw, from_counts(c), gpus, per_node, packs_per_node, false, false);
        if (t.max_load() < target) target = t.max_load(), best_cnt = c;
      }
    if (best_cnt.empty()) return;  // candidates are scored by plain greedy packing (fast)
    Replicas cand = from_counts(best_cnt);
    NodePacking t = pack_node(nw, cand, gpus, per_node, packs_per_node, true, spread);
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

// Items in common between two small multisets of experts.
int64_t common(std::vector<int64_t> a, std::vector<int64_t> b) {
  std::sort(a.begin(), a.end()), std::sort(b.begin(), b.end());
  int64_t n = 0;
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    if (a[i] == b[j]) ++n, ++i, ++j;
    else if (a[i] < b[j]) ++i;
    else ++j;
  }
  return n;
}

// Renumbers nodes, GPUs within nodes and slots within GPUs (which changes no load) so that as many
// slots as possible keep the expert they held in `prev`.
void relabel(LayerPlan& p, const int64_t* prev, int64_t E, int64_t R, int64_t nodes, int64_t gpus) {
  int64_t ppn = R / nodes, ppg = R / gpus, gpn = gpus / nodes;
  auto slice = [](const int64_t* v, int64_t from, int64_t n) {
    return std::vector<int64_t>(v + from, v + from + n);
  };
  std::vector<int64_t> ns(nodes * nodes);
  for (int64_t a = 0; a < nodes; ++a)
    for (int64_t b = 0; b < nodes; ++b)
      ns[a * nodes + b] = common(slice(p.phy2log.data(), a * ppn, ppn), slice(prev, b * ppn, ppn));
  std::vector<int> node_to = hungarian_max(ns, int(nodes));
  std::vector<int64_t> phy2log(R, -1), rank(R, -1);
  for (int64_t a = 0; a < nodes; ++a) {
    int64_t b = node_to[a];
    std::vector<int64_t> gs(gpn * gpn);
    for (int64_t x = 0; x < gpn; ++x)
      for (int64_t y = 0; y < gpn; ++y)
        gs[x * gpn + y] = common(slice(p.phy2log.data(), a * ppn + x * ppg, ppg),
                                 slice(prev, b * ppn + y * ppg, ppg));
    std::vector<int> gpu_to = hungarian_max(gs, int(gpn));
    for (int64_t x = 0; x < gpn; ++x) {
      int64_t src = a * ppn + x * ppg, dst = b * ppn + gpu_to[x] * ppg;
      std::vector<char> placed(ppg, 0);
      for (int pass = 0; pass < 2; ++pass)  // pass 0: slots that keep their expert; 1: the rest
        for (int64_t k = 0; k < ppg; ++k) {
          if (placed[k]) continue;
          for (int64_t t = 0; t < ppg; ++t) {
            if (phy2log[dst + t] >= 0 || (pass == 0 && prev[dst + t] != p.phy2log[src + k]))
              continue;
            phy2log[dst + t] = p.phy2log[src + k], rank[dst + t] = p.rank[src + k];
            placed[k] = 1;
            break;
          }
        }
    }
  }
  p.phy2log.swap(phy2log), p.rank.swap(rank);
}

// Slot-order replica ranks and counts for a phy2log.
LayerPlan from_phy2log(std::vector<int64_t> phy2log, int64_t E) {
  LayerPlan p{std::move(phy2log), {}, std::vector<int64_t>(E, 0)};
  for (int64_t e : p.phy2log) p.rank.push_back(p.logcnt[e]++);
  return p;
}

// Repairs the previous plan instead of starting over: per domain (a node under the hierarchical
// policy, else the whole layer) replica counts are recomputed for the new loads, replicas that
// survive keep their slots, new ones fill the freed slots lightest GPU first, then swaps balance.
// Returns an empty plan when `prev` does not keep each expert within one node (hierarchical).
std::vector<int64_t> sticky_plan(const double* w, const int64_t* prev, const Shape& s,
                                 bool spread) {
  int64_t domains = s.nodes, slots = s.R / domains, ppg = s.R / s.gpus;
  int gpus = int(s.gpus / domains), packs_per_node = int(std::max<int64_t>(1, s.gpus / s.real_nodes));
  std::vector<int64_t> home(s.E, -1), out(prev, prev + s.R);
  for (int64_t i = 0; i < s.R; ++i) {
    int64_t d = i / slots, e = prev[i];
    if (home[e] >= 0 && home[e] != d) return {};
    home[e] = d;
  }
  for (int64_t d = 0; d < domains; ++d) {
    std::vector<int64_t> experts;  // local id -> expert
    std::vector<int> local(s.E, -1);
    for (int64_t e = 0; e < s.E; ++e)
      if (home[e] == d) local[e] = int(experts.size()), experts.push_back(e);
    int n = int(experts.size());
    std::vector<double> nw(n);
    for (int i = 0; i < n; ++i) nw[i] = w[experts[i]];
    std::vector<int64_t> cnt = replicate_greedy(nw, slots).cnt, kept(n, 0);
    // items: one per slot, the kept expert or (after) a new replica; pack = GPU, rank = position
    Packing P{std::vector<int>(slots, -1), std::vector<int>(slots, -1), std::vector<double>(gpus, 0)};
    std::vector<int> label(slots, -1), free_slots;
    for (int64_t k = 0; k < slots; ++k) {
      int m = local[prev[d * slots + k]];
      if (kept[m] < cnt[m]) label[k] = m, ++kept[m];
      else free_slots.push_back(int(k));
    }
    std::vector<int> extra;  // new replicas, heaviest first
    for (int m = 0; m < n; ++m)
      for (int64_t c = kept[m]; c < cnt[m]; ++c) extra.push_back(m);
    std::stable_sort(extra.begin(), extra.end(), [&](int a, int b) {
      return nw[a] / double(cnt[a]) > nw[b] / double(cnt[b]);
    });
    for (int64_t k = 0; k < slots; ++k)
      if (label[k] >= 0) P.load[k / ppg] += nw[label[k]] / double(cnt[label[k]]);
    for (int m : extra) {  // lightest GPU with a free slot (and, spreading, fewest copies of m)
      int best = -1;
      auto copies = [&](int f) {
        int c = 0;
        for (int64_t t = int64_t(f / ppg) * ppg; t < int64_t(f / ppg + 1) * ppg; ++t) c += label[t] == m;
        return spread ? c : 0;
      };
      for (size_t j = 0; j < free_slots.size(); ++j) {
        int f = free_slots[j];
        if (best < 0 || copies(f) < copies(free_slots[best]) ||
            (copies(f) == copies(free_slots[best]) && P.load[f / ppg] < P.load[free_slots[best] / ppg]))
          best = int(j);
      }
      int f = free_slots[best];
      label[f] = m, P.load[f / ppg] += nw[m] / double(cnt[m]);
      free_slots.erase(free_slots.begin() + best);
    }
    std::vector<double> iw(slots);
    for (int64_t k = 0; k < slots; ++k) {
      P.pack[k] = int(k / ppg), P.rank[k] = int(k % ppg), iw[k] = nw[label[k]] / double(cnt[label[k]]);
    }
    Spread sp{label, n, packs_per_node};
    refine_pack(P, iw, gpus, spread ? &sp : nullptr);
    for (int64_t k = 0; k < slots; ++k)
      out[d * slots + P.pack[k] * ppg + P.rank[k]] = experts[label[k]];
  }
  return out;
}

int64_t moves(const std::vector<int64_t>& a, const int64_t* b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

}  // namespace

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
