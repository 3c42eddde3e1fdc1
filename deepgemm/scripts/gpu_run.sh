#!/bin/bash
# One device call: install, smoke (`python -m deepgemm`), GPU tests, benchmark. Logs under $OUT.
# usage (repo root): bash deepgemm/scripts/gpu_run.sh [quick|full|tests|bench|repro|tune|ab|splitk] [pytest -k expr]
# splitk: the same as `AB_COMPARE="--compare DEEPGEMM_SPLIT_K=0,auto,2,4,8" gpu_run.sh ab split_k` (~4 min): the
#     split-K GPU tests, then the 18 M <= 128 dense shapes under each value, cuBLAS blockwise timed beside them
# ab: smoke, the GPU tests selected by the -k expr, then bench_gemm.py --quick $AB_COMPARE
#     (default: BN256 x TMA_STORE, then MIN_SMS), e.g. gpu_run.sh ab "bn256 or tma_store"
# full: smoke, GPU tests, scripts/repro_masked.py, bench_gemm.py with the --compare switches
set -o pipefail
export PYTHONUNBUFFERED=1 DEEPGEMM_CACHE_DIR=/tmp/dgcache
MODE=${1:-quick}; KEXPR=${2:-}
if [ "$MODE" = splitk ]; then
  MODE=ab; KEXPR=${KEXPR:-split_k}; AB_COMPARE=${AB_COMPARE:---compare DEEPGEMM_SPLIT_K=0,auto,2,4,8}
  BENCH_TIMEOUT=${BENCH_TIMEOUT:-360}
fi
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
python3 -c "import torch, cuda.bindings; print('torch', torch.__version__, 'cuda-bindings', cuda.bindings.__version__)"
timeout 150 python3 -m pip install --no-build-isolation --no-deps -q ./deepgemm 2>&1 | tail -3
timeout 120 python3 -m deepgemm 2>&1 | tee $OUT/main.log || { echo "SMOKE FAILED"; exit 1; }
if [ "$MODE" != bench ] && [ "$MODE" != repro ] && [ "$MODE" != tune ]; then
  timeout ${PYTEST_TIMEOUT:-300} python3 -m pytest deepgemm/tests -m gpu -q -p no:cacheprovider --timeout 120 \
    ${KEXPR:+-k "$KEXPR"} -rf 2>&1 | tee $OUT/gpu_tests.log | tail -40
fi
if [ "$MODE" = full ] || [ "$MODE" = repro ]; then
  # K-split graph-replay check: 4 variants that must pass, 2 odd-stage negative controls (may fail or hang)
  timeout ${REPRO_TIMEOUT:-180} python3 deepgemm/scripts/repro_masked.py --replays 200 --timeout 30 2>&1 | tee $OUT/repro.log
  echo "repro exit: ${PIPESTATUS[0]}"
fi
if [ "$MODE" = tune ]; then  # forced block sizes / multicast beside the cost model's choice
  timeout ${TUNE_TIMEOUT:-450} python3 deepgemm/scripts/tune_blocks.py --budget ${TUNE_BUDGET:-420} ${TUNE_ARGS:-} --json $OUT/tune.json 2>&1 | tee $OUT/tune.log
fi
if [ "$MODE" != tests ] && [ "$MODE" != repro ] && [ "$MODE" != tune ]; then
  BARGS=$([ "$MODE" = ab ] && echo "--quick ${AB_COMPARE:---compare DEEPGEMM_BN256&DEEPGEMM_TMA_STORE=0&0,1&0,2&0,0&1,1&1,2&1 --compare DEEPGEMM_MIN_SMS=0,1}" || { [ "$MODE" = full ] || [ "$MODE" = bench ] && echo "--compare DEEPGEMM_KSPLIT=0,1 --compare DEEPGEMM_SMALL_M_BN=fill,pow2 --compare DEEPGEMM_SWAP_AB=0,1,2 --compare DEEPGEMM_PIPE=0,1 --compare DEEPGEMM_MULTICAST=0,1" || echo "--quick"; })
  timeout ${BENCH_TIMEOUT:-300} python3 deepgemm/benchmarks/bench_gemm.py $BARGS --json $OUT/bench.json 2>&1 | tee $OUT/bench.log | tail -30
fi
python3 - <<'PY' > $OUT/compiles.txt
import glob, json
for f in sorted(glob.glob('/tmp/dgcache/*.json')):
    m = json.load(open(f)); p = m['params']
    print(m['backend'], round(m['seconds'], 2), {k: p.get(k) for k in ('kind', 'fp8', 'n', 'k', 'bm', 'bn', 'stages', 'ksplit', 'swap', 'splitk')}, m['ptxas'][-200:])
PY
tail -5 $OUT/compiles.txt
cubin=$(ls /tmp/dgcache/*.cubin | head -1); cuobjdump --dump-sass $cubin | grep -oE "(QGMMA|HGMMA|UTMALDG|USETMAXREG)[.A-Z0-9x]*" | sort | uniq -c
