#!/usr/bin/env bash
# Session 12, device call 4: re-tune the decode buckets (T = 1-256, five models, Fused per tile) with 25d7a6f
# (the faster layout build and activation move the Grouped / Fused boundaries), merge into the shipped tables,
# then the Auto suite with the shipped tables and with the merged ones, alternating twice (one binary).
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R/tuned
for m in mixtral-8x7b qwen3-30b-a3b qwen3-235b-a22b deepseek-v3 gpt-oss-120b; do
  timeout 150 ./carry/moe-gemm tune --model $m --tokens 1,2,4,8,16,32,64,128,256 --out $R/tuned --reps 20 > $R/tune-$m.log 2>&1
  echo "$m: $?"
done
python3 benches/results/h200-2026-12-02-s10/merge_tables.py $R/tuned configs/h200 $R/tables > $R/merge.log
tar czf $OUT/run4a.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do
  timeout 100 ./carry/moe-gemm $S --csv $R/tsuite-shipped-$i.csv > $R/tsuite-shipped-$i.log 2>&1
  timeout 100 ./carry/moe-gemm $S --tuned $R/tables --csv $R/tsuite-tuned-$i.csv > $R/tsuite-tuned-$i.log 2>&1
done
tar czf $OUT/run4.tgz -C $R .
