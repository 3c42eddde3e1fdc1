// Exact combinatorial solvers: the per-batch token split (an LP whose optimum a max-flow with a
// binary search on the GPU capacity finds exactly, in integers) and the assignment problem used
// by migration-aware relabelling.
#include <algorithm>
#include <climits>
#include <queue>
#include <vector>

#include "planner.h"

namespace eplb {
namespace {

// Dinic's max-flow on a small graph.
struct MaxFlow {
  struct Edge {
    int to;
    int64_t cap;
  };
  std::vector<Edge> edges;
  std::vector<std::vector<int>> adj;
  std::vector<int> level, next;
  explicit MaxFlow(int n) : adj(n), level(n), next(n) {}
  int add(int u, int v, int64_t cap) {
    adj[u].push_back(int(edges.size())), edges.push_back({v, cap});
    adj[v].push_back(int(edges.size())), edges.push_back({u, 0});
    return int(edges.size()) - 2;
  }
  bool bfs(int s, int t) {
    std::fill(level.begin(), level.end(), -1);
    std::queue<int> q;
    level[s] = 0, q.push(s);
    while (!q.empty()) {
      int u = q.front();
      q.pop();
      for (int id : adj[u])
        if (edges[id].cap > 0 && level[edges[id].to] < 0)
          level[edges[id].to] = level[u] + 1, q.push(edges[id].to);
    }
    return level[t] >= 0;
  }
  int64_t dfs(int u, int t, int64_t f) {
    if (u == t) return f;
    for (int& i = next[u]; i < int(adj[u].size()); ++i) {
      Edge& e = edges[adj[u][i]];
      if (e.cap <= 0 || level[e.to] != level[u] + 1) continue;
      int64_t got = dfs(e.to, t, std::min(f, e.cap));
      if (got > 0) {
        e.cap -= got, edges[adj[u][i] ^ 1].cap += got;
        return got;
      }
    }
    return 0;
  }
  int64_t run(int s, int t) {
    int64_t flow = 0;
    while (bfs(s, t)) {
      std::fill(next.begin(), next.end(), 0);
      while (int64_t f = dfs(s, t, INT64_MAX)) flow += f;
    }
    return flow;
  }
};

// One layer: experts 1..E, GPUs E+1..E+G, source 0, sink E+G+1.
void redistribute_layer(const int64_t* phy2log, const int64_t* tokens, int64_t E, int64_t R,
                        int64_t G, int64_t* out) {
  int64_t ppg = R / G, total = 0;
  std::vector<int64_t> even(G, 0), cnt(E, 0);
  for (int64_t i = 0; i < R; ++i) ++cnt[phy2log[i]];
  for (int64_t e = 0; e < E; ++e) total += tokens[e];
  std::fill(out, out + R, 0);
  if (total == 0) return;
  // hi: the load of the even split, a feasible capacity; lo: the perfectly flat load
  for (int64_t i = 0; i < R; ++i) even[i / ppg] += tokens[phy2log[i]] / cnt[phy2log[i]] + 1;
  int64_t lo = (total + G - 1) / G, hi = std::max(lo, *std::max_element(even.begin(), even.end()));
  int src = 0, sink = int(E + G + 1);
  auto solve = [&](int64_t cap, std::vector<std::pair<int, int>>* arcs) {
    MaxFlow mf(int(E + G + 2));
    std::vector<char> seen(E * G, 0);
    for (int64_t e = 0; e < E; ++e)
      if (tokens[e] > 0) mf.add(src, int(1 + e), tokens[e]);
    for (int64_t i = 0; i < R; ++i) {
      int64_t e = phy2log[i], g = i / ppg;
      if (tokens[e] == 0 || seen[e * G + g]) continue;
      seen[e * G + g] = 1;
      int id = mf.add(int(1 + e), int(1 + E + g), tokens[e]);
      if (arcs) arcs->push_back({id, int(e * G + g)});
    }
    for (int64_t g = 0; g < G; ++g) mf.add(int(1 + E + g), sink, cap);
    int64_t f = mf.run(src, sink);
    if (arcs)
      for (auto& a : *arcs) a.first = int(tokens[a.second / G] - mf.edges[a.first].cap);
    return f == total;
  };
  while (lo < hi) {  // smallest capacity that carries every token
    int64_t mid = lo + (hi - lo) / 2;
    if (solve(mid, nullptr)) hi = mid;
    else lo = mid + 1;
  }
  std::vector<std::pair<int, int>> arcs;  // (flow, expert * G + gpu)
  solve(lo, &arcs);
  std::vector<int64_t> flow(E * G, 0), left(E * G, 0);
  for (auto& a : arcs) flow[a.second] = a.first;
  for (int64_t i = 0; i < R; ++i) ++left[phy2log[i] * G + i / ppg];
  for (int64_t i = 0; i < R; ++i) {  // split a GPU's share evenly over its replicas of the expert
    int64_t k = phy2log[i] * G + i / ppg, share = flow[k] / left[k];
    out[i] = share, flow[k] -= share, --left[k];
  }
}

}  // namespace

void redistribute(const int64_t* phy2log, const int64_t* tokens, int64_t L, int64_t E, int64_t R,
                  int64_t gpus, int64_t* out) {
  for (int64_t l = 0; l < L; ++l)
    redistribute_layer(phy2log + l * R, tokens + l * E, E, R, gpus, out + l * R);
}

// Hungarian algorithm with potentials (O(n^3)) on cost = -score.
std::vector<int> hungarian_max(const std::vector<int64_t>& score, int n) {
  const int64_t inf = INT64_MAX / 4;
  std::vector<int64_t> u(n + 1, 0), v(n + 1, 0);
  std::vector<int> p(n + 1, 0), way(n + 1, 0);
  for (int i = 1; i <= n; ++i) {
    p[0] = i;
    int j0 = 0;
    std::vector<int64_t> minv(n + 1, inf);
    std::vector<char> used(n + 1, 0);
    do {
      used[j0] = 1;
      int i0 = p[j0], j1 = 0;
      int64_t delta = inf;
      for (int j = 1; j <= n; ++j) {
        if (used[j]) continue;
        int64_t cur = -score[size_t(i0 - 1) * n + (j - 1)] - u[i0] - v[j];
        if (cur < minv[j]) minv[j] = cur, way[j] = j0;
        if (minv[j] < delta) delta = minv[j], j1 = j;
      }
      for (int j = 0; j <= n; ++j) {
        if (used[j]) u[p[j]] += delta, v[j] -= delta;
        else minv[j] -= delta;
      }
      j0 = j1;
    } while (p[j0] != 0);
    do {
      int j1 = way[j0];
      p[j0] = p[j1], j0 = j1;
    } while (j0);
  }
  std::vector<int> col(n);
  for (int j = 1; j <= n; ++j) col[p[j] - 1] = j - 1;
  return col;
}

}  // namespace eplb
