#!/usr/bin/env bash
# Session 14, NOT RUN (no device time was left to start a machine). Live tiles: the SwapAb kernels skip the
# position copies and MMAs of n8 tiles that hold no row (a ballot over the block's sorted_ids).
# Binaries, built here from 43fd433 with `scripts/carry.sh` and gzipped into carryz/:
#   base-moe-gemm     43fd433 as is
#   live-moe-gemm     with live-tiles.patch (the shared-ring kernels only: SwapAb32, merged)
#   liveall-moe-gemm  with live-tiles-all.patch (those and SwapAb16's private rings)
#   gpu               the GPU tests of live-tiles-all.patch (every changed kernel)
# The decode points under Auto, the three alternating twice; then the whole GPU suite.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64,128,256 --routing uniform,balanced,zipf"
for i in 1 2; do
  for v in base live liveall; do
    timeout 60 ./carry/$v-moe-gemm $S --csv $R/dec-$v-$i.csv > $R/dec-$v-$i.log 2>&1
  done
done
timeout 170 ./carry/gpu --include-ignored --test-threads=1 > $R/gpu-liveall.log 2>&1
tar czf $OUT/run8.tgz -C $R .
