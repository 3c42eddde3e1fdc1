#!/usr/bin/env bash
# A/B of a kernel change in one device call (from the repository root):
#   bash flashmla/benchmarks/ab_builds.sh OUTDIR A_SOURCE [bench_decode.py args]
# B is the working tree; A is the same tree with csrc/<basename of A_SOURCE> replaced by A_SOURCE (e.g. a copy of
# the file before the change, kept outside csrc/). ab_variants.sh with that one variant, named A, after B's swap-AB
# and auto GPU tests (TESTK overrides the -k expression): logs build_{A,B}.log, tests_B.log, bench_{B,A}_<round>.log.
# Used in sessions 25 and 28 (BENCHMARKS.md).
set -u
OUT=$1 A_SRC=$2; shift 2
V=$(mktemp -d) && mkdir "$V/A" && cp "$A_SRC" "$V/A/" || exit 2
TESTK=${TESTK:-swapab or auto} exec bash "$(dirname "${BASH_SOURCE[0]}")/ab_variants.sh" "$OUT" "$V" "$@"
