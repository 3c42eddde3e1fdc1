// Discrete-event simulator for the plans of planner.cpp.
//
// Model: each rank runs its op list in order on one compute "engine". Compute ops take their
// cost. At a COMMIT every send of its batch departs (it arrives p2p later at its receiver) and
// the rank waits until every recv of the batch has arrived.
// Messages travel on FIFO channels keyed by (receiver rank, receiver phase, F|B), so micro-batch
// ids never have to be stored. Ranks are advanced in sweeps: a rank runs until it blocks at a
// COMMIT whose message has not been sent yet; sweeps alternate direction so that activations flow
// down and gradients flow up in one sweep each. REPEAT blocks run from L1 cache.
#include <algorithm>
#include <deque>
#include <memory>
#include <numeric>

#include "schedule.hpp"

namespace dualpipe {
namespace {

struct Channel {  // ring buffer of arrival times (capacity a power of two)
  std::unique_ptr<double[]> buf{new double[8]};
  uint32_t mask = 7, head = 0, count = 0;
  void push(double x) {
    if (count == mask + 1) {
      std::unique_ptr<double[]> nb(new double[2 * (mask + 1)]);
      for (uint32_t i = 0; i < count; ++i) nb[i] = buf[(head + i) & mask];
      buf.swap(nb);
      head = 0;
      mask = 2 * mask + 1;
    }
    buf[(head + count) & mask] = x;
    ++count;
  }
  double pop() {
    double x = buf[head];
    head = (head + 1) & mask;
    --count;
    return x;
  }
};

struct RankState {
  size_t pc = 0, ri = 0;
  size_t loop_start = 0, loop_end = SIZE_MAX, loop_left = 0;  // active REPEAT block
  int64_t executed = 0;
  double t = 0, ready = 0, busy = 0, act = 0, peak = 0;
  bool flushed = false;
  int nrecv = 0, recvs[kMaxPosts];  // channels awaited by the COMMIT in progress
  std::vector<int> nf, nb;                 // per phase: micro-batches forwarded / backwarded
  std::deque<std::pair<int, int>> wq;      // (phase, chunk) of queued weight grads (timeline only)
};

}  // namespace

SimResult simulate(const Topology& topo, const std::vector<std::vector<Op>>& plan, const Costs& c, bool timeline) {
  const int P = topo.ranks, Q = topo.phases;
  if (int(plan.size()) != P) throw std::invalid_argument("plan must have one op list per rank");
  std::vector<Channel> ch(size_t(P) * Q * 2);
  std::vector<RankState> st(P);
  for (auto& s : st) {
    s.nf.assign(Q, 0);
    s.nb.assign(Q, 0);
  }
  SimResult res;
  auto record = [&](int r, int kind, int p, int k, int p1, int k1, double t0, double t1) {
    res.t_rank.push_back(r);
    res.t_kind.push_back(kind);
    res.t_phase.push_back(p);
    res.t_chunk.push_back(k);
    res.t_phase1.push_back(p1);
    res.t_chunk1.push_back(k1);
    res.t_start.push_back(t0);
    res.t_end.push_back(t1);
  };
  // per op code: duration, change of live activations, transient activation bump
  double cost[256] = {0}, dact[256] = {0}, bump[256] = {0};
  cost[kF] = c.f, dact[kF] = 1;
  cost[kB] = c.b, dact[kB] = -1;
  cost[kB | kZB] = c.b - c.w, dact[kB | kZB] = -1;
  cost[kW] = c.w;
  cost[kFB] = c.fb, bump[kFB] = 1;
  // route[4 * (rank * Q + phase) + post kind]: the channel a RECV_F / RECV_B reads or a
  // SEND_F / SEND_B writes (-1: no such neighbour)
  std::vector<int> route(size_t(P) * Q * 4);
  for (size_t j = 0; j < size_t(P) * Q; ++j) {
    route[4 * j + 0] = int(2 * j);
    route[4 * j + 1] = int(2 * j + 1);
    route[4 * j + 2] = topo.next[j] < 0 ? -1 : 2 * topo.next[j];
    route[4 * j + 3] = topo.prev[j] < 0 ? -1 : 2 * topo.prev[j] + 1;
  }
  std::vector<char> finished(P, 0);
  int remaining = P;
  for (int sweep = 0; remaining > 0; ++sweep) {
   bool progress = false;
   for (int k = 0; k < P; ++k) {
    const int r = (sweep & 1) ? P - 1 - k : k;
    if (finished[r]) continue;
    RankState& s = st[r];
    if (s.flushed && s.ri < size_t(s.nrecv) && ch[s.recvs[s.ri]].count == 0) continue;  // still blocked
    const int64_t ex0 = s.executed;
    const size_t ri0 = s.ri;
    const bool fl0 = s.flushed;
    const std::vector<Op>& ops = plan[r];
    const size_t n = ops.size();
    bool blocked = false;
    while (!blocked) {
      if (s.pc == s.loop_end) {  // end of a REPEAT body
        if (--s.loop_left > 0) {
          s.pc = s.loop_start;
        } else {
          s.loop_end = SIZE_MAX;
        }
        continue;
      }
      if (s.pc >= n) break;
      if (!timeline) {  // fast path: run compute ops up to the next COMMIT / loop end in registers
        const Op* o = ops.data();
        const size_t stop = std::min(n, s.loop_end), pc0 = s.pc;
        size_t pc = pc0;
        double t = s.t, busy = s.busy, act = s.act, peak = s.peak;
        for (; pc < stop && (o[pc].code & 0x0F) < kRecvF; ++pc) {
          const uint8_t code = o[pc].code;
          const double d = cost[code], a = act + dact[code];
          t += d;
          busy += d;
          peak = std::max(peak, a + bump[code]);
          act = a;
        }
        s.pc = pc, s.t = t, s.busy = busy, s.act = act, s.peak = peak;
        s.executed += int64_t(pc - pc0);
        if (pc == stop) continue;
      }
      const Op op = ops[s.pc];
      if (kind_of(op) == kRepeat) {
        s.loop_start = s.pc + 1;
        s.loop_end = s.pc + 1 + repeat_len(op);
        s.loop_left = repeat_count(op);
        ++s.pc;
        continue;
      }
      const int p = op.arg;
      switch (kind_of(op)) {
        case kF: {
          double t0 = s.t;
          s.t += c.f;
          s.busy += c.f;
          s.act += 1;
          s.peak = std::max(s.peak, s.act);
          if (timeline) record(r, kF, p, s.nf[p], -1, -1, t0, s.t);
          ++s.nf[p];
          break;
        }
        case kB: {
          bool zb = op.code & kZB;
          double d = zb ? c.b - c.w : c.b, t0 = s.t;
          s.t += d;
          s.busy += d;
          s.act -= 1;
          if (timeline) {
            record(r, kB, p, s.nb[p], -1, -1, t0, s.t);
            if (zb) s.wq.emplace_back(p, s.nb[p]);
          }
          ++s.nb[p];
          break;
        }
        case kW: {
          double t0 = s.t;
          s.t += c.w;
          s.busy += c.w;
          if (timeline) {
            if (s.wq.empty()) throw std::runtime_error("plan error: W without a queued weight grad on rank " + std::to_string(r));
            record(r, kW, s.wq.front().first, s.wq.front().second, -1, -1, t0, s.t);
            s.wq.pop_front();
          }
          break;
        }
        case kFB: {
          int p0 = op.arg & 0x0F, p1 = op.arg >> 4;
          double t0 = s.t;
          s.t += c.fb;
          s.busy += c.fb;
          s.peak = std::max(s.peak, s.act + 1);
          if (timeline) record(r, kFB, p0, s.nf[p0], p1, s.nb[p1], t0, s.t);
          ++s.nf[p0];
          ++s.nb[p1];
          break;
        }
        case kCommit: {
          if (!s.flushed) {  // issue the batch: sends depart now, recvs become awaited
            s.t += c.commit;
            for (int k = 0; k < op.arg; ++k) {  // channel of post (kind, phase): route[4 * (r * Q + phase) + kind]
              const uint8_t post = op.post[k];
              const int q = route[4 * size_t(topo.index(r, post_phase(post))) + (post & 3)];
              if (q < 0) throw std::runtime_error("plan error: send past the end of the pipeline");
              if ((post & 3) < 2) {
                s.recvs[s.nrecv++] = q;
              } else {
                ch[q].push(s.t + c.p2p);
              }
            }
            s.flushed = true;
            s.ready = s.t;
          }
          for (; s.ri < size_t(s.nrecv); ++s.ri) {
            Channel& q = ch[s.recvs[s.ri]];
            if (q.count == 0) {
              blocked = true;
              break;
            }
            s.ready = std::max(s.ready, q.pop());
          }
          if (blocked) continue;  // resume at this COMMIT when woken
          s.t = s.ready;
          s.nrecv = 0;
          s.ri = 0;
          s.flushed = false;
          break;
        }
        default:
          throw std::runtime_error("plan error: unknown op code " + std::to_string(op.code));
      }
      ++s.pc;
      ++s.executed;
    }
    progress |= s.executed != ex0 || s.ri != ri0 || s.flushed != fl0;
    if (s.pc >= n && s.loop_end == SIZE_MAX) {
      finished[r] = 1;
      --remaining;
    }
   }
   if (!progress) break;  // nobody can move: deadlock, reported below
  }
  for (int r = 0; r < P; ++r) {
    const RankState& s = st[r];
    if (s.pc < plan[r].size() || s.loop_end != SIZE_MAX)
      throw std::runtime_error("plan deadlocks: rank " + std::to_string(r) + " waits forever at op " +
                               std::to_string(s.pc) + " of " + std::to_string(plan[r].size()));
  }
  for (const Channel& q : ch)
    if (q.count) throw std::runtime_error("plan error: a message was sent but never received");
  res.busy.resize(P);
  res.end.resize(P);
  res.peak_activations.resize(P);
  for (int r = 0; r < P; ++r) {
    res.busy[r] = st[r].busy;
    res.end[r] = st[r].t;
    res.peak_activations[r] = st[r].peak;
    res.makespan = std::max(res.makespan, st[r].t);
    res.num_ops += st[r].executed;
  }
  return res;
}

}  // namespace dualpipe
