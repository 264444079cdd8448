#!/usr/bin/env bash
# Session 14, device call 3: prototype of GEMM2 split over K across CTAs (grid z; f32 partials summed by
# sum_slots with GEMM2's epilogue). MOE_GEMM2_SPLITS = 1 (off), 2, 4, 8 on the decode points under Auto, and
# the Fused GPU tests with splits 4.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
MOE_GEMM2_SPLITS=4 timeout 200 ./carry/gpu --include-ignored --test-threads=1 fused > $R/gpu-fused-s4.log 2>&1
MOE_GEMM2_SPLITS=4 timeout 200 ./carry/gpu --include-ignored --test-threads=1 layer > $R/gpu-layer-s4.log 2>&1
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64,128,256 --routing uniform,balanced,zipf"
for i in 1 2; do
  timeout 100 ./carry/base-moe-gemm $S --csv $R/dec-base-$i.csv > $R/dec-base-$i.log 2>&1
  for k in 1 2 4 8; do
    MOE_GEMM2_SPLITS=$k timeout 100 ./carry/moe-gemm $S --csv $R/dec-s$k-$i.csv > $R/dec-s$k-$i.log 2>&1
  done
done
tar czf $OUT/run3.tgz -C $R .
