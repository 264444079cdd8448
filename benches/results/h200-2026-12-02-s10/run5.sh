#!/usr/bin/env bash
# Session 10, device call 5: the GPU suite of the merged-tile code and its rule; the decode buckets re-tuned with
# it and merged into copies of the shipped tables; the Auto suite of base (session 9) and new alternating twice;
# SwapAb16 forced on both (its kernel's registers went 94 -> 98 with the p0-based binding).
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R/tuned
( time timeout 240 ./carry/gpu --include-ignored --test-threads=1 ) > $R/gpu-final.log 2>&1
grep "test result" $R/gpu-final.log
for m in mixtral-8x7b qwen3-30b-a3b qwen3-235b-a22b deepseek-v3 gpt-oss-120b; do
  timeout 200 ./carry/moe-gemm tune --model $m --tokens 1,2,4,8,16,32,64,128,256 --out $R/tuned --reps 20 > $R/tune-$m.log 2>&1
done
python3 benches/results/h200-2026-12-02-s10/merge_tables.py $R/tuned configs/h200 $R/tables > $R/merge.log
grep -v "T=\([0-9]*\): \(\w*\) -> \2$" $R/merge.log
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do
  timeout 120 ./carry/base-moe-gemm $S --csv $R/msuite-base-$i.csv > $R/msuite-base-$i.log 2>&1
  timeout 120 ./carry/moe-gemm $S --tuned $R/tables --csv $R/msuite-new-$i.csv > $R/msuite-new-$i.log 2>&1
done
C="bench --layer --backends fused --fused-tile fused-swapab-16 --models mixtral-8x7b,qwen3-30b-a3b,qwen3-235b-a22b,gpt-oss-120b --layer-tokens 1,2,4,8,16 --peer none --reps 20"
for i in 1 2; do
  ./carry/base-moe-gemm $C > $R/s16-base-$i.log 2>&1
  ./carry/moe-gemm $C > $R/s16-new-$i.log 2>&1
done
tar czf $OUT/run5.tgz -C $R .
