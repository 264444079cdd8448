#!/usr/bin/env bash
# Session 14, device call 5: the GEMM2 K-split prototype (gemm2-k-split-proto.patch) with GEMM2 launched early
# (PDL) whenever its x * y grid is at most two waves, whatever its splits: MOE_GEMM2_SPLITS = 1, 2, 4 against
# base (43fd433) on the decode points under Auto, alternating twice.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64,128,256 --routing uniform,balanced,zipf"
for i in 1 2; do
  timeout 100 ./carry/base-moe-gemm $S --csv $R/dec-base-$i.csv > $R/dec-base-$i.log 2>&1
  for k in 1 2 4; do
    MOE_GEMM2_SPLITS=$k timeout 100 ./carry/split-moe-gemm $S --csv $R/dec-e$k-$i.csv > $R/dec-e$k-$i.log 2>&1
  done
done
tar czf $OUT/run5.tgz -C $R .
