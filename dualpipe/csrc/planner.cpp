// Per-rank operation lists for 1F1B, interleaved 1F1B, ZB1P (ZB-H1), ZBV, DualPipe and DualPipeV.
#include <algorithm>
#include <cctype>

#include "schedule.hpp"

namespace dualpipe {

Sched parse_sched(const std::string& name) {
  std::string n;
  for (char ch : name) n += char(std::tolower(static_cast<unsigned char>(ch)));
  if (n == "1f1b") return Sched::k1F1B;
  if (n == "interleaved" || n == "interleaved1f1b" || n == "interleaved_1f1b") return Sched::kInterleaved;
  if (n == "zb1p" || n == "zbh1" || n == "zb-h1") return Sched::kZB1P;
  if (n == "zbv") return Sched::kZBV;
  if (n == "dualpipe") return Sched::kDualPipe;
  if (n == "dualpipev") return Sched::kDualPipeV;
  throw std::invalid_argument("kind must be one of '1F1B', 'interleaved', 'ZB1P', 'ZBV', 'DualPipe', 'DualPipeV', got '" +
                              name + "'");
}

const char* sched_name(Sched s) {
  switch (s) {
    case Sched::k1F1B: return "1F1B";
    case Sched::kInterleaved: return "interleaved";
    case Sched::kZB1P: return "ZB1P";
    case Sched::kZBV: return "ZBV";
    case Sched::kDualPipe: return "DualPipe";
    case Sched::kDualPipeV: return "DualPipeV";
  }
  return "?";
}

void check_args(Sched s, int ranks, int chunks, int v) {
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument(std::string(sched_name(s)) + ": " + what + " (got num_ranks=" + std::to_string(ranks) +
                                ", num_chunks=" + std::to_string(chunks) + ")");
  };
  if (ranks < 1 || ranks > (1 << 20)) fail("num_ranks must be in [1, 2^20]");
  if (chunks < 1 || chunks > (1 << 24) - 1) fail("num_chunks must be in [1, 2^24)");
  switch (s) {
    case Sched::kInterleaved:
      if (v < 1 || v > 15) fail("virtual_stages must be in [1, 15], got " + std::to_string(v));
      if (chunks % ranks != 0) fail("num_chunks must be a multiple of num_ranks");
      break;
    case Sched::kZBV:
    case Sched::kDualPipeV:
      if (chunks < 2 * ranks) fail("num_chunks must be >= 2 * num_ranks");
      break;
    case Sched::kDualPipe:
      if (ranks % 2 != 0) fail("num_ranks must be even");
      if (chunks % 2 != 0 || chunks < 2 * ranks) fail("num_chunks must be even and >= 2 * num_ranks");
      break;
    default:
      break;
  }
}

Topology make_topology(Sched s, int P, int v) {
  Topology t;
  t.ranks = P;
  t.phases = (s == Sched::k1F1B || s == Sched::kZB1P) ? 1 : (s == Sched::kInterleaved ? v : 2);
  t.prev.assign(size_t(P) * t.phases, -1);
  t.next.assign(size_t(P) * t.phases, -1);
  auto link = [&](int r0, int p0, int r1, int p1) {  // (r0, p0) feeds (r1, p1)
    t.next[t.index(r0, p0)] = t.index(r1, p1);
    t.prev[t.index(r1, p1)] = t.index(r0, p0);
  };
  if (s == Sched::kInterleaved) {  // virtual stage c * P + r lives on rank r, phase c
    for (int st = 0; st + 1 < P * v; ++st) link(st % P, st / P, (st + 1) % P, (st + 1) / P);
    t.stage_fraction = 1.0 / v;
    return t;
  }
  for (int r = 0; r + 1 < P; ++r) link(r, 0, r + 1, 0);  // phase 0 flows rank 0 -> P-1
  if (t.phases == 2) {
    for (int r = P - 1; r > 0; --r) link(r, 1, r - 1, 1);  // phase 1 flows rank P-1 -> 0
    if (s == Sched::kZBV || s == Sched::kDualPipeV) {     // V shape: turn around on the last rank
      link(P - 1, 0, P - 1, 1);
      t.stage_fraction = 0.5;
    }
  }
  return t;
}

namespace {

// Mirrors the original runtime's _forward_chunk / _backward_chunk / ... helpers: p2p ops that
// would be no-ops on this rank (first/last stage, local hand-off, forward-only) are not emitted,
// and COMMIT is emitted only when something is pending.
class Emitter {
 public:
  Emitter(const Topology& t, int rank, bool fwd_only, std::vector<Op>& out)
      : fwd_only_(fwd_only), out_(out), remote_prev_(t.phases), remote_next_(t.phases) {
    auto remote = [&](int j) { return j >= 0 && j / t.phases != rank; };
    for (int p = 0; p < t.phases; ++p) {
      remote_prev_[p] = remote(t.prev[t.index(rank, p)]);
      remote_next_[p] = remote(t.next[t.index(rank, p)]);
    }
  }

  void recv_forward(int p) { post(kRecvF, p, remote_prev_[p]); }
  void send_forward(int p) { post(kSendF, p, remote_next_[p]); }
  void recv_backward(int p) { post(kRecvB, p, !fwd_only_ && remote_next_[p]); }
  void send_backward(int p) { post(kSendB, p, !fwd_only_ && remote_prev_[p]); }
  void commit() {
    if (!pending_) return;
    commit_op_.arg = uint8_t(pending_);
    out_.push_back(commit_op_);
    pending_ = 0;
  }
  void forward(int p, bool recv = true, bool send = true) {
    if (recv) recv_forward(p);
    commit();
    put(kF, uint8_t(p));
    if (send) send_forward(p);
  }
  void backward(int p, bool zb = false, bool recv = true, bool send = true) {
    if (recv) recv_backward(p);
    commit();
    if (fwd_only_) return;
    put(uint8_t(kB | (zb ? kZB : 0)), uint8_t(p));
    if (send) send_backward(p);
  }
  void forward_backward(int p0, int p1, bool recv0 = true) {
    if (recv0) recv_forward(p0);
    recv_backward(p1);
    commit();
    if (fwd_only_) {
      put(kF, uint8_t(p0));
    } else {
      put(kFB, uint8_t(p0 | (p1 << 4)));
    }
    send_forward(p0);
    send_backward(p1);
  }
  void weight() {
    if (fwd_only_) return;
    commit();
    put(kW, 0);
  }
  // `count` iterations of `body`, which must depend on nothing but the emitter's state. The first
  // iteration is emitted as is (it may pick up posts pending from before the loop); if the second
  // leaves the emitter as it found it, every later iteration is identical to it, so the second is
  // stored once behind a REPEAT header.
  template <class Body>
  void loop(long count, Body body) {
    if (count <= 0) return;
    body();
    if (--count == 0) return;
    const Op before = commit_op_;
    const int pend = pending_;
    const size_t start = out_.size();
    body();
    --count;
    const size_t len = out_.size() - start;
    bool fixed = pend == pending_ && std::equal(before.post, before.post + pend, commit_op_.post);
    if (count == 0) return;
    if (!fixed || len == 0 || len > 0xFFFF) {
      while (count-- > 0) body();
      return;
    }
    size_t reps = size_t(count) + 1;
    Op hdr{kRepeat, uint8_t(reps & 0xFF), {uint8_t(len & 0xFF), uint8_t(len >> 8), uint8_t((reps >> 8) & 0xFF),
                                          uint8_t((reps >> 16) & 0xFF)}};
    out_.insert(out_.begin() + long(start), hdr);
  }

 private:
  void post(Kind k, int p, bool real) {
    if (!real) return;
    if (pending_ == kMaxPosts) throw std::logic_error("planner: more than 4 p2p ops in one batch");
    commit_op_.post[pending_++] = uint8_t((k - kRecvF) | (p << 2));
  }
  void put(uint8_t code, uint8_t arg) { out_.push_back(Op{code, arg, {0, 0, 0, 0}}); }

  bool fwd_only_;
  std::vector<Op>& out_;
  std::vector<char> remote_prev_, remote_next_;  // per phase: neighbour is on another rank
  int pending_ = 0;
  Op commit_op_{kCommit, 0, {0, 0, 0, 0}};
};

void plan_1f1b(Emitter& e, int P, int r, int m, bool zb) {
  int warm = std::min(P - 1 - r, m);
  int deferred = 0;  // ZB-H1: rank r keeps r weight-grad groups queued to fill the tail bubble
  auto bwd = [&]() {
    e.backward(0, zb);
    if (zb && ++deferred > r) {
      e.weight();
      --deferred;
    }
  };
  e.loop(warm, [&] { e.forward(0); });
  int steady = m - warm, ramp = zb ? std::min(steady, r) : 0;  // ZB: the first r iterations fill the queue
  for (int i = 0; i < ramp; ++i) {
    e.forward(0);
    bwd();
  }
  e.loop(steady - ramp, [&] {
    e.forward(0);
    bwd();
  });
  int cool = warm, ramp2 = zb ? std::min(cool, std::max(0, r - deferred)) : 0;
  for (int i = 0; i < ramp2; ++i) bwd();
  e.loop(cool - ramp2, [&] { bwd(); });
  e.loop(deferred, [&] { e.weight(); });
  deferred = 0;
}

void plan_interleaved(Emitter& e, int P, int r, int m, int v) {
  int total = m * v;
  int warm = std::min((P - r - 1) * 2 + (v - 1) * P, total);
  auto chunk_f = [&](int k) { return (k % (P * v)) / P; };
  auto chunk_b = [&](int k) { return v - 1 - (k % (P * v)) / P; };
  // runs of P consecutive steps share their chunk (phase), so each run is one loop
  auto run_len = [&](int k, int end) { return std::min(end, (k / P + 1) * P) - k; };
  for (int k = 0; k < warm;) {
    int n = run_len(k, warm), c = chunk_f(k);
    e.loop(n, [&] { e.forward(c); });
    k += n;
  }
  for (int i = 0; i < total - warm;) {
    int n = std::min(run_len(warm + i, total), run_len(i, total - warm));
    int cf = chunk_f(warm + i), cb = chunk_b(i);
    e.loop(n, [&] {
      e.forward(cf);
      e.backward(cb);
    });
    i += n;
  }
  for (int k = total - warm; k < total;) {
    int n = run_len(k, total), c = chunk_b(k);
    e.loop(n, [&] { e.backward(c); });
    k += n;
  }
}

// ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism"), the V-shape zero-bubble schedule.
void plan_zbv(Emitter& e, int P, int r, int m) {
  e.loop(2 * (P - r) - 1, [&] { e.forward(0); });
  e.loop(r, [&] { e.forward(1); e.forward(0); });
  e.loop(P - r, [&] { e.forward(1); e.backward(1, true); e.weight(); });
  // stable phase: f0 = 2P - r - 1 and f1 = P so far; first while stage 0 still has micro-batches
  // to forward, then until stage 1 has caught up
  int f0 = 2 * P - r - 1, f1 = P;
  auto stable = [&](bool with_f0) {
    if (with_f0) e.forward(0);
    e.backward(0, true);
    e.weight();
    e.forward(1);
    e.backward(1, true);
    e.weight();
  };
  e.loop(m - f0, [&] { stable(true); });
  e.loop(f0 - f1, [&] { stable(false); });
  e.loop(r, [&] { e.backward(0, true); e.backward(1, true); });
  e.loop(P - r, [&] { e.backward(0, true); e.weight(); });
  e.loop(2 * r, [&] { e.weight(); });  // the 2r weight grads deferred just above
}

// The DualPipe / DualPipeV eight-step schedule. For DualPipe, `x` flips the phase on the second
// half of the ranks (there "phase 0" of the schedule is the reverse direction); `hr` is the rank
// within its half, `P` the number of ranks of the (half) pipeline and `m` the micro-batches per
// input end; `mid` marks the ranks where the two halves meet (the turn of the V for DualPipeV).
void plan_dualpipe_steps(Emitter& e, int P, int hr, int m, int x, bool mid) {
  auto ph = [x](int p) { return p ^ x; };
  e.loop((P - hr - 1) * 2, [&] { e.forward(ph(0)); });  // 1: nF0
  int s2 = hr + 1;                                         // 2: nF0F1
  e.recv_forward(ph(0));
  auto step2 = [&](bool send1) {
    e.forward(ph(0), false, mid);
    e.recv_forward(ph(0));
    e.forward(ph(1), true, send1);
    if (!mid) e.send_forward(ph(0));
  };
  e.loop(s2 - 1, [&] { step2(true); });
  step2(!mid);
  e.loop(P - hr - 1, [&] {  // 3: nB1W1F1 (zero bubble)
    e.backward(ph(1), true);
    e.recv_forward(ph(1));
    e.weight();
    e.forward(ph(1), false);
  });
  int s4 = m - 2 * P + hr + 1;  // 4 (main): nF0B1F1B0
  if (s4 > 0) {
    if (mid) {  // not overlapped: shortens the bubble at the meeting point
      e.forward(ph(0), false, false);
      e.send_forward(ph(1));
      e.backward(ph(1), false, true, false);
      e.send_forward(ph(0));
      e.send_backward(ph(1));
    } else {
      e.forward_backward(ph(0), ph(1), false);
    }
    e.forward_backward(ph(1), ph(0));
  }
  e.loop(s4 - 1, [&] {
    e.forward_backward(ph(0), ph(1));
    e.forward_backward(ph(1), ph(0));
  });
  e.loop(P - hr - 1, [&] {  // 5: nB1F1B0
    e.backward(ph(1));
    e.forward_backward(ph(1), ph(0));
  });
  int s6 = hr + 1, half6 = s6 / 2;  // 6: nB1B0, the second half with zero bubble
  e.loop(half6, [&] { e.backward(ph(1), false); e.backward(ph(0), false); });
  e.backward(ph(1), hr % 2 == 1);
  e.backward(ph(0), true);
  e.loop(s6 - half6 - 1, [&] { e.backward(ph(1), true); e.backward(ph(0), true); });
  e.loop(P - hr - 1, [&] {  // 7: nWB0
    e.weight();
    e.backward(ph(0), true);
  });
  e.loop(hr + 1, [&] { e.weight(); });  // 8: nW
}

}  // namespace

std::vector<Op> plan_rank(Sched s, const Topology& t, int rank, int chunks, bool forward_only) {
  if (rank < 0 || rank >= t.ranks)
    throw std::invalid_argument("rank must be in [0, num_ranks), got " + std::to_string(rank));
  std::vector<Op> out;
  out.reserve(size_t(64) * (t.ranks + t.phases) + 64);
  Emitter e(t, rank, forward_only, out);
  int P = t.ranks;
  switch (s) {
    case Sched::k1F1B: plan_1f1b(e, P, rank, chunks, false); break;
    case Sched::kZB1P: plan_1f1b(e, P, rank, chunks, true); break;
    case Sched::kInterleaved: plan_interleaved(e, P, rank, chunks, t.phases); break;
    case Sched::kZBV: plan_zbv(e, P, rank, chunks); break;
    case Sched::kDualPipe: {
      int half = P / 2, hr = std::min(rank, P - 1 - rank);
      plan_dualpipe_steps(e, half, hr, chunks / 2, rank >= half, rank == half - 1 || rank == half);
      break;
    }
    case Sched::kDualPipeV: plan_dualpipe_steps(e, P, rank, chunks, 0, rank == P - 1); break;
  }
  e.commit();
  return out;
}

}  // namespace dualpipe
