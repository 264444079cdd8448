#!/usr/bin/env bash
# Session 18, run 4: re-tune bucket 256 of Qwen3-235B, Qwen3-30B and Mixtral (run 3: the merged tile with the
# hand-off now leads Grouped at Qwen3-235B T = 256 under all three routings), merge the entries into a copy of
# configs/h200, and time Auto at T = 256 with the shipped tables and with the merged ones, three rounds.
# carryz/: refac-moe-gemm (main f1a5d54).
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R/tuned
B=./carry/refac-moe-gemm
for m in qwen3-235b-a22b qwen3-30b-a3b mixtral-8x7b; do
  timeout 120 $B tune --model $m --tokens 256 --reps 30 --out $R/tuned > $R/tune-$m.log 2>&1; echo "tune $m rc=$?"
done
python3 benches/results/h200-2026-12-03-s18/merge_tuned.py configs/h200 $R/tuned $R/merged | tee $R/merge.txt
tar czf $OUT/run4.tgz -C $R .
A="bench --layer --backends auto --peer none --reps 30 --models qwen3-235b-a22b,qwen3-30b-a3b,mixtral-8x7b --layer-tokens 256 --routing uniform,balanced,zipf"
for i in 1 2 3; do
  timeout 60 $B $A --csv $R/a256-base-$i.csv > $R/a256-base-$i.log 2>&1
  timeout 60 $B $A --tuned $R/merged --csv $R/a256-tuned-$i.csv > $R/a256-tuned-$i.log 2>&1; echo "a256 $i rc=$?"
done
tar czf $OUT/run4.tgz -C $R .
