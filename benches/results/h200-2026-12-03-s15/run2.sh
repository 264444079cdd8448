#!/usr/bin/env bash
# Session 15, call 2: live tiles with an unpredicated path for runs without padding tiles (live-tiles-fast.patch:
# live-tiles-all.patch plus that branch), against base, alternating three times; the GPU
# suite of live-tiles-fast; its whole Auto suite twice. All tarred into run2.tgz (the device returns at most 8
# files per call: run 1's per-file results came back only in part).
#   base-moe-gemm      3f25145's code (= 43fd433's)
#   livefast-moe-gemm  live-tiles-fast.patch
#   gpu                the GPU tests of live-tiles-fast.patch
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64,128,256 --routing uniform,balanced,zipf"
for i in 1 2 3; do
  for v in base livefast; do
    timeout 60 ./carry/$v-moe-gemm $S --csv $R/dec-$v-$i.csv > $R/dec-$v-$i.log 2>&1
  done
done
tar czf $OUT/run2.tgz -C $R .
timeout 170 ./carry/gpu --include-ignored --test-threads=1 > $R/gpu-livefast.log 2>&1
tail -3 $R/gpu-livefast.log
tar czf $OUT/run2.tgz -C $R .
for i in 1 2; do
  timeout 110 ./carry/livefast-moe-gemm bench --layer --suite --backends auto --peer none --reps 20 --csv $R/suite-livefast-$i.csv > $R/suite-livefast-$i.log 2>&1
done
tar czf $OUT/run2.tgz -C $R .
