#!/usr/bin/env bash
# Session 14, device call 7: run 6's binary lost 40% on every Fused point with both knobs off. Its combine kept
# the last-arrival flag in 16 bytes of static shared memory; here it is a __syncthreads_or instead. Base, c0
# (knobs off), c16 (combine at <= 16 rows) and w2 (K split over warps up to twice the resident warps), T = 1-64,
# alternating twice.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64 --routing uniform,balanced,zipf"
for i in 1 2; do
  timeout 100 ./carry/base-moe-gemm $S --csv $R/dec-base-$i.csv > $R/dec-base-$i.log 2>&1
  MOE_COMBINE_ROWS=0 timeout 100 ./carry/moe-gemm $S --csv $R/dec-c0-$i.csv > $R/dec-c0-$i.log 2>&1
  MOE_COMBINE_ROWS=16 timeout 100 ./carry/moe-gemm $S --csv $R/dec-c16-$i.csv > $R/dec-c16-$i.log 2>&1
  MOE_SPLIT_WANT=2 timeout 100 ./carry/moe-gemm $S --csv $R/dec-w2-$i.csv > $R/dec-w2-$i.log 2>&1
done
tar czf $OUT/run7.tgz -C $R .
