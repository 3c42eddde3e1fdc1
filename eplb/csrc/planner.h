// eplb C++ core: expert placement plans for all layers, and the per-batch token split.
// All arrays are dense row-major; Python validates shapes and values before calling in.
#pragma once
#include <cstdint>
#include <vector>

namespace eplb {

struct Options {
  bool refine = false;          // pair-swap local search after greedy packing (never worse)
  bool spread = false;          // replicas of one expert on distinct GPUs (and nodes) when possible
  double migration_tolerance = 0.0;  // with a previous plan: max-load slack for moving fewer experts
};

// weight [L, E] loads; prev [L, R] previous phy2log or nullptr.
// Writes phy2log [L, R], phy_rank [L, R] (replica index of each slot) and logcnt [L, E].
void rebalance(const double* weight, int64_t L, int64_t E, int64_t R, int64_t groups,
               int64_t nodes, int64_t gpus, const Options& opt, const int64_t* prev,
               int64_t* phy2log, int64_t* phy_rank, int64_t* logcnt);

// phy2log [L, R], tokens [L, E] (tokens of each logical expert in one batch) -> out [L, R]:
// tokens sent to each replica so that the most loaded GPU (slot / (R / gpus)) is minimal.
void redistribute(const int64_t* phy2log, const int64_t* tokens, int64_t L, int64_t E, int64_t R,
                  int64_t gpus, int64_t* out);

// Maximum-score perfect matching of an n x n score matrix: column matched to each row.
std::vector<int> hungarian_max(const std::vector<int64_t>& score, int n);

}  // namespace eplb
