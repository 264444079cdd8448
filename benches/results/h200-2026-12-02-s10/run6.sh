#!/usr/bin/env bash
# Session 10, device call 6 (final code): the GPU suite; SwapAb16 forced on base (session 9) and final
# (offsets beside the kernels' argument struct: the 94-register SwapAb16 again); the Auto suite of base and final
# (the decode buckets of call 5 merged into the shipped tables), alternating twice.
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R
( time timeout 240 ./carry/gpu --include-ignored --test-threads=1 ) > $R/gpu-final.log 2>&1
grep "test result" $R/gpu-final.log
C="bench --layer --backends fused --fused-tile fused-swapab-16 --models mixtral-8x7b,qwen3-30b-a3b,qwen3-235b-a22b,gpt-oss-120b --layer-tokens 1,2,4,8,16 --peer none --reps 20"
for i in 1 2; do
  ./carry/base-moe-gemm $C > $R/f16-base-$i.log 2>&1
  ./carry/moe-gemm $C > $R/f16-new-$i.log 2>&1
done
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do
  timeout 120 ./carry/base-moe-gemm $S --csv $R/fsuite-base-$i.csv > $R/fsuite-base-$i.log 2>&1
  timeout 120 ./carry/moe-gemm $S --csv $R/fsuite-new-$i.csv > $R/fsuite-new-$i.log 2>&1
done
tar czf $OUT/run6.tgz -C $R .
