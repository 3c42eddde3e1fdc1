// Packing n items into packs that each take n / packs of them: greedy heaviest-first (the
// original's rule), swap refinement, and the spreading rules; plus greedy replication.
#include <algorithm>
#include <numeric>

#include "detail.h"

namespace eplb::detail {
namespace {

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

}  // namespace

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

}  // namespace eplb::detail
