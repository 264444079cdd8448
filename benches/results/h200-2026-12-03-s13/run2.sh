#!/usr/bin/env bash
# Session 13, device call 6: two cheap knobs of the SwapAb kernels, each against base (4ce9aaf) on the decode
# buckets under Auto (alternating twice): s6 = the shared ring's 16-position runs at 6 stages instead of 5 (the
# merged kernel's shared memory grows to 108 KB, still two CTAs per SM); nh = the weights' cp.async without the
# L2::256B prefetch hint. Fused GPU tests on s6.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
( time timeout 120 ./carry/gpu --include-ignored --test-threads=1 fused ) > $R/gpu-fused-s6.log 2>&1
grep "test result" $R/gpu-fused-s6.log
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64,128,256 --routing uniform,balanced,zipf"
for i in 1 2; do
  for v in base s6 nh; do
    timeout 100 ./carry/$v-moe-gemm $S --csv $R/dec-$v-$i.csv > $R/dec-$v-$i.log 2>&1
  done
done
tar czf $OUT/run2.tgz -C $R .
