#!/usr/bin/env bash
# A/B/C... of several kernel variants in one device call (from the repository root):
#   bash flashmla/benchmarks/ab_variants.sh OUTDIR VARIANTS_DIR [bench_decode.py args]
# B is the working tree, built and installed as usual. Each subdirectory V of VARIANTS_DIR holds replacement files
# for flashmla/csrc/, each named as the file it replaces (checked: another name would be an unbuilt extra file);
# the variants are built in parallel, each into /tmp/ab/V. Then bench_decode.py with the given arguments runs
# under B and each variant in turn for ROUNDS rounds (default 2; BENCH_FIXED, by default --no-peers --rounds 2 --fp8
# --fp8-only --kernels auto, is set here), each table's rows printed. TESTK set: B's GPU tests of test_kernel_gpu.py
# matching it run first (tests_B.log). Logs: OUTDIR/build_*.log, OUTDIR/bench_<variant>_<round>.log.
set -u
OUT=$1 VDIR=$2; shift 2
VARS=()
for d in "$VDIR"/*/; do
  v=$(basename "$d")
  for f in "$d"*; do
    [ -f "flashmla/csrc/$(basename "$f")" ] || { echo "ab_variants.sh: $v: no flashmla/csrc/$(basename "$f") to replace"; exit 2; }
  done
  VARS+=("$v")
done
python3 -m pip install -q --no-build-isolation --no-deps ./flashmla > "$OUT/build_B.log" 2>&1 || { tail -30 "$OUT/build_B.log"; exit 1; }
rm -rf /tmp/ab && mkdir -p /tmp/ab
for v in "${VARS[@]}"; do
  (cp -r flashmla "/tmp/ab/src_$v" && cp "$VDIR/$v"/* "/tmp/ab/src_$v/csrc/" && rm -rf "/tmp/ab/src_$v/build" &&
   python3 -m pip install -q --no-build-isolation --no-deps --target "/tmp/ab/$v" "/tmp/ab/src_$v" > "$OUT/build_$v.log" 2>&1 \
   || echo "build $v failed: $(tail -5 "$OUT/build_$v.log")") &
done
wait
echo "builds done: B ${VARS[*]}"
if [ -n "${TESTK:-}" ]; then
  timeout 200 python3 -m pytest flashmla/tests/test_kernel_gpu.py -m gpu -q -p no:cacheprovider -k "$TESTK" \
    > "$OUT/tests_B.log" 2>&1
  echo "tests B rc=$? $(tail -1 "$OUT/tests_B.log")"; grep -E "^(FAILED|E  )" "$OUT/tests_B.log" | head -10
fi
for r in $(seq 1 "${ROUNDS:-2}"); do for v in B "${VARS[@]}"; do
  if [ "$v" = B ]; then unset PYTHONPATH; else export PYTHONPATH="/tmp/ab/$v"; fi
  timeout 150 python3 flashmla/benchmarks/bench_decode.py ${BENCH_FIXED:---no-peers --rounds 2 --fp8 --fp8-only --kernels auto} "$@" \
    > "$OUT/bench_${v}_$r.log" 2>&1
  echo "== $v round $r rc=$?"; grep -E "^ +[0-9]" "$OUT/bench_${v}_$r.log"
done; done
