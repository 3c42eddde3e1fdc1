// Internal pieces of the planner shared by planner.cpp, packing.cpp and migrate.cpp.
#pragma once
#include <cstdint>
#include <vector>

namespace eplb::detail {

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

// packing.cpp
Packing greedy_pack(const std::vector<double>& w, int packs, const Spread* sp);
void repair_spread(Packing& P, const std::vector<double>& w, int packs, const Spread& sp);
void refine_pack(Packing& P, const std::vector<double>& w, int packs, const Spread* sp);
Replicas replicate_greedy(const std::vector<double>& nw, int64_t slots);

// migrate.cpp
void relabel(LayerPlan& p, const int64_t* prev, int64_t E, int64_t R, int64_t nodes, int64_t gpus);
LayerPlan from_phy2log(std::vector<int64_t> phy2log, int64_t E);
std::vector<int64_t> sticky_plan(const double* w, const int64_t* prev, const Shape& s, bool spread);
int64_t moves(const std::vector<int64_t>& a, const int64_t* b);

// planner.cpp
double max_gpu_load(const double* w, const std::vector<int64_t>& phy2log, int64_t E, int64_t gpus);

}  // namespace eplb::detail
