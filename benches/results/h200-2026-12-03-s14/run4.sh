#!/usr/bin/env bash
# Session 14, device call 4: the early-launched SwapAb GEMM2's L2 prefetch of its rows' first K steps at 8 and
# 16 steps instead of 4 (MOE_PF), on the decode points under Auto, alternating twice against base (43fd433).
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64,128,256 --routing uniform,balanced,zipf"
for i in 1 2; do
  for v in base pf8 pf16; do
    timeout 100 ./carry/$v-moe-gemm $S --csv $R/dec-$v-$i.csv > $R/dec-$v-$i.log 2>&1
  done
done
tar czf $OUT/run4.tgz -C $R .
