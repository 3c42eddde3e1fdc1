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
