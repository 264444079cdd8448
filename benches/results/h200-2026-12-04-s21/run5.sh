#!/usr/bin/env bash
# Session 21, run 5. carryz/: base (main 80ecb7b), guess (a SwapAb16 GEMM1 of at most 32 rows guesses its
# experts from topk_ids and starts their weights towards L2 while the layout build runs). 1. GPU tests of guess;
# 2. SwapAb16 forced, T = 1-16, five models, and the Auto suite, base / guess alternating twice.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
timeout 200 ./carry/gpu-guess --include-ignored --test-threads=1 > $R/gpu-guess.log 2>&1
tail -3 $R/gpu-guess.log; grep -E "^test .*FAILED|panicked" $R/gpu-guess.log | head
tar czf $OUT/run5.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
M="bench --layer --backends fused --fused-tile swapab-16 --peer none --reps 40 --models qwen3-235b-a22b,qwen3-30b-a3b,mixtral-8x7b,gpt-oss-120b,deepseek-v3 --layer-tokens 1,2,4,8,16 --routing uniform,zipf"
for i in 1 2; do for v in base guess; do
  timeout 60 ./carry/$v-moe-gemm $M --csv $R/m-$v-$i.csv > $R/m-$v-$i.log 2>&1; echo "m $v $i rc=$?"
  timeout 100 ./carry/$v-moe-gemm $S --csv $R/suite-$v-$i.csv > $R/suite-$v-$i.log 2>&1; echo "suite $v $i rc=$?"
done; tar czf $OUT/run5.tgz -C $R .; done
