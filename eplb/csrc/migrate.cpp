// Migration-aware planning: renumber a new plan to keep experts in place, or repair the previous
// plan for new loads instead of starting over.
#include <algorithm>

#include "detail.h"
#include "planner.h"

namespace eplb::detail {
namespace {

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

}  // namespace

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

}  // namespace eplb::detail
