#!/usr/bin/env bash
# One device call that validates and measures flashmla's defaults on a CUDA machine (H200):
#   bash flashmla/benchmarks/device_run.sh OUTDIR [ab|fp8f16]   (from the repository root; ~570 s)
# default mode:
#   1. builds flashmla with CUDA;
#   2. smoke tests under a 60 s bound each, so that a hang or a crash drops only that kernel from the
#      later steps: the BF16 wgmma kernel (smoke.log), the FP8 wgmma kernel (smoke_fp8.log), the
#      swap-AB FP8 kernel at 16 and 32 rows (smoke_swapab.log);
#   3. all GPU tests (gpu_tests.log);
#   4. benchmarks of the defaults (FLASHMLA_KERNEL unset = auto, 5 pages per scheduler segment):
#      bench_quick: the quick BF16 table (16 shapes) with the peers (SDPA, Triton, reference, FlashInfer);
#      bench_fp8: the FP8 cache beside the BF16 cache at h_q 16/24/32/64/128 (batch 64/128, 4096/16384
#      keys), medians of 3 rounds in rotating order; bench: the full BF16 table until the time is up.
# ab mode: the scheduler's cost per segment, FLASHMLA_SPLIT_OVH = 3 and 8 beside the default 5 (auto;
#   auto+FLASHMLA_SPLIT_OVH=5 is the same code again: the noise floor), after the scheduler's GPU tests:
#   bench_ab (BF16, memory-bound shapes, uniform and ragged; AB_SHAPES overrides) and bench_ab_fp8
#   (FP8 cache at h_q 16/32, where 16384 keys schedule differently under 3/5/8), 3 rounds each.
# fp8f16 mode: FLASHMLA_FP8_F16=1 (the FP8 wgmma kernel with f16 consumers, opt-in): its smoke test under
#   60 s, the FP8 GPU tests (all FP8 kernels, the new f16 ones included), then bench_fp8f16: the FP8 cache at h_q
#   48/64/128 under auto and wgmma+FLASHMLA_FP8_F16=1 beside the BF16 cache, 3 rounds.
# fp8pv mode: FLASHMLA_FP8_PV=1 (e4m3 P^T in the register-fed kernel at 1..16 rows, opt-in): a smoke test, the
#   register-fed and swap-AB FP8 GPU tests, fp8_query_accuracy.py (fp8_accuracy.log), then bench_fp8pv: the FP8 cache at
#   h_q 8/16 under auto, FP8_Q=1, FP8_PV=1 and both, beside the BF16 cache, 3 rounds.
# FlashInfer peer: when the call carries .whl/ (run(..., carry=[".whl"]) with the flashinfer-python,
# apache-tvm-ffi and nvidia-cudnn-frontend wheels, ~22 MB), they are installed into /tmp/site and
# flashinfer_mla.py compiles (JIT) and checks FlashInfer's MLA decode before the benchmarks time it.
# The device tool returns at most 8 files: steps.log (every step's line), logs.tgz (build, wheel,
# smoke, test and FlashInfer logs) and up to three benchmark log + JSON pairs.
set -uo pipefail
START=$(date +%s); left() { echo $(( 570 - ($(date +%s) - START) )); }   # seconds left of the call
cap() { local t; t=$(left); [ "$t" -gt "$1" ] && t=$1; [ "$t" -lt 5 ] && t=5; echo "$t"; }   # min(left, $1), >= 5
OUT="$(mkdir -p "$1" && cd "$1" && pwd)"
# smoke LOG KEXPR: the GPU tests of test_kernel_gpu.py matching KEXPR, 60 s at most, into OUT/LOG.log;
# fails (status 1) on a hang or a crash, so that the caller can drop that kernel from the later steps
smoke() {
  timeout 60 "$PY" -m pytest flashmla/tests/test_kernel_gpu.py -q -p no:cacheprovider -k "$2" >"$OUT/$1.log" 2>&1
  local rc=$?; echo "$1: rc=$rc ($(tail -1 "$OUT/$1.log"))"; grep -E "^(FAILED|E  )" "$OUT/$1.log" | head -8
  ! { [ $rc -eq 124 ] || [ $rc -ge 128 ] || grep -qiE "illegal|misaligned|CUDA error|launch failure" "$OUT/$1.log"; }
}
# gpu_tests SECONDS [pytest args]: the GPU tests into OUT/gpu_tests.log, summary and failures to steps.log
gpu_tests() {
  local t0; t0=$(date +%s)
  timeout "$1" "$PY" -m pytest flashmla/tests -m gpu -q -p no:cacheprovider "${@:2}" >"$OUT/gpu_tests.log" 2>&1
  echo "gpu tests: rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/gpu_tests.log")"
  grep -E "^FAILED" "$OUT/gpu_tests.log" | head -20
}
# bench NAME SECONDS [bench_decode.py args]: one benchmark into OUT/NAME.log and OUT/NAME.json
bench() {
  local name=$1 t=$2; shift 2
  timeout "$t" "$PY" flashmla/benchmarks/bench_decode.py "$@" --json "$OUT/$name.json" >"$OUT/$name.log" 2>&1
  echo "$name: rc=$? (124 = cut at its time limit; $name.json holds the rows measured)"; cat "$OUT/$name.log"
}
exec > >(tee -a "$OUT/steps.log") 2>&1
pack_logs() {   # (ls exits 2 when one of the names is missing: list the files first, pipefail is on)
  (cd "$OUT" && f=$(ls build.log wheels.log smoke*.log gpu_tests.log flashinfer_check.log 2>/dev/null || true) \
     && [ -n "$f" ] && tar czf logs.tgz $f && rm -f $f)
}
trap pack_logs EXIT
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
unset FLASHMLA_KERNEL FLASHMLA_SPLIT_OVH FLASHMLA_SWAPAB_MAX_ROWS   # the defaults, whatever the caller set
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >"$OUT/wheels.log" 2>&1 \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}; echo "carried wheels: rc=$?"
fi
t0=$(date +%s)
"$PY" -m pip install -v --no-build-isolation --no-deps ./flashmla >"$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
if [ "${2:-}" = fp8f16 ]; then
  smoke smoke_fp8f16 "test_fp8_f16_consumers and randn" || exit 1
  gpu_tests 200 -k "fp8 or unknown_kernel"
  bench bench_fp8f16 "$(left)" --no-peers --rounds 3 --fp8 --fp8-only --kernels auto --fp8-heads 48,64,128 \
    --fp8-kernels "auto,wgmma+FLASHMLA_FP8_F16=1"
  exit 0
fi
if [ "${2:-}" = fp8pv ]; then
  smoke smoke_fp8pv "fp8_pv_exact and 0-0-16-1" || exit 1
  gpu_tests 200 -k "fp8_pv or swapab_rf or fp8_swapab or auto_kernel"
  timeout 120 "$PY" flashmla/benchmarks/fp8_query_accuracy.py >"$OUT/fp8_accuracy.log" 2>&1
  echo "fp8_query_accuracy: rc=$?"; grep -E "^worst" "$OUT/fp8_accuracy.log"
  bench bench_fp8pv "$(left)" --no-peers --rounds 3 --fp8 --fp8-only --kernels auto --fp8-heads 8,16 \
    --fp8-kernels "auto,auto+FLASHMLA_FP8_Q=1,auto+FLASHMLA_FP8_PV=1,auto+FLASHMLA_FP8_Q=1+FLASHMLA_FP8_PV=1"
  exit 0
fi
if [ "${2:-}" = ab ]; then
  # the scheduler's GPU tests (metadata kernel = ref.schedule_ref under several c; decodes under 0/5/64)
  gpu_tests 120 -k "metadata_matches_reference or split_overhead"
  C="auto+FLASHMLA_SPLIT_OVH=3,auto+FLASHMLA_SPLIT_OVH=8,auto+FLASHMLA_SPLIT_OVH=5"
  bench bench_ab_fp8 "$(cap 150)" --no-peers --rounds 3 --fp8 --fp8-only --kernels auto --fp8-heads 16,32 \
    --fp8-kernels "auto,$C"
  bench bench_ab "$(left)" --no-peers --rounds 3 --kernels "auto,$C" \
    --shapes "${AB_SHAPES:-64,128;1024,4096,16384;16,32,64;1;uniform,ragged}"
  exit 0
fi
KERNELS=auto; FP8_KERNELS=auto; FP8_HEADS=16,24,32,64,128; EXCL=()
if ! smoke smoke "(test_wgmma_matches_default_kernel and not fp8) or (test_odd_heads and wgmma)"; then
  echo "wgmma kernel hangs or crashes: dropped from the tests and the benchmark"; KERNELS=default; EXCL+=("wgmma")
fi
# the FP8 wgmma kernel (auto from 64 rows): a hang or crash drops it (and h_q 64/128 from the FP8 table)
if ! smoke smoke_fp8 "test_fp8_wgmma_matches_default_kernel or (test_fp8_kvcache and wgmma and 7-65)"; then
  echo "fp8 wgmma kernel hangs or crashes: dropped from the tests and the benchmark"; FP8_HEADS=16,24,32
  EXCL+=("(fp8 and wgmma)")
fi
# the swap-AB FP8 kernel (auto up to 32 rows: NR = 16 and NR = 32): a hang or crash leaves the FP8 table
# to the mma.sync FP8 path (FLASHMLA_KERNEL=default)
if ! smoke smoke_swapab "test_fp8_swapab_matches_default_kernel or (test_fp8_swapab_sweep and 7-65)"; then
  echo "fp8 swapab kernel hangs or crashes: dropped from the tests and the benchmark"
  FP8_KERNELS=default; FP8_HEADS=16,24,32; EXCL+=("swapab" "test_auto_kernel_choice" "split_overhead_scheduler")
fi
SEL=()
if [ ${#EXCL[@]} -gt 0 ]; then expr="not ${EXCL[0]}"; for e in "${EXCL[@]:1}"; do expr="$expr and not $e"; done; SEL=(-k "$expr"); fi
gpu_tests 150 ${SEL[@]+"${SEL[@]}"}
if "$PY" -c "import flashinfer" >/dev/null 2>&1; then   # JIT-compile and check FlashInfer's MLA once
  timeout 240 "$PY" flashmla/benchmarks/flashinfer_mla.py >"$OUT/flashinfer_check.log" 2>&1
  echo "flashinfer check: rc=$?"; tail -8 "$OUT/flashinfer_check.log"
fi
bench bench_quick "$(cap 150)" --quick --kernels "$KERNELS"
bench bench_fp8 "$(cap 120)" --no-peers --rounds 3 --fp8 --fp8-only --kernels "$KERNELS" --fp8-kernels "$FP8_KERNELS" \
  --fp8-heads "$FP8_HEADS"
t=$(left); [ "$t" -gt 30 ] || exit 0
bench bench "$t" --kernels "$KERNELS"
