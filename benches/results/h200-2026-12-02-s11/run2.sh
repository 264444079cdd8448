#!/usr/bin/env bash
# Session 11, device call 2: `moe-gemm tune` over backend x Fused tile (swapab-16, swapab-merged, 64x128x64,
# 128x256x64) for the decode buckets T = 1-256 of the five suite models; the buckets merged into copies of the
# shipped tables; the Auto suite of session 10's binary (base, its shipped tables) and of the new binary with
# the merged tables (--tuned), alternating twice.
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R/tuned
for m in mixtral-8x7b qwen3-30b-a3b qwen3-235b-a22b deepseek-v3 gpt-oss-120b; do
  timeout 150 ./carry/moe-gemm tune --model $m --tokens 1,2,4,8,16,32,64,128,256 --out $R/tuned --reps 20 > $R/tune-$m.log 2>&1
  echo "$m: $?"
done
python3 benches/results/h200-2026-12-02-s10/merge_tables.py $R/tuned configs/h200 $R/tables > $R/merge.log
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do
  timeout 100 ./carry/base-moe-gemm $S --csv $R/suite-base-$i.csv > $R/suite-base-$i.log 2>&1
  timeout 100 ./carry/moe-gemm $S --tuned $R/tables --csv $R/suite-tuned-$i.csv > $R/suite-tuned-$i.log 2>&1
done
tar czf $OUT/run2.tgz -C $R .
