#!/usr/bin/env bash
# Session 10, device call 2: the decode buckets (T = 1 ... 256) re-tuned with the shared-position SwapAb32 and its
# rule, merged into copies of the shipped tables; then the Auto suite of the new binary with those tables and of
# the base binary (session 9, shipped tables), alternating twice.
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R/tuned
for m in mixtral-8x7b qwen3-30b-a3b qwen3-235b-a22b deepseek-v3 gpt-oss-120b; do
  ( time timeout 200 ./carry/moe-gemm tune --model $m --tokens 1,2,4,8,16,32,64,128,256 --out $R/tuned --reps 20 ) > $R/tune-$m.log 2>&1
  tail -1 $R/tune-$m.log
done
python3 benches/results/h200-2026-12-02-s10/merge_tables.py $R/tuned configs/h200 $R/tables > $R/merge.log
cat $R/merge.log | grep -v "T=\([0-9]*\): \(\w*\) -> \2$"
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do
  timeout 120 ./carry/base-moe-gemm $S --csv $R/suite-base-$i.csv > $R/suite-base-$i.log 2>&1
  timeout 120 ./carry/moe-gemm $S --tuned $R/tables --csv $R/suite-new-$i.csv > $R/suite-new-$i.log 2>&1
done
tar czf $OUT/run2.tgz -C $R .
