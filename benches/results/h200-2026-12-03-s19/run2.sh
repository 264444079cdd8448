#!/usr/bin/env bash
# Session 19, run 2. carryz/: main-moe-gemm (main d2225ff), ilv-moe-gemm (the merged tile's CTAs take the
# layout's blocks alternately from its front and its end; its GPU tests passed in run 1).
# 1. Auto suite main / ilv twice (shipped tables); 2. ilv: re-tune bucket 256 of Qwen3-235B and Qwen3-30B, merge
# into a copy of configs/h200; 3. Auto at T = 256 on both models, shipped / merged tables, three rounds.
# (It ran with a byte-identical copy of s18/merge_tuned.py in this directory, removed since; the path below is s18's.)
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R/tuned
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do for v in main ilv; do
  timeout 100 ./carry/$v-moe-gemm $S --csv $R/suite-$v-$i.csv > $R/suite-$v-$i.log 2>&1; echo "$v $i rc=$?"
done; done
tar czf $OUT/run2.tgz -C $R .
B=./carry/ilv-moe-gemm
for m in qwen3-235b-a22b qwen3-30b-a3b; do
  timeout 120 $B tune --model $m --tokens 256 --reps 30 --out $R/tuned > $R/tune-$m.log 2>&1; echo "tune $m rc=$?"
done
python3 benches/results/h200-2026-12-03-s18/merge_tuned.py configs/h200 $R/tuned $R/merged | tee $R/merge.txt
tar czf $OUT/run2.tgz -C $R .
A="bench --layer --backends auto --peer none --reps 30 --models qwen3-235b-a22b,qwen3-30b-a3b --layer-tokens 256 --routing uniform,balanced,zipf"
for i in 1 2 3; do
  timeout 60 $B $A --csv $R/a256-shipped-$i.csv > $R/a256-shipped-$i.log 2>&1
  timeout 60 $B $A --tuned $R/merged --csv $R/a256-tuned-$i.csv > $R/a256-tuned-$i.log 2>&1; echo "a256 $i rc=$?"
done
tar czf $OUT/run2.tgz -C $R .
