#!/usr/bin/env bash
# One device call that validates and measures the wgmma variant next to the default kernel:
#   bash flashmla/benchmarks/device_run.sh OUTDIR [ab]   (from the repository root, on a CUDA machine;
#   ab: the opt-in fixed-cost switches (FLASHMLA_PDL, FLASHMLA_COMBINE_V, FLASHMLA_SPLIT_OVH) side by side instead of steps 2-4, see below;
#   and the FP8 cache at h_q 16/24/32 under swapab+FLASHMLA_SWAPAB_MAX_ROWS=32 beside default/swapab)
# 1. builds flashmla with CUDA; 2. a smoke test of the wgmma kernel under a timeout (a hang or a
# crash there drops wgmma from the later steps, so the default kernel's results still come back);
# 2b. the same for the FP8 wgmma variant (smoke_fp8.log; a hang or crash drops it alone); 2c. and for
# the swap-AB FP8 kernel (smoke_swapab.log);
# 3. all GPU tests (both kernels, BF16 and FP8); 4. bench_decode.py --kernels auto,default, quick
# table + the FP8 table (FP8 under default, wgmma and swapab beside BF16), then the full one until 570 s.
# FlashInfer peer: when the call carries .whl/ (run(..., carry=[".whl"]) with the flashinfer-python,
# apache-tvm-ffi and nvidia-cudnn-frontend wheels, ~22 MB), they are installed into /tmp/site and
# flashinfer_mla.py compiles (JIT) and checks FlashInfer's MLA decode before the benchmarks time it.
# Logs and JSON go to OUTDIR (small logs packed in logs.tgz). Fits the 600 s limit of one device call.
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
# the device tool returns at most 8 files: the step lines also go to steps.log, and the build, wheel,
# smoke, test and FlashInfer logs leave packed in logs.tgz (tar xzf logs.tgz)
exec > >(tee -a "$OUT/steps.log") 2>&1
pack_logs() {   # (ls exits 2 when one of the names is missing: list the files first, pipefail is on)
  (cd "$OUT" && f=$(ls build.log wheels.log smoke*.log gpu_tests.log flashinfer_check.log 2>/dev/null || true) \
     && [ -n "$f" ] && tar czf logs.tgz $f && rm -f $f)
}
trap pack_logs EXIT
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >"$OUT/wheels.log" 2>&1 \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}; echo "carried wheels: rc=$?"
fi
t0=$(date +%s)
"$PY" -m pip install -v --no-build-isolation --no-deps ./flashmla >"$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
if [ "${2:-}" = ab ]; then
  # A/B mode (bash device_run.sh OUT ab): the opt-in fixed-cost switches of the BF16 path side by side
  # on the short-sequence memory-bound shapes (BENCHMARKS.md, "Prepared, not yet measured: fixed costs
  # at short sequences"): FLASHMLA_PDL=1/2 (programmatic dependent launch of the combine / also of the
  # main kernel), FLASHMLA_COMBINE_V=2 (the combine's loads in parallel) and FLASHMLA_SPLIT_OVH=c
  # (scheduler charging c pages per segment), after smoke tests
  # and the GPU tests. A hang or crash of the PDL smoke drops the PDL variants and tests.
  smoke smoke "test_wgmma_matches_default_kernel or (test_split_overhead_scheduler_decodes and lens0)"
  smoke smoke_pdl "test_pdl_and_combine_v2_are_bit_identical"; pdl_ok=$?
  V="auto+FLASHMLA_PDL=0,auto+FLASHMLA_PDL=1,auto+FLASHMLA_PDL=2,auto+FLASHMLA_COMBINE_V=2,auto+FLASHMLA_SPLIT_OVH=2"
  V="$V,auto+FLASHMLA_SPLIT_OVH=5,auto+FLASHMLA_PDL=2+FLASHMLA_COMBINE_V=2+FLASHMLA_SPLIT_OVH=2"
  SEL=()
  if [ $pdl_ok -ne 0 ]; then
    echo "PDL hangs or crashes: dropped from the tests and the A/B"
    V="auto+FLASHMLA_PDL=0,auto+FLASHMLA_COMBINE_V=2,auto+FLASHMLA_SPLIT_OVH=2,auto+FLASHMLA_SPLIT_OVH=5"
    SEL=(-k "not pdl and not fixedcost and not split_overhead_scheduler")
  fi
  t0=$(date +%s)
  timeout 150 "$PY" -m pytest flashmla/tests -m gpu -q -p no:cacheprovider ${SEL[@]+"${SEL[@]}"} >"$OUT/gpu_tests.log" 2>&1
  echo "gpu tests: rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/gpu_tests.log")"
  grep -E "^FAILED" "$OUT/gpu_tests.log" | head -20
  # FP8 cache at 17..32 rows: the swap-AB kernel's opt-in NR = 32 instantiation
  # (FLASHMLA_SWAPAB_MAX_ROWS=32) beside the default (mma.sync FP8 path, auto's choice at h_q 32 today)
  # and the BF16 cache, h_q 16 / 24 / 32, s_q = 1; after a smoke test of NR = 32 (hang/crash: skipped)
  if ! smoke smoke_swapab32 "test_fp8_swapab_matches_default_kernel and (32-1 or 16-2)"; then
    echo "swapab NR=32 hangs or crashes: FP8 A/B skipped"
  else
    timeout "$(cap 150)" "$PY" flashmla/benchmarks/bench_decode.py --no-peers --fp8 --fp8-only --kernels auto \
      --fp8-kernels "default,swapab,swapab+FLASHMLA_SWAPAB_MAX_ROWS=32,auto+FLASHMLA_SWAPAB_MAX_ROWS=32" \
      --fp8-heads "${AB_FP8_HEADS:-16,24,32}" --json "$OUT/bench_ab_fp8.json" 2>&1 | tee "$OUT/bench_ab_fp8.log"
  fi
  # first column: auto (today's defaults); auto+FLASHMLA_PDL=0 is the same code again (the noise floor)
  timeout "$(left)" "$PY" flashmla/benchmarks/bench_decode.py --no-peers --kernels "auto,$V" \
    --shapes "${AB_SHAPES:-64,128;1024,4096;16,64;1;uniform,ragged}" --json "$OUT/bench_ab.json" 2>&1 | tee "$OUT/bench_ab.log"
  exit 0
fi
KERNELS=auto,default; FP8_KERNELS=default,wgmma,swapab; EXCL=()
if ! smoke smoke "(test_wgmma_matches_default_kernel and not fp8) or (test_odd_heads and wgmma)"; then
  echo "wgmma kernel hangs or crashes: dropped from the tests and the benchmark"; KERNELS=default; EXCL+=("wgmma")
fi
# the FP8 wgmma variant (mla_decode_wgmma_fp8.cu, first run ever): same treatment, on its own
if ! smoke smoke_fp8 "test_fp8_wgmma_matches_default_kernel or (test_fp8_kvcache and wgmma and 7-65)"; then
  echo "fp8 wgmma kernel hangs or crashes: dropped from the tests and the benchmark"; FP8_KERNELS=${FP8_KERNELS/wgmma,/}
  EXCL+=("(fp8 and wgmma)")
fi
# 2c. the swap-AB FP8 kernel (mla_decode_swapab_fp8.cu, <= 16 query rows, auto for the FP8 cache): same treatment
if ! smoke smoke_swapab "test_fp8_swapab_matches_default_kernel or (test_fp8_swapab_sweep and 7-65)"; then
  echo "fp8 swapab kernel hangs or crashes: dropped from the tests and the benchmark"
  FP8_KERNELS=${FP8_KERNELS%,swapab}; EXCL+=("swapab")
fi
SEL=()
if [ ${#EXCL[@]} -gt 0 ]; then expr="not ${EXCL[0]}"; for e in "${EXCL[@]:1}"; do expr="$expr and not $e"; done; SEL=(-k "$expr"); fi
t0=$(date +%s)
timeout 140 "$PY" -m pytest flashmla/tests -m gpu -q -p no:cacheprovider ${SEL[@]+"${SEL[@]}"} >"$OUT/gpu_tests.log" 2>&1
echo "gpu tests: rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/gpu_tests.log")"
grep -E "^FAILED" "$OUT/gpu_tests.log" | head -20
if "$PY" -c "import flashinfer" >/dev/null 2>&1; then   # JIT-compile and check FlashInfer's MLA once
  timeout 240 "$PY" flashmla/benchmarks/flashinfer_mla.py >"$OUT/flashinfer_check.log" 2>&1
  echo "flashinfer check: rc=$?"; tail -8 "$OUT/flashinfer_check.log"
fi
# 4. the quick table (16 shapes, includes h_q = 128), then the full one in the time that is left
timeout "$(cap 170)" "$PY" flashmla/benchmarks/bench_decode.py --quick --fp8 --kernels "$KERNELS" --fp8-kernels "$FP8_KERNELS" \
  --json "$OUT/bench_quick.json" \
  >"$OUT/bench_quick.log" 2>&1
echo "quick bench: rc=$?"; cat "$OUT/bench_quick.log"
t=$(left); [ "$t" -gt 30 ] || exit 0
timeout "$t" "$PY" flashmla/benchmarks/bench_decode.py --kernels "$KERNELS" --json "$OUT/bench.json" >"$OUT/bench.log" 2>&1
echo "full bench: rc=$? (124 = cut at the time limit; bench.json holds the rows measured)"
cat "$OUT/bench.log"
