#!/usr/bin/env bash
# Session 15, NOT RUN (the session's device time was spent: five calls got no machine). Live tiles in SwapAb16's
# private rings only (live-tiles-16.patch), against base and live-tiles-all, alternating three times; its GPU
# suite; its whole Auto suite twice. Tarred into run3.tgz (at most 8 files come back per call).
#   base-moe-gemm     HEAD's code
#   live16-moe-gemm   live-tiles-16.patch
#   liveall-moe-gemm  ../h200-2026-12-03-s14/live-tiles-all.patch
#   gpu               the GPU tests of live-tiles-16.patch
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64,128,256 --routing uniform,balanced,zipf"
for i in 1 2 3; do
  for v in base live16 liveall; do
    timeout 60 ./carry/$v-moe-gemm $S --csv $R/dec-$v-$i.csv > $R/dec-$v-$i.log 2>&1
  done
done
tar czf $OUT/run3.tgz -C $R .
timeout 170 ./carry/gpu --include-ignored --test-threads=1 > $R/gpu-live16.log 2>&1
tail -3 $R/gpu-live16.log
tar czf $OUT/run3.tgz -C $R .
for i in 1 2; do
  timeout 110 ./carry/live16-moe-gemm bench --layer --suite --backends auto --peer none --reps 20 --csv $R/suite-live16-$i.csv > $R/suite-live16-$i.log 2>&1
done
tar czf $OUT/run3.tgz -C $R .
