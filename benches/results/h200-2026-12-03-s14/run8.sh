#!/usr/bin/env bash
# Session 14, NOT RUN (no device time was left to start a machine). With live-tiles.patch applied: the
# shared-ring kernels (SwapAb32, merged) skip the copies and MMAs of n8 tiles without any row (live_tiles).
# The decode points under Auto against base (43fd433), alternating twice; then the whole GPU suite on this
# binary.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64,128,256 --routing uniform,balanced,zipf"
for i in 1 2; do
  timeout 60 ./carry/base-moe-gemm $S --csv $R/dec-base-$i.csv > $R/dec-base-$i.log 2>&1
  timeout 60 ./carry/moe-gemm $S --csv $R/dec-live-$i.csv > $R/dec-live-$i.log 2>&1
done
timeout 170 ./carry/gpu --include-ignored --test-threads=1 > $R/gpu-live.log 2>&1
tar czf $OUT/run8.tgz -C $R .
