// Schedule planner and discrete-event simulator for pipeline-parallel training.
//
// A plan is, for every pipeline rank, the ordered list of operations that rank executes.
// The vocabulary is the one the DualPipe runtime executes (see src/dualpipe/pipeline.py):
//   F(p)        forward of the next micro-batch of local stage ("phase") p
//   B(p[, zb])  backward of the next micro-batch of phase p; zb = input-grad only, the weight
//               grad is queued (WeightGradStore) and run by a later W
//   W           run the oldest queued weight-grad group (FIFO)
//   FB(p0, p1)  forward of phase p0 overlapped with backward of phase p1
//   RECV_F(p) / RECV_B(p) / SEND_F(p) / SEND_B(p)   post a p2p op into the pending batch
//   COMMIT      issue the pending batch (batch_isend_irecv) and wait for all of it
// Micro-batch ids are implicit: every (kind, phase) stream consumes micro-batches in order.
//
// Compact form (what plan_rank returns): the p2p posts are stored inside the COMMIT that issues
// them, in posting order (at most 4 per batch), so a rank's list is mostly F/B/W/FB + COMMIT.
// Posting a p2p op only records it; nothing happens until COMMIT, so listing the posts right
// before their COMMIT (the expanded form given to Python) is the same program.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace dualpipe {

enum Kind : uint8_t {
  kF = 0, kB = 1, kW = 2, kFB = 3, kRecvF = 4, kRecvB = 5, kSendF = 6, kSendB = 7, kCommit = 8,
  kRepeat = 9  // compact form only: run the next `len` entries `count` times
};
constexpr uint8_t kZB = 0x80;  // flag on kB
constexpr int kMaxPosts = 4;  // p2p posts per COMMIT

// Compute op: code = Kind | flags, arg = phase (kFB: phase0 | phase1 << 4).
// COMMIT:     code = kCommit, arg = number of posts, post[i] = (Kind - kRecvF) | phase << 2.
// REPEAT:     code = kRepeat, len = post[0] | post[1] << 8, count = arg | post[2] << 8 | post[3] << 16.
//             Steady-state loops are stored once, so a plan takes O(ranks * (ranks + phases)) memory
//             and the simulator runs the loop bodies from L1 cache.
struct Op {
  uint8_t code;
  uint8_t arg;
  uint8_t post[kMaxPosts];
};
inline Kind kind_of(Op op) { return Kind(op.code & 0x0F); }
inline size_t repeat_len(Op op) { return size_t(op.post[0]) | size_t(op.post[1]) << 8; }
inline size_t repeat_count(Op op) { return size_t(op.arg) | size_t(op.post[2]) << 8 | size_t(op.post[3]) << 16; }
// Calls f(op) for every op of the compact list `ops` in execution order (repeats unrolled).
template <class Fn>
void for_each_op(const std::vector<Op>& ops, Fn f) {
  for (size_t i = 0; i < ops.size(); ++i) {
    if (kind_of(ops[i]) != kRepeat) {
      f(ops[i]);
      continue;
    }
    size_t len = repeat_len(ops[i]), cnt = repeat_count(ops[i]);
    for (size_t k = 0; k < cnt; ++k)
      for (size_t j = 1; j <= len; ++j) f(ops[i + j]);
    i += len;
  }
}
inline Kind post_kind(uint8_t p) { return Kind(kRecvF + (p & 3)); }
inline int post_phase(uint8_t p) { return p >> 2; }

enum class Sched { k1F1B, kInterleaved, kZB1P, kZBV, kDualPipe, kDualPipeV };

// Which (rank, phase) feeds which: index i = rank * phases + phase; -1 = none (source / sink).
struct Topology {
  int ranks = 0, phases = 0;
  std::vector<int> prev, next;
  double stage_fraction = 1.0;  // layers of one stage / (all layers / ranks)
  int index(int rank, int phase) const { return rank * phases + phase; }
};

Sched parse_sched(const std::string& name);
const char* sched_name(Sched s);
// Throws std::invalid_argument (ValueError in Python) naming the argument on bad input.
void check_args(Sched s, int ranks, int chunks, int virtual_stages);
Topology make_topology(Sched s, int ranks, int virtual_stages);
std::vector<Op> plan_rank(Sched s, const Topology& t, int rank, int chunks, bool forward_only);

struct Costs {
  double f = 1, b = 2, w = 1, fb = 3, p2p = 0;  // per stage; b = full backward (input + weight)
  double commit = 0;  // time a rank spends issuing one p2p batch (counts as bubble, not busy)
};

struct SimResult {
  double makespan = 0;
  std::vector<double> busy, end;        // per rank
  std::vector<double> peak_activations;  // per rank, in stage-micro-batch units
  int64_t num_ops = 0;
  // timeline of compute ops (only when requested)
  std::vector<int32_t> t_rank, t_kind, t_phase, t_chunk, t_phase1, t_chunk1;
  std::vector<double> t_start, t_end;
};

SimResult simulate(const Topology& t, const std::vector<std::vector<Op>>& plan, const Costs& c,
                   bool timeline);

}  // namespace dualpipe
