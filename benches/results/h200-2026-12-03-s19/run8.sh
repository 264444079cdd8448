#!/usr/bin/env bash
# Prepared in session 19 (NOT run). carryz/ (build7.sh): main, w128 (branch merged-wgmma-128: merged runs of up
# to 8 blocks, 5-8 on a 128-position wgmma path). 1. w128's GPU tests; 2. the merged tile forced (run 5's 36
# points), main / w128 twice. Run after run7.sh, and only if wg2 there is within 0.2% of main where it has no
# 64-position run (else the 128-position path inherits its cost).
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
timeout 200 ./carry/gpu-w128 --include-ignored --test-threads=1 > $R/gpu-w128.log 2>&1
tail -3 $R/gpu-w128.log; grep -E "^test .*FAILED|panicked" $R/gpu-w128.log | head
tar czf $OUT/run8.tgz -C $R .
M="bench --layer --backends fused --fused-tile swapab-merged --peer none --reps 30 --models qwen3-235b-a22b,qwen3-30b-a3b,mixtral-8x7b,gpt-oss-120b --layer-tokens 64,128,256 --routing uniform,balanced,zipf"
for i in 1 2; do for v in main w128; do
  timeout 60 ./carry/$v-moe-gemm $M --csv $R/m-$v-$i.csv > $R/m-$v-$i.log 2>&1; echo "m $v $i rc=$?"
done; done
tar czf $OUT/run8.tgz -C $R .
