#!/usr/bin/env bash
# Session 21, run 1. carryz/: proto (main 80ecb7b + the merged GEMM2's K split, S from MOE_SPLITK, buffers
# allocated once in prepare: a prototype). 1. GPU tests unsplit; fused and layer tests with MOE_SPLITK=4 and 8;
# 2. merged tile forced, Mixtral T = 16-256, S = 1 / 2 / 4 / 8 alternating twice.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
timeout 200 ./carry/gpu-proto --include-ignored --test-threads=1 > $R/gpu-proto.log 2>&1
tail -3 $R/gpu-proto.log; grep -E "^test .*FAILED|panicked" $R/gpu-proto.log | head
for s in 4 8; do MOE_SPLITK=$s timeout 100 ./carry/gpu-proto --include-ignored --test-threads=1 fused:: layer:: > $R/gpu-proto-s$s.log 2>&1
  tail -3 $R/gpu-proto-s$s.log; grep -E "^test .*FAILED|panicked" $R/gpu-proto-s$s.log | head; done
tar czf $OUT/run1.tgz -C $R .
M="bench --layer --backends fused --fused-tile swapab-merged --peer none --reps 30 --models mixtral-8x7b --layer-tokens 16,32,64,128,256 --routing uniform,balanced,zipf"
for i in 1 2; do for s in 1 2 4 8; do
  MOE_SPLITK=$s timeout 60 ./carry/proto-moe-gemm $M --csv $R/m-s$s-$i.csv > $R/m-s$s-$i.log 2>&1; echo "m s$s $i rc=$?"
done; done
tar czf $OUT/run1.tgz -C $R .
