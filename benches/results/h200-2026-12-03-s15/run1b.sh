#!/usr/bin/env bash
# Session 15, run 1b: the command of the call that followed run 1 on the same warm machine (typed into the call
# as one line; here as a script). carry/ still held run 1's binaries.
cd "$(dirname "$0")/../../.."
R=/tmp/r2; mkdir -p $R
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64,128,256 --routing uniform,balanced,zipf"
[ -x carry/live-moe-gemm ] || { mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done; }
for i in 1 2; do
  for v in base live liveall; do timeout 60 ./carry/$v-moe-gemm $S --csv $R/dec-$v-$i.csv > $R/dec-$v-$i.log 2>&1; done
  MOE_G1_STEPS=32 timeout 60 ./carry/g1-moe-gemm $S --csv $R/dec-g32-$i.csv > $R/dec-g32-$i.log 2>&1
done
for i in 1 2; do
  timeout 110 ./carry/liveall-moe-gemm bench --layer --suite --backends auto --peer none --reps 20 --csv $R/suite-liveall-$i.csv > $R/suite-liveall-$i.log 2>&1
done
tar czf $OUT/run1b.tgz -C $R .
