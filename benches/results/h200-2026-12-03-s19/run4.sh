#!/usr/bin/env bash
# Session 19, run 4. carryz/: final-moe-gemm and gpu-final (main f8edf45: the interleaved merged tile),
# wg-moe-gemm and gpu-wg (the merged tile's 64-position runs on wgmma; run 3's form with whole-sector copies, no proxy fence, no alignment slack).
# 1. gpu-wg's GPU tests; 2. the merged tile forced, four models x T = 64, 256 x three routings, final / wg twice.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
timeout 220 ./carry/gpu-wg --include-ignored --test-threads=1 > $R/gpu-wg.log 2>&1
tail -3 $R/gpu-wg.log; grep -E "^test .*FAILED|panicked" $R/gpu-wg.log | head
tar czf $OUT/run4.tgz -C $R .
M="bench --layer --backends fused --fused-tile swapab-merged --peer none --reps 30 --models qwen3-235b-a22b,qwen3-30b-a3b,mixtral-8x7b,gpt-oss-120b --layer-tokens 64,128,256 --routing uniform,balanced,zipf"
for i in 1 2; do for v in final wg; do
  timeout 120 ./carry/$v-moe-gemm $M --csv $R/m-$v-$i.csv > $R/m-$v-$i.log 2>&1; echo "$v $i rc=$?"
done; tar czf $OUT/run4.tgz -C $R .; done
