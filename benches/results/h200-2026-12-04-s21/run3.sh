#!/usr/bin/env bash
# Session 21, run 3. carryz/: base (main 80ecb7b). 1. gpt-oss and Qwen3-30B at T = 1-4, every decode backend and
# Fused tile forced, twice; 2. ncu of every kernel of two steps of gpt-oss T = 1 (Auto); 3. the Auto suite twice.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
F="bench --layer --backends fused,batched,grouped,auto --fused-tile swapab-16,swapab-32,swapab-merged --peer none --reps 40 --models gpt-oss-120b,qwen3-30b-a3b --layer-tokens 1,2,4 --routing uniform,zipf"
for i in 1 2; do timeout 90 ./carry/base-moe-gemm $F --csv $R/f-$i.csv > $R/f-$i.log 2>&1; echo "f $i rc=$?"; done
tar czf $OUT/run3.tgz -C $R .
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,launch__grid_size,launch__registers_per_thread,sm__throughput.avg.pct_of_peak_sustained_elapsed"
B="./carry/base-moe-gemm bench --layer --reps 2 --peer none --no-flush --no-ceilings --models gpt-oss-120b --backends auto"
timeout 90 ncu --metrics $M --csv --launch-count 14 $B --layer-tokens 1 --routing uniform > $R/ncu-gptoss-1.csv 2>&1; echo "ncu rc=$?"
tar czf $OUT/run3.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 3 4; do timeout 100 ./carry/base-moe-gemm $S --csv $R/suite-base-$i.csv > $R/suite-base-$i.log 2>&1; echo "suite $i rc=$?"; done
tar czf $OUT/run3.tgz -C $R .
