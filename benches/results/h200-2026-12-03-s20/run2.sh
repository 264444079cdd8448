#!/usr/bin/env bash
# Session 20, run 2. carryz/new-moe-gemm: main with branch merged-wgmma-128 merged (merged runs of up to 8 blocks,
# 3-4 on the 64-position and 5-8 on the 128-position wgmma path; its kernel code ran as gpu-w128 in run 1).
# 1. Re-tune the buckets where merged runs now reach 5-8 blocks (64-512 tokens) and merge them into a copy of
# configs/h200; 2. Auto suite with the shipped / the merged tables, alternating twice.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/new-*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R/tuned; B=./carry/new-moe-gemm
tune() { local t0=$SECONDS; timeout 150 $B tune --model $1 --tokens $2 --reps 20 --out $R/tuned > $R/tune-$1.log 2>&1
  echo "tune $1 $2 rc=$? $((SECONDS - t0)) s"; tar czf $OUT/run2.tgz -C $R .; }
tune mixtral-8x7b 64,128,256,512
tune qwen3-235b-a22b 128,256,512
tune qwen3-30b-a3b 128,256,512
tune gpt-oss-120b 128,256,512
tune deepseek-v3 256,512
python3 benches/results/h200-2026-12-03-s18/merge_tuned.py configs/h200 $R/tuned $R/merged > $R/merge.txt
cat $R/merge.txt
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do
  timeout 100 $B $S --csv $R/suite-shipped-$i.csv > $R/suite-shipped-$i.log 2>&1; echo "shipped $i rc=$?"
  timeout 100 $B $S --tuned $R/merged --csv $R/suite-tuned-$i.csv > $R/suite-tuned-$i.log 2>&1; echo "tuned $i rc=$?"
  tar czf $OUT/run2.tgz -C $R .
done
