#!/usr/bin/env bash
# Session 14, device call 2: K rotation (each CTA of the SwapAb kernels begins its K walk at its own even step)
# against base (43fd433) on the 135 decode points under Auto, alternating twice.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64,128,256 --routing uniform,balanced,zipf"
for i in 1 2; do
  timeout 100 ./carry/base-moe-gemm $S --csv $R/dec-base-$i.csv > $R/dec-base-$i.log 2>&1
  timeout 100 ./carry/moe-gemm $S --csv $R/dec-rot-$i.csv > $R/dec-rot-$i.log 2>&1
done
tar czf $OUT/run2.tgz -C $R .
