"""CPU checks of the CUDA sources that need no GPU."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

CSRC = pathlib.Path(__file__).resolve().parents[1] / "csrc"


def test_generated_wgmma_header_is_current():
    """csrc/wgmma.cuh is the output of csrc/gen_wgmma.py (regenerate it after editing the script)."""
    out = subprocess.run([sys.executable, str(CSRC / "gen_wgmma.py")], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out == (CSRC / "wgmma.cuh").read_text()


def _bench_module(name):
    """A script of ../benchmarks imported as a module."""
    sys.path.insert(0, str(CSRC.parent / "benchmarks"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def _model(name, *args):
    return subprocess.run([sys.executable, str(CSRC / "models" / name), *args], capture_output=True, text=True,
                          timeout=120)


def test_wgmma_protocol_model_passes_and_catches_mutants():
    """CPU model of the shared wgmma consumers' protocol (csrc/models/wgmma_protocol_model.py), bf16
    and hi/lo P: passes over random schedules; each deliberately broken buffer or order is caught."""
    res = _model("wgmma_protocol_model.py", "--trials", "300", "--mutants")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all 4 mutants caught" in res.stdout


def test_bf16_wgmma_layout_model_is_consistent():
    """CPU model of the BF16 wgmma kernel's shared-memory layouts (csrc/models/wgmma_layout_model.py): TMA
    placement, descriptors, fragments, P stores and zeroing give S and O equal to direct products."""
    res = _model("wgmma_layout_model.py")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "epilogue map, zeroing: consistent" in res.stdout


def test_fp8_wgmma_protocol_model_passes_and_catches_mutants():
    """CPU model of the FP8 wgmma kernel's mbarrier protocol (csrc/models/), with bf16 and with f16 consumers
    (FLASHMLA_FP8_F16=1: Q converted by the producer, q_ready): the kernel's protocol passes over random
    schedules, and each deliberately broken count, wait or order is caught."""
    res = _model("wgmma_fp8_protocol_model.py", "--trials", "400", "--mutants")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all 9 mutants caught" in res.stdout


def test_fp8_wgmma_layout_model_passes_and_catches_mutants():
    """CPU model of the FP8 wgmma kernel's page staging (raw TMA boxes dequantised in place + RoPE TMA,
    read back through the wgmma descriptors) against dequantize_kvcache; each broken offset or order
    is caught."""
    res = _model("wgmma_fp8_layout_model.py", "--mutants")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all 8 mutants caught" in res.stdout


def test_swapab_fp8_model_passes_and_catches_mutants():
    """CPU model of the swap-AB kernel (csrc/models/swapab_fp8_model.py): its layouts, fragments
    and reductions (16- and 32-row instantiations) reproduce attention on dequantize_kvcache, its
    mbarrier / named-barrier protocol passes over random schedules (16 rows: two dequantiser warpgroups
    on a ring of 4 chunk slots; 32 rows: one on a ring of 3; BF16 cache: whole pages by TMA, the V tail
    zeroed between the consumer's SMAX and PT barriers), and each deliberately broken offset, count,
    wait, stride, buffer or ring depth (odd, or 2: a hang) is caught."""
    res = _model("swapab_fp8_model.py", "--trials", "100", "--mutants")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all 24 mutants caught" in res.stdout


def test_swapab_rf_model_passes_and_catches_mutants():
    """CPU model of the register-fed swap-AB kernel (csrc/models/swapab_rf_model.py), 16- and 32-row tiles: Q's
    conversion and column permutation, K's and V's register fragments, per-tile scales, sigma, the softmax with its
    lazily moved reference max and the epilogue (and, under FLASHMLA_FP8_Q=1, the e4m3 Q and K fragments; under
    FLASHMLA_FP8_PV=1, the e4m3 P^T planes and V fragments, exactly against the same P^T applied directly) reproduce
    attention on the float32-dequantised cache; its mbarrier protocol (a ring of 4 page slots released by both
    warpgroups, P^T / alpha by page parity, 1/l by request parity) passes over random schedules; each deliberately
    broken map, count, wait or buffer is caught."""
    res = _model("swapab_rf_model.py", "--trials", "30", "--mutants")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all 21 mutants caught" in res.stdout


def test_ncu_source_summary_reads_a_source_view(tmp_path):
    """benchmarks/ncu_source_summary.py on a three-instruction source view: sample shares, the barrier a wait
    loop polls, a role's span and the excess shared-memory wavefronts."""
    cols = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
            "L1 Wavefronts Shared Excessive", "L1 Wavefronts Shared", "L1 Wavefronts Shared Ideal",
            "stall_long_sb", "stall_short_sb", "stall_long_sb (Not Issued)"]
    rows = [["0x7f0000000010", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R4+URZ+0x33c50], R5", "10", "4", "0", "0", "0",
             "10", "0", "0"],
            ["0x7f0000000020", "@!P0  BRA 0x7f0000000400", "60", "4", "0", "0", "0", "60", "0", "0"],
            ["0x7f0000000030", "LDS.64 R6, [R7]", "30", "4", "8", "16", "8", "0", "30", "0"]]
    src = tmp_path / "src.csv"
    src.write_text('"Kernel Name","k"\n' + "\n".join(",".join(f'"{v}"' for v in r) for r in [cols] + rows) + "\n")
    script = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "ncu_source_summary.py"
    out = subprocess.run([sys.executable, str(script), str(src), "--role", "loads=LDS"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert "3 instructions, 100 samples: long_sb 70.0%, short_sb 30.0%" in out
    assert "60.0%" in out and "polls R4+URZ+0x33c50" in out
    assert "role loads [0x7f0000000030, 0x7f0000000030]: 30.0% of samples" in out
    assert "LDS.64 R6, [R7]" in out and "16 / 8" in out


def test_fp8_tensor_core_scale_study():
    """benchmarks/fp8_tc_scale_cpu.py (FP8 arithmetics: scales on the tensor-core side, f16 consumers, today's)
    on a short and a multi-page request with tiles over 5.5 decades: the tensor-core one within the GPU tests'
    tolerances of the float32-dequantised reference, the f16 one of the reference on its own f16 dequantisation,
    today's of the bf16-dequantised one; each misses another's oracle (bf16 K moves S by ~2^-9 relative)."""
    st = _bench_module("fp8_tc_scale_cpu")
    import torch

    from flashmla import ref
    from flashmla.quant import dequantize_kvcache, quantize_kvcache
    from flashmla.testing import make_inputs, wide_tile_cache
    q, kc, bt, sl = make_inputs(3, [130, 65, 0], 16, 2, seed=5)
    k8 = quantize_kvcache(wide_tile_cache(kc, 5))
    fp32 = ref.mla_decode_ref(q, dequantize_kvcache(k8, torch.float32), bt, sl, 512, causal=True)
    bf16 = ref.mla_decode_ref(q, dequantize_kvcache(k8), bt, sl, 512, causal=True)
    f16 = ref.mla_decode_ref(q, st.f16_dequantized(k8), bt, sl, 512, causal=True)
    tc, h, today = (st.emulate(q, k8, bt, sl, True, mode) for mode in ("tc", "f16", "today"))
    for (bad, omc, lerr) in (st.compare(*tc, *fp32), st.compare(*h, *f16), st.compare(*today, *bf16)):
        assert bad == 0 and omc < 1e-5 and lerr < 1e-5, (bad, omc, lerr)
    assert st.compare(*tc, *bf16)[0] > 0 and st.compare(*today, *fp32)[0] > 0 and st.compare(*h, *bf16)[0] > 0


def _nvcc():
    """An nvcc that targets sm_90a (CUDA >= 12), or None."""
    for cand in (shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if cand and os.path.exists(cand):
            ver = subprocess.run([cand, "--version"], capture_output=True, text=True, timeout=60).stdout
            rel = ver.split("release ")[-1].split(",")[0] if "release " in ver else "0"
            return cand if int(rel.split(".")[0]) >= 12 else None
    return None


@pytest.mark.skipif(_nvcc() is None, reason="needs nvcc of CUDA >= 12 (no GPU)")
def test_no_wgmma_is_serialised():
    """Every CUDA source compiles for sm_90a (the build's flags) without ptxas serialising wgmma
    instructions (its C7514/C7518/C7520 family): one wgmma wait or issue under a branch, or one in flight
    across it, makes ptxas wait after every wgmma of the kernel (session 18: the seesaw consumers ran at
    0.6x for that, with tests passing)."""
    flags = ["-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-O3", "--use_fast_math", "-Xptxas", "-v",
             "-I", str(CSRC), "-DFLASHMLA_WITH_CUDA"]
    procs = {cu.name: subprocess.Popen([_nvcc(), *flags, "-c", str(cu), "-o", os.devnull], stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True) for cu in sorted(CSRC.glob("*.cu"))}
    assert len(procs) >= 5
    for name, p in procs.items():
        out = p.communicate(timeout=600)[0]
        assert p.returncode == 0, f"{name} does not compile:\n{out[-3000:]}"
        bad = [line for line in out.splitlines() if "instructions are serialized" in line]
        assert not bad, f"{name}: ptxas serialises wgmma:\n" + "\n".join(bad)


def test_pipeline_model_basics():
    """benchmarks/pipeline_model_cpu.py's event engine: wgmma groups of two warpgroups share one tensor pipe
    (two groups of d each end at 2d); loads through two stages, freed as soon as they land, stream at one per gap
    when the latency is short, but cost a latency per two pages when it is long (the exposure that sank the
    seesaw); a consumer that holds each page longer than the gap paces the loads."""
    pm = _bench_module("pipeline_model_cpu")

    def mma_only():
        h = yield ("mma", 3.0)
        yield ("wait_mma", h)
    assert pm.Sim(2, 1, 0.0, 0.0).run([mma_only(), mma_only()], 0) == 6.0

    def consumer(n, hold):
        for j in range(n):
            yield ("load", j)
            yield ("delay", hold)
            yield ("release", j)
    assert pm.Sim(2, 1, 1.0, 2.0).run([consumer(10, 0.0)], 10) == 1.0 + 9 * 2.0
    assert pm.Sim(2, 1, 5.0, 2.0).run([consumer(10, 0.0)], 10) == 5 * 5.0 + 2.0   # pages land at 5, 7, 10, 12, ...
    assert pm.Sim(4, 1, 5.0, 2.0).run([consumer(10, 0.0)], 10) < 5 * 5.0 + 2.0    # four stages hide some of it
    assert pm.Sim(2, 1, 1.0, 2.0).run([consumer(10, 4.0)], 10) == 1.0 + 10 * 4.0
    # a page of the default order takes at least WG1's chain: S, the softmax, the barrier, its quarter of P V
    p = {"eff": 1.0, "sm": 1e-6, "bar": 1e-7, "lat": 8e-7, "bw": 3.2e12, "sm_fixed": 0.3}
    s_us, pv_us = 64 * 64 * 576 * 2 / pm.RATE * 1e6, 64 * 512 * 64 * 2 / pm.RATE * 1e6
    assert pm.per_page("default", 128, p, pages=16) >= s_us + 1.0 + 0.1 + pv_us / 4
