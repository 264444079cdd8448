#!/usr/bin/env bash
# Session 12, device call 6: SwapAb16's private-ring kernel with 3 stages and 3 CTAs per SM (was 4 and 2):
# SwapAb16 forced, base (0fbc48e) and new alternating twice; the GPU suite; the Auto suite of each once.
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R
C="bench --layer --backends fused --fused-tile swapab-16 --models qwen3-30b-a3b,qwen3-235b-a22b,gpt-oss-120b,deepseek-v3,mixtral-8x7b --layer-tokens 1,2,4,8,16,32 --routing uniform,zipf --peer none --reps 20"
for i in 1 2; do
  timeout 100 ./carry/base-moe-gemm $C > $R/s16-base-$i.log 2>&1
  timeout 100 ./carry/moe-gemm $C > $R/s16-new-$i.log 2>&1
done
tar czf $OUT/run6a.tgz -C $R .
( time timeout 200 ./carry/gpu --include-ignored --test-threads=1 ) > $R/gpu-3cta.log 2>&1
grep "test result" $R/gpu-3cta.log
tar czf $OUT/run6b.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
timeout 100 ./carry/base-moe-gemm $S --csv $R/csuite-base-1.csv > $R/csuite-base-1.log 2>&1
timeout 100 ./carry/moe-gemm $S --csv $R/csuite-new-1.csv > $R/csuite-new-1.log 2>&1
tar czf $OUT/run6.tgz -C $R .
