#!/bin/bash
# Timing-only ablations of the installed kernel source (results are garbage under them): the tiled kernel as is,
# without its WGMMAs, and without its WGMMAs and A's scale loads. usage: bash ablate_math.sh OUT [shapes]
set -o pipefail
OUT=${1:-/tmp/out}; SHAPES=${2:-64x4096x28672,64x4096x7168,128x4096x7168,128x7168x16384}
python3 -m pip install --no-build-isolation --no-deps -q ./deepgemm 2>&1 | tail -2
H=$(python3 -c "import deepgemm, os; print(os.path.dirname(deepgemm.__file__))")/include/deepgemm/sm90_gemm.cuh
cp $H /tmp/sm90_gemm.orig
run() {  # label, then env assignments
  local label=$1; shift
  echo "== $label $*"
  env DEEPGEMM_CACHE_DIR=/tmp/dg_$label "$@" timeout 200 python3 deepgemm/benchmarks/kernel_timeline.py --shapes $SHAPES \
    --json $OUT/ablate_${label}_$(echo "$*" | tr -c 'A-Za-z0-9' _).json 2>&1 | grep -v Warning | grep "ours"
}
for variant in stock nomma nomma_nosfa; do
  cp /tmp/sm90_gemm.orig $H
  if [ $variant != stock ]; then sed -i 's/^\( *\)\(for (int k = 0; k < 4; ++k) \)\?Wgmma<BN, FP8>::mma(t, make_desc.*$/\1; \/\/ ablated/' $H; fi
  if [ $variant = nomma_nosfa ]; then
    sed -i 's/(FP8 ? sfa_box \* 4 : 0)/0/; s/^ *if (FP8) tma_load_2d(sSFA.*$/\/\/ ablated/' $H
  fi
  edits=$(grep -c ablated $H); want=$(case $variant in stock) echo 0;; nomma) echo 2;; *) echo 3;; esac)
  [ "$edits" = "$want" ] || { echo "ablate_math: $variant made $edits edits, expected $want (source changed?)"; cp /tmp/sm90_gemm.orig $H; exit 1; }
  run $variant
  run $variant DEEPGEMM_BLOCKS=64x32 DEEPGEMM_SPLIT_K=0
done
cp /tmp/sm90_gemm.orig $H
