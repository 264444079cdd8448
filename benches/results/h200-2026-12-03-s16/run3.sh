#!/usr/bin/env bash
# Session 16, run 3: ready-flags-proto2.patch against HEAD (e73c19c). As run 2's patch, but the waiting thread
# spins on relaxed loads (one acquire fence at the end: an acquire load per poll invalidates the SM's L1), and
# GEMM1 signals only where its GEMM2 is launched early (elsewhere GEMM2 starts after GEMM1 has ended anyway,
# and the release per GEMM1 warp is pure cost). carryz/: live16-moe-gemm (HEAD), flags2-moe-gemm.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64,128,256 --routing uniform,balanced,zipf"
for i in 1 2 3; do for v in live16 flags2; do
  timeout 60 ./carry/$v-moe-gemm $S --csv $R/dec-$v-$i.csv > $R/dec-$v-$i.log 2>&1; echo "$v $i rc=$?"
done; done
tar czf $OUT/run3.tgz -C $R .
