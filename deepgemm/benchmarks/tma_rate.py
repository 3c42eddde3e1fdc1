"""How fast one SM's TMA unit fills shared memory, with and without cluster multicast: a GEMM's load pattern, no math.

    python deepgemm/benchmarks/tma_rate.py [--k 28672] [--json PATH]

Each CTA streams K / 128 blocks through a ring of shared-memory stages, as a small-M FP8 GEMM's producer does: per
block, AR rows of 128 B of "A" (the same rows for every CTA, as activations) and BR rows of "B" (its own rows, as
weights). With clusters of CL CTAs, each CTA issues AR / CL rows of A multicast to the whole cluster, and a stage is
refilled only when every CTA of the cluster has released it (as the GEMM kernel does with MCAST). One warp per CTA
consumes: it waits for each stage and releases it at once. The "B by cp.async" variants load B through the
load/store unit instead (four warps, 16 bytes a thread a copy, each arriving on the stage's barrier), beside the TMA
unit's A. "+SFA" variants add the GEMM's third box per stage, 64 floats of A's scales (all CTAs the same ones, or
"own" columns each; "x4": one box of 4 K blocks' scales every 4th stage). "N blocks a box" variants load A and B by
3-D tensor maps, N K blocks per box, a stage holding N blocks (the ring --stages / N deep, the same bytes). Prints
per variant: time, B's rate from DRAM, bytes received per SM per clock and bytes requested by each SM's own TMA per
clock (at --clock-ghz). BENCHMARKS.md run 33 has the H200's figures."""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gemm import time_graph  # noqa: E402

from deepgemm.jit import compiler, runtime  # noqa: E402

SOURCE = r'''
__device__ __forceinline__ void tma_load_3d(dg::u32 dst, const dg::TmaDesc* desc, dg::u32 bar, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3, %4, %5}], [%2];"
               :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(desc)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
// KPR > 1: each box brings KPR K blocks of its rows ([KPR][rows][128 B], 3-D maps), a stage holds KPR blocks
template <int CL, int AR, int BR, int STAGES, int KB, bool LSU, int SF, bool SF_OWN, int KPR>
__device__ __forceinline__ void stream_body(const dg::TmaDesc& ta, const dg::TmaDesc& tb, const dg::TmaDesc& tsf,
                                            const unsigned char* b) {
  using namespace dg;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  u32 base = smem_addr(smem_raw);
  base += (1024 - (base & 1023)) & 1023;
  static_assert(KPR == 1 || (CL == 1 && !LSU && (!SF || SF == KPR)), "KPR > 1: no clusters, no cp.async, SF = KPR");
  constexpr u32 A_BYTES = AR * 128 * KPR, B_BYTES = BR * 128 * KPR, STAGE = A_BYTES + B_BYTES;
  const u32 sf_ring = base + STAGES * STAGE;  // SF: 64 floats of "A's scales" per K block, SF blocks a box
  const u32 bars = sf_ring + (SF ? STAGES * 256 * KPR : 0);  // full[s], then empty[s]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  u32 rank = 0;
  if (CL > 1) asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bars + 8 * s, LSU ? 1 + 128 : 1);  // LSU: each B loader's cp.async arrival counts
      mbar_init(bars + 8 * (STAGES + s), CL);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (CL > 1) cluster_sync();
  if (warp == 0 && lane == 0) {
    for (int j = 0; j < KB / KPR; ++j) {
      const int kb = j * KPR;
      const u32 s = j % STAGES, ph = (j / STAGES) & 1;
      mbar_wait(bars + 8 * (STAGES + s), ph ^ 1);
      const bool sf_now = SF && kb % SF == 0;  // an SF-block box lands with every SF-th block
      mbar_expect_tx(bars + 8 * s, (LSU ? A_BYTES : STAGE) + (sf_now ? SF * 256 : 0));
      if (sf_now) {
        const u32 slot = KPR > 1 ? s * KPR * 256 : (s / SF) * SF * 256;
        tma_load_2d(sf_ring + slot, &tsf, bars + 8 * s, SF_OWN ? blockIdx.x * 64 : 0, kb);
      }
      if (KPR > 1) {
        if (AR) tma_load_3d(base + s * STAGE, &ta, bars + 8 * s, 0, 0, kb);
        tma_load_3d(base + s * STAGE + A_BYTES, &tb, bars + 8 * s, 0, blockIdx.x * BR, kb);
        continue;
      }
      if (AR) {
        if (CL == 1) {
          tma_load_2d(base + s * STAGE, &ta, bars + 8 * s, kb * 128, 0);
        } else {
          constexpr int PART = AR / CL;
          tma_load_2d_mcast(base + s * STAGE + rank * PART * 128, &ta, bars + 8 * s, kb * 128, rank * PART,
                            (unsigned short)((1u << CL) - 1));
        }
      }
      if (!LSU) tma_load_2d(base + s * STAGE + A_BYTES, &tb, bars + 8 * s, kb * 128, blockIdx.x * BR);
    }
  } else if (LSU && warp >= 2) {
    // B by cp.async through the load/store unit, 16 bytes a thread a copy, beside the TMA unit's A
    const int t = threadIdx.x - 64;
    for (int kb = 0; kb < KB; ++kb) {
      const u32 s = kb % STAGES, ph = (kb / STAGES) & 1;
      mbar_wait(bars + 8 * (STAGES + s), ph ^ 1);
      for (int c = t; c < BR * 8; c += 128) {
        const int r = c / 8, j = c % 8;
        const unsigned char* src = b + ((long long)blockIdx.x * BR + r) * (KB * 128) + kb * 128 + j * 16;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                     :: "r"(base + s * STAGE + A_BYTES + r * 128 + j * 16), "l"(src) : "memory");
      }
      asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(bars + 8 * s) : "memory");
    }
  } else if (warp == 1) {
    for (int j = 0; j < KB / KPR; ++j) {
      const u32 s = j % STAGES, ph = (j / STAGES) & 1;
      mbar_wait(bars + 8 * s, ph);
      __syncwarp();
      if (lane == 0) {
        if (CL == 1) mbar_arrive(bars + 8 * (STAGES + s));
        for (int p = 0; p < (CL > 1 ? CL : 0); ++p) mbar_arrive_cluster(bars + 8 * (STAGES + s), p);
      }
    }
  }
  if (CL > 1) cluster_sync();
}
'''

# (name, cluster size, A rows, B rows, CTAs, B by cp.async[, SF, SF own]): the 64-row GEMM tiles of BENCHMARKS.md
# run 32 and cuBLAS's 48 x 64 x 4. SF > 0 adds the GEMM's third box, 64 floats of A's scales per K block (the
# MN-major layout: K block kb's 64 floats are row kb of a [K / 128, 64 x CTAs] tensor), SF blocks' rows in one
# box with every SF-th K block; SF own: each CTA reads its own 64 columns (else all read the same, as the GEMM does);
# KPR: K blocks per box of A and B (3-D maps; a stage holds KPR blocks, the ring has --stages / KPR stages)
VARIANTS = [
    ("64x32, 128 CTAs", 1, 64, 32, 128, False),
    ("64x32, 128 CTAs, +SFA", 1, 64, 32, 128, False, 1, False),
    ("64x32, 128 CTAs, +SFA own", 1, 64, 32, 128, False, 1, True),
    ("64x32, 128 CTAs, +SFA x4", 1, 64, 32, 128, False, 4, False),
    ("64x32, 128 CTAs, +SFA x4 own", 1, 64, 32, 128, False, 4, True),
    ("64x48, 86 CTAs", 1, 64, 48, 86, False),
    ("64x48, 86 CTAs, +SFA", 1, 64, 48, 86, False, 1, False),
    ("64x48, 86 CTAs, +SFA x4", 1, 64, 48, 86, False, 4, False),
    ("64x32, 128 CTAs, 2 blocks a box", 1, 64, 32, 128, False, 0, False, 2),
    ("64x32, 128 CTAs, 2 a box, +SFA", 1, 64, 32, 128, False, 2, False, 2),
    ("64x32, 128 CTAs, 4 blocks a box", 1, 64, 32, 128, False, 0, False, 4),
    ("64x48, 86 CTAs, 2 blocks a box", 1, 64, 48, 86, False, 0, False, 2),
    ("64x64, 128 CTAs", 1, 64, 64, 128, False),
    ("64x64, 128 CTAs, 2 blocks a box", 1, 64, 64, 128, False, 0, False, 2),
    ("B only 48 rows, 88 CTAs, 2 a box", 1, 0, 48, 88, False, 0, False, 2),
    ("64x48, 86 CTAs, pairs", 2, 64, 48, 86, False),
    ("64x48, 88 CTAs, quads", 4, 64, 48, 88, False),
    ("64x32, 128 CTAs, quads", 4, 64, 32, 128, False),
    ("64x48, 86 CTAs, B by cp.async", 1, 64, 48, 86, True),
    ("64x32, 128 CTAs, B by cp.async", 1, 64, 32, 128, True),
    ("B only 48 rows, 88 CTAs", 1, 0, 48, 88, False),
    ("B only 48 rows, 132 CTAs", 1, 0, 48, 132, False),
]


def threads(lsu: bool) -> int:
    return 192 if lsu else 64  # producer warp, consumer warp (+ 4 warps loading B by cp.async)


def kernel(cl: int, ar: int, br: int, stages: int, kb: int, lsu: bool, sf: int, sf_own: bool,
           kpr: int) -> runtime.Kernel:
    src = (compiler.read_header() + SOURCE
           + f'extern "C" __global__ void __launch_bounds__({threads(lsu)}, 1)'
           + (f" __cluster_dims__({cl}, 1, 1)" if cl > 1 else "")
           + " tma_rate(const __grid_constant__ dg::TmaDesc ta, const __grid_constant__ dg::TmaDesc tb,"
           + " const __grid_constant__ dg::TmaDesc tsf, const unsigned char* b) {\n"
           + f"  stream_body<{cl}, {ar}, {br}, {stages}, {kb}, {str(lsu).lower()}, {sf}, {str(sf_own).lower()}, {kpr}>"
           + "(ta, tb, tsf, b);\n}\n")
    cubin, _ = compiler.build("tma_rate", src)
    return runtime.Kernel(cubin, "tma_rate", 1024 + stages * ((ar + br) * 128 + (256 if sf else 0)) * kpr + 16 * stages)


def tensor_map_kblocks(t: torch.Tensor, box_rows: int, kpr: int) -> runtime.TmaDesc:
    """3-D map of a [rows, K] uint8 tensor as (128 bytes of a K block, row, K block): a box of box_rows rows and
    kpr K blocks lands as kpr [box_rows, 128] tiles, one after the other."""
    rows, k = t.shape
    desc = runtime.TmaDesc()
    dims = (ctypes.c_uint64 * 3)(128, rows, k // 128)
    strides = (ctypes.c_uint64 * 2)(k, 128)
    box = (ctypes.c_uint32 * 3)(128, box_rows, kpr)
    estr = (ctypes.c_uint32 * 3)(1, 1, 1)
    err = runtime.lib().cuTensorMapEncodeTiled(ctypes.byref(desc), runtime.DT_UINT8, 3, ctypes.c_void_p(t.data_ptr()),
                                               dims, strides, box, estr, 0, runtime.SWIZZLE_128B,
                                               runtime.L2_PROMO_256B, 0)
    runtime.check(err, f"3-D cuTensorMapEncodeTiled(rows={rows}, k={k}, box_rows={box_rows}, kpr={kpr})")
    return desc


def run(name: str, cl: int, ar: int, br: int, ctas: int, lsu: bool, k: int, stages: int, clock: float,
        sf: int = 0, sf_own: bool = False, kpr: int = 1) -> dict:
    kb = k // 128
    stages //= kpr
    if sf and (stages % sf or kb % sf):
        raise ValueError(f"SF {sf}: must divide the stages ({stages}) and K blocks ({kb})")
    a = torch.randint(0, 255, (max(ar, 8), k), dtype=torch.uint8, device="cuda")
    b = torch.randint(0, 255, (ctas * br, k), dtype=torch.uint8, device="cuda")
    if kpr > 1:
        ta, tb = tensor_map_kblocks(a, max(ar, 8), kpr), tensor_map_kblocks(b, br, kpr)
    else:
        ta = runtime.tensor_map_2d(a.data_ptr(), runtime.DT_UINT8, k, a.shape[0], k, 128, max(ar // cl, 1),
                                   runtime.SWIZZLE_128B)
        tb = runtime.tensor_map_2d(b.data_ptr(), runtime.DT_UINT8, k, b.shape[0], k, 128, br, runtime.SWIZZLE_128B)
    tsf = runtime.TmaDesc()  # (unused without SF)
    if sf:
        sfa = torch.rand(kb, 64 * ctas, device="cuda")
        tsf = runtime.tensor_map_2d(sfa.data_ptr(), runtime.DT_FLOAT32, 64 * ctas, kb, 64 * ctas * 4, 64, sf,
                                    runtime.SWIZZLE_NONE)
    kern = kernel(cl, ar, br, stages, kb, lsu, sf, sf_own, kpr)
    dev = torch.cuda.current_device()
    launch = lambda: kern.launch(dev, ctas, threads(lsu), [ta, tb, tsf, ctypes.c_void_p(b.data_ptr())])  # noqa: E731
    t = time_graph([launch] * 20)  # a graph of 20 launches, median of 5 replays
    recv = (ar + br) * 128 * kb  # bytes each CTA receives
    issued = (ar // cl + (0 if lsu else br)) * 128 * kb  # by the SM's TMA unit
    return {"name": name, "sf": sf, "sf_own": sf_own, "kpr": kpr, "lsu": lsu, "cl": cl, "ar": ar, "br": br,
            "ctas": ctas, "k": k, "stages": stages, "us": t * 1e6,
            "b_tbs": ctas * br * 128 * kb / t / 1e12, "recv_b_per_clk": recv / t / clock,
            "issued_b_per_clk": issued / t / clock, "total_recv_tbs": ctas * recv / t / 1e12, "clock_hz": clock}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=28672)
    ap.add_argument("--stages", type=int, default=12)
    ap.add_argument("--clock-ghz", type=float, default=1.77,
                    help="SM clock for the per-clock figures (Nsight Compute saw 1.72-1.79 GHz in run 32)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("tma_rate: needs a CUDA device")
        return
    rows = []
    for name, cl, ar, br, ctas, lsu, *sf_kpr in VARIANTS:
        r = run(name, cl, ar, br, ctas, lsu, args.k, args.stages, args.clock_ghz * 1e9, *sf_kpr)
        rows.append(r)
        print(f"{name:32s} {r['us']:7.1f} us  B {r['b_tbs']:.2f} TB/s  into the SMs {r['total_recv_tbs']:.2f} TB/s  "
              f"per SM: received {r['recv_b_per_clk']:.1f} B/clk, requested by its TMA {r['issued_b_per_clk']:.1f} B/clk",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
