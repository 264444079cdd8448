#!/usr/bin/env bash
# Session 12, device call 1: merged-run-kernel.patch (s11) applied. Fused GEMM tests; the merged tile forced, base
# (7897e53) and new alternating twice; a re-tune of the new binary; the Auto suite, base vs new with those tables.
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R/tuned
timeout 120 ./carry/gpu --include-ignored --test-threads=1 fused > $R/gpu-fused-run.log 2>&1
grep "test result" $R/gpu-fused-run.log
C="bench --layer --backends fused --fused-tile swapab-merged --models qwen3-30b-a3b,qwen3-235b-a22b,gpt-oss-120b,deepseek-v3,mixtral-8x7b --layer-tokens 2,4,8,16,32,64,128,256 --routing uniform,zipf --peer none --reps 20"
for i in 1 2; do
  timeout 100 ./carry/base-moe-gemm $C > $R/run-base-$i.log 2>&1
  timeout 100 ./carry/moe-gemm $C > $R/run-new-$i.log 2>&1
done
tar czf $OUT/run1a.tgz -C $R .
for m in mixtral-8x7b qwen3-30b-a3b qwen3-235b-a22b deepseek-v3 gpt-oss-120b; do
  timeout 150 ./carry/moe-gemm tune --model $m --tokens 1,2,4,8,16,32,64,128,256 --out $R/tuned --reps 20 > $R/tune-$m.log 2>&1
done
python3 benches/results/h200-2026-12-02-s10/merge_tables.py $R/tuned configs/h200 $R/tables > $R/merge.log
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do
  timeout 100 ./carry/base-moe-gemm $S --csv $R/rsuite-base-$i.csv > $R/rsuite-base-$i.log 2>&1
  timeout 100 ./carry/moe-gemm $S --tuned $R/tables --csv $R/rsuite-new-$i.csv > $R/rsuite-new-$i.log 2>&1
done
tar czf $OUT/run1.tgz -C $R .
