#!/usr/bin/env bash
# Session 16, run 1: the code to land (live-tiles-16.patch on 5bb9bbc's library code) against base.
# carryz/ (git-ignored): base-moe-gemm (5bb9bbc's code), live16-moe-gemm and gpu (the patched code).
# The GPU suite first, then the Auto layer suite alternating base / live16 twice. Tarred into run1.tgz.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.mem,driver_version --format=csv > $R/gpu-info.txt
timeout 200 ./carry/gpu --include-ignored --test-threads=1 > $R/gpu-live16.log 2>&1
tail -3 $R/gpu-live16.log
tar czf $OUT/run1.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do for v in base live16; do
  timeout 100 ./carry/$v-moe-gemm $S --csv $R/suite-$v-$i.csv > $R/suite-$v-$i.log 2>&1; echo "$v $i rc=$?"
done; done
tar czf $OUT/run1.tgz -C $R .
