"""Default kernels' SASS (encodings included) under the working tree's kernel headers vs those of a git ref: a switch
that must not change the default kernels (DEEPGEMM_SPLIT_K, ...) is checked with
    python deepgemm/scripts/sass_identity.py b6e0afe
(nvcc and cuobjdump needed; 28 configurations: FP8 / BF16 dense at small and large M, grouped, FP8 / FP32 out,
C, PIPE, both multicasts, BN256 RS, TMA store, swap-AB, K split on and off, the small-M kernel, split-K on 3 K
blocks). A configuration that the ref's headers reject (a kernel the ref did not have) is reported as NEW. Exit
status 1 if any differs."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from deepgemm.jit import compiler, kernels as K
from test_multicast import _sass_tools
tools = _sass_tools(); env = dict(os.environ, PATH=tools + os.pathsep + os.environ.get("PATH", ""))
ref = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
# the working tree's headers (compiler.read_header would give the installed package's); a header the ref lacks
# is taken from the working tree
root = Path(__file__).resolve().parents[2]
names = ("sm90_gemm.cuh", "sm90_gemm_swap.cuh", "sm90_gemv.cuh")
new_hdrs = {f"deepgemm/{n}": (root / "deepgemm/src/deepgemm/include/deepgemm" / n).read_text() for n in names}
old_hdrs = {}
for name, text in new_hdrs.items():
    old = subprocess.run(["git", "show", f"{ref}:deepgemm/src/deepgemm/include/{name}"], capture_output=True, text=True,
                         cwd=root)
    old_hdrs[name] = old.stdout if old.returncode == 0 else text
mk = K._make_config
B, F32 = torch.bfloat16, torch.float32
cfgs = [mk("dense", True, B, None, 2112, 7168, 64, 1, 132, "staged", "1"),
        mk("dense", True, B, None, 7168, 2048, 128, 1, 132, "staged", "1"),
        mk("dense", True, F32, F32, 4096, 7168, 64, 1, 132, "staged", "1"),
        mk("masked", True, B, None, 4096, 7168, 64, 8, 132, "staged", "1"),
        mk("dense", True, B, None, 7168, 2048, 4096, 1, 132, "staged", "1"),
        mk("dense", True, B, None, 2112, 7168, 4096, 1, 132, "staged", "1"),
        mk("dense", True, B, None, 7168, 16384, 4096, 1, 132, "staged", "1"),
        mk("dense", True, torch.float8_e4m3fn, None, 4096, 384, 37, 1, 132, "staged", "1"),
        mk("dense", True, B, B, 24576, 1536, 128, 1, 132, "direct", "1"),
        mk("contiguous", True, B, None, 4096, 7168, 32768, 1, 132, "staged", "1"),
        mk("contiguous", True, B, None, 7168, 2048, 32768, 1, 132, "staged", "1", bn256_env="0"),
        mk("dense", False, B, None, 4096, 7168, 4096, 1, 132, "staged", "1"),
        mk("dense", False, B, None, 7168, 2048, 64, 1, 132, "staged", "1"),
        mk("masked", False, B, None, 7168, 2048, 64, 4, 132, "staged", "1"),
        mk("dense", True, B, None, 7168, 2048, 4096, 1, 132, "staged", "1", pipe_env="1", bn256_env="0", tstore_env="0"),
        mk("dense", True, B, None, 7168, 2048, 4096, 1, 132, "staged", "1", mcast_env="1", bn256_env="0", tstore_env="0"),
        mk("dense", True, B, None, 7168, 2048, 64, 1, 132, "staged", "1", mcast_env="1"),
        mk("dense", True, B, None, 7168, 2048, 4096, 1, 132, "staged", "1", bn256_env="2"),
        mk("dense", True, B, None, 7168, 2048, 8, 1, 132, "staged", "1", swap_env="1"),
        mk("masked", True, B, None, 4096, 7168, 16, 8, 132, "staged", "1", swap_env="2"),
        mk("dense", True, B, None, 7168, 2048, 64, 1, 132, "staged", "0"),
        mk("dense", True, B, None, 2112, 7168, 64, 1, 132, "staged", "1", split_k_env="0"),
        mk("dense", True, B, F32, 7168, 2048, 4096, 1, 132, "staged", "1"),   # TMA-store epilogue + FP32 C
        mk("dense", True, B, B, 4096, 7168, 4096, 1, 132, "staged", "1"),     # staged epilogue + BF16 C
        mk("dense", True, F32, F32, 2112, 7168, 64, 1, 132, "staged", "1"),   # split-K (auto) + FP32 C
        mk("dense", True, B, None, 2112, 7168, 1, 1, 132, "staged", "1"),     # small-M kernel (auto)
        mk("dense", True, F32, B, 4096, 7168, 13, 1, 132, "staged", "1"),     # small-M, 16 rows, BF16 C
        mk("dense", True, torch.float8_e4m3fn, F32, 7168, 2048, 3, 1, 132, "staged", "1", gemv_env="1"),
        mk("dense", True, B, None, 104, 384, 24, 1, 132, "staged", "1", split_k_env="2", blocks_env="64x24")]
same = new = 0
for cfg in cfgs:
    out = []
    for hdrs in (old_hdrs, new_hdrs):
        compiler.read_header = lambda name="deepgemm/sm90_gemm.cuh", h=hdrs: h[name]
        os.environ["DEEPGEMM_CACHE_DIR"] = tempfile.mkdtemp()
        try:
            cubin, rec = compiler.build("deepgemm_kernel", K.kernel_source(cfg), backend="nvcc")
        except RuntimeError:
            if hdrs is new_hdrs:
                raise
            out.append(None)
            continue
        p = os.environ["DEEPGEMM_CACHE_DIR"] + "/k.cubin"; open(p, "wb").write(cubin)
        out.append(subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", p], capture_output=True, text=True, env=env, check=True).stdout)
    verdict = "NEW" if out[0] is None else "SAME" if out[0] == out[1] else "DIFF"
    same += verdict == "SAME"
    new += verdict == "NEW"
    print(verdict, cfg, flush=True)
print(f"{same}/{len(cfgs)} identical, {new} new")
sys.exit(0 if same + new == len(cfgs) else 1)
