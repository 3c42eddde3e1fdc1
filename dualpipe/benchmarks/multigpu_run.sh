#!/usr/bin/env bash
# Issue 8 in one device call (2, 4 or 8 GPUs of one host, no network), from the repository root:
#     bash dualpipe/benchmarks/multigpu_run.sh OUTDIR
# 1. pip install --no-build-isolation --no-deps ./dualpipe   (install.log)
# 2. pytest -m "gpu or multigpu": DualPipe/DualPipeV vs the oracle over NCCL on 2..N GPUs, float32
#    (1e-6) and bf16, with/without the overlap hook (pytest.log, runtime_errors.json: worst errors)
# 3. bench_gpu_step.py for PP = number of GPUs: micro-batch 1 and 2, 4xPP and 8xPP chunks, with the
#    side-stream overlap rows (bench_gpu_step.log, bench_gpu_step.json, bench_gpu_timeline.png)
# Everything is bounded so the whole script ends within DUALPIPE_RUN_BUDGET seconds (default 570).
# DUALPIPE_BENCH_ARGS="..." is appended to the benchmark's arguments (later ones win), e.g.
# "--layers-per-rank 4" or "--micro-batch 1 --only DualPipeV,ScheduleZBVZeroBubble".
# At most 8 files land in OUTDIR (the device tool returns at most 8): summary.txt, install.log,
# pytest.log, runtime_errors.json, bench_gpu_step.log/.json, bench_gpu_timeline.png, and only if
# the benchmark was killed hard, bench_gpu_step.json.rawN.json (what rank 0 had written so far).
set -u
OUT=${1:?usage: bash dualpipe/benchmarks/multigpu_run.sh OUTDIR}
mkdir -p "$OUT"
# NVLink multicast stays off: on the shared hosts it can take every GPU out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
T0=$(date +%s)
BUDGET=${DUALPIPE_RUN_BUDGET:-570}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/summary.txt"; }

{
  date -u; nvidia-smi -L; nvidia-smi topo -m
  "$PY" -c "import torch, torch.distributed.pipelining as pp; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count(), 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None, 'ScheduleDualPipeV', hasattr(pp, 'ScheduleDualPipeV'))"
} > "$OUT/summary.txt" 2>&1
NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
BENCH_DEV=(--device cuda); PYTEST_K=()
if [ "${DUALPIPE_DRYRUN_CPU:-0}" = 1 ]; then  # rehearsal on a machine without GPUs: gloo, tiny sizes
  export DUALPIPE_MULTIGPU_ON_CPU=1
  NGPU=${DUALPIPE_DRYRUN_PROCS:-2}; BENCH_DEV=(--device cpu --quick); PYTEST_K=(-k "not 8gpu")
fi
say "gpus: $NGPU"

timeout 180 "$PY" -m pip install --no-build-isolation --no-deps ./dualpipe > "$OUT/install.log" 2>&1
rc=$?; say "install rc=$rc"
if [ $rc -ne 0 ]; then tail -30 "$OUT/install.log"; exit 1; fi

REPORT=$(mktemp -d)
T=$(( $(left) < 200 ? $(left) - 20 : 200 ))
DUALPIPE_TEST_REPORT=$REPORT timeout "$T" "$PY" -m pytest dualpipe/tests -m "gpu or multigpu" -q -rs \
  -p no:cacheprovider "${PYTEST_K[@]}" > "$OUT/pytest.log" 2>&1
say "pytest -m 'gpu or multigpu' rc=$? (timeout ${T}s): $(tail -1 "$OUT/pytest.log")"
"$PY" - "$REPORT" "$OUT/runtime_errors.json" <<'EOF'
import glob, json, os, sys
runs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json")))]
json.dump(runs, open(sys.argv[2], "w"), indent=1)
for r in runs:
    print(r["backend"], r["ranks"], "ranks:", ", ".join(f"{k} {v:.2e}" for k, v in r["worst"].items()))
EOF

if [ "$NGPU" -ge 2 ]; then
  T=$(( $(left) - 15 ))
  say "bench_gpu_step.py --procs $NGPU (timeout ${T}s)"
  timeout "$T" "$PY" dualpipe/benchmarks/bench_gpu_step.py "${BENCH_DEV[@]}" --procs "$NGPU" --micro-batch 1,2 \
    --chunks-per-rank 4,8 --steps 5 --warmup 2 --overlap --timeout $(( T - 25 )) \
    --json "$OUT/bench_gpu_step.json" --plot "$OUT/bench_gpu_timeline.png" ${DUALPIPE_BENCH_ARGS:-} > "$OUT/bench_gpu_step.log" 2>&1
  say "bench rc=$?: $(tail -1 "$OUT/bench_gpu_step.log")"
else
  say "fewer than 2 GPUs: no benchmark"
fi
rm -rf "$REPORT"
say "done"
cat "$OUT/summary.txt"
