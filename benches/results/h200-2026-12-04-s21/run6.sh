#!/usr/bin/env bash
# Session 21, run 6. carryz/: guess (main 24d4052). Re-tune the decode buckets where a SwapAb16 GEMM1 takes the
# guessed-expert prefetch (T·k <= 32: T = 1-8, Mixtral 1-16), merge into the shipped tables, then the Auto suite
# from the merged tables (--tuned) / from the shipped ones, alternating twice.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R/tuned; B=./carry/guess-moe-gemm; D=benches/results/h200-2026-12-04-s21
for p in "qwen3-30b-a3b 1,2,4,8" "qwen3-235b-a22b 1,2,4,8" "deepseek-v3 1,2,4,8" "gpt-oss-120b 1,2,4,8" "mixtral-8x7b 1,2,4,8,16"; do
  set -- $p; timeout 100 $B tune --model $1 --tokens $2 --reps 30 --out $R/tuned > $R/tune-$1.log 2>&1; echo "tune $1 rc=$?"
done
python3 benches/results/h200-2026-12-03-s18/merge_tuned.py configs/h200 $R/tuned $R/merged | tee $R/merge.txt
tar czf $OUT/run6.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do
  timeout 100 $B $S --tuned $R/merged --csv $R/suite-tuned-$i.csv > $R/suite-tuned-$i.log 2>&1; echo "suite tuned $i rc=$?"
  timeout 100 $B $S --csv $R/suite-base-$i.csv > $R/suite-base-$i.log 2>&1; echo "suite shipped $i rc=$?"
done
tar czf $OUT/run6.tgz -C $R .
