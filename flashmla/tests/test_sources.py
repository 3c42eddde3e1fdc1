"""CPU checks of the CUDA sources that need no GPU."""
import pathlib
import subprocess
import sys

CSRC = pathlib.Path(__file__).resolve().parents[1] / "csrc"


def test_generated_wgmma_header_is_current():
    """csrc/wgmma.cuh is the output of csrc/gen_wgmma.py (regenerate it after editing the script)."""
    out = subprocess.run([sys.executable, str(CSRC / "gen_wgmma.py")], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out == (CSRC / "wgmma.cuh").read_text()


def _model(name, *args):
    return subprocess.run([sys.executable, str(CSRC / "models" / name), *args], capture_output=True, text=True,
                          timeout=120)


def test_wgmma_protocol_model_passes_and_catches_mutants():
    """CPU model of the shared wgmma consumers' protocol (csrc/models/wgmma_protocol_model.py), bf16
    and hi/lo P: passes over random schedules; each deliberately broken buffer or order is caught."""
    res = _model("wgmma_protocol_model.py", "--trials", "300", "--mutants")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all 4 mutants caught" in res.stdout


def test_fp8_wgmma_protocol_model_passes_and_catches_mutants():
    """CPU model of the FP8 wgmma kernel's mbarrier protocol (csrc/models/): the kernel's protocol
    passes over random schedules, and each deliberately broken count, wait or order is caught."""
    res = _model("wgmma_fp8_protocol_model.py", "--trials", "400", "--mutants")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all 6 mutants caught" in res.stdout


def test_fp8_wgmma_layout_model_passes_and_catches_mutants():
    """CPU model of the FP8 wgmma kernel's page staging (raw TMA boxes dequantised in place + RoPE TMA,
    read back through the wgmma descriptors) against dequantize_kvcache; each broken offset or order
    is caught."""
    res = _model("wgmma_fp8_layout_model.py", "--mutants")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all 8 mutants caught" in res.stdout


def test_swapab_fp8_model_passes_and_catches_mutants():
    """CPU model of the swap-AB FP8 kernel (csrc/models/swapab_fp8_model.py): its layouts, fragments
    and reductions (16- and 32-row instantiations) reproduce attention on dequantize_kvcache, its
    mbarrier / named-barrier protocol passes over random schedules (16 rows: two dequantiser warpgroups
    on a ring of 4 chunk slots; 32 rows: one on a ring of 3), and each deliberately broken offset, count,
    wait, stride, buffer or ring depth (odd, or 2: a hang) is caught."""
    res = _model("swapab_fp8_model.py", "--trials", "100", "--mutants")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all 18 mutants caught" in res.stdout

