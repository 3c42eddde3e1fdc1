#!/usr/bin/env bash
# A/B of a kernel change in one device call (from the repository root):
#   bash flashmla/benchmarks/ab_builds.sh OUTDIR A_SOURCE [bench_decode.py args]
# B is the working tree, built and installed as usual; A is the same tree with csrc/<basename of A_SOURCE>
# replaced by A_SOURCE (e.g. a copy of the file before the change, kept outside csrc/), installed into /tmp/A.
# Runs B's swap-AB and auto GPU tests (TESTK overrides the -k expression), then bench_decode.py with the given
# arguments under A, B, A, B (2 rounds; BENCH_FIXED, by default --no-peers --rounds 2 --fp8 --fp8-only --kernels auto,
# is set here) and prints each table's rows. Used in sessions 25 and 28 (BENCHMARKS.md).
set -u
OUT=$1 A_SRC=$2; shift 2
A_NAME=$(basename "$A_SRC")
# A_SRC must be named as the kernel file it replaces: another name would add an unbuilt file, and A would be B
[ -f "flashmla/csrc/$A_NAME" ] || { echo "ab_builds.sh: no flashmla/csrc/$A_NAME to replace"; exit 2; }
python3 -m pip install -q --no-build-isolation --no-deps ./flashmla > "$OUT/build_B.log" 2>&1 || { tail -30 "$OUT/build_B.log"; exit 1; }
rm -rf /tmp/fA /tmp/A && cp -r flashmla /tmp/fA && cp "$A_SRC" "/tmp/fA/csrc/$A_NAME" && rm -rf /tmp/fA/build
python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/A /tmp/fA > "$OUT/build_A.log" 2>&1 \
  || { tail -30 "$OUT/build_A.log"; exit 1; }
echo builds ok
timeout 200 python3 -m pytest flashmla/tests/test_kernel_gpu.py -m gpu -q -p no:cacheprovider -k "${TESTK:-swapab or auto}" \
  > "$OUT/tests_B.log" 2>&1
echo "tests B rc=$? $(tail -1 "$OUT/tests_B.log")"; grep -E "^(FAILED|E  )" "$OUT/tests_B.log" | head -10
for r in 1 2; do for v in A B; do
  if [ $v = A ]; then export PYTHONPATH=/tmp/A; else unset PYTHONPATH; fi
  timeout 150 python3 flashmla/benchmarks/bench_decode.py ${BENCH_FIXED:---no-peers --rounds 2 --fp8 --fp8-only --kernels auto} "$@" \
    > "$OUT/bench_${v}_$r.log" 2>&1
  echo "== $v round $r rc=$?"; grep -E "^ +[0-9]" "$OUT/bench_${v}_$r.log"
done; done
