#!/usr/bin/env bash
# Session 20, run 3: main's final binaries (4bc0a1a's kernels plus the re-tuned tables of run 2, compiled in).
# 1. GPU tests; 2. Auto suite three times (the committed suite results of the session); 3. ncu (below).
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
timeout 200 ./carry/gpu-final --include-ignored --test-threads=1 > $R/gpu-final.log 2>&1
tail -3 $R/gpu-final.log; grep -E "^test .*FAILED|panicked" $R/gpu-final.log | head
tar czf $OUT/run3.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2 3; do
  timeout 100 ./carry/final-moe-gemm $S --csv $R/suite-$i.csv > $R/suite-$i.log 2>&1; echo "suite $i rc=$?"
  tar czf $OUT/run3.tgz -C $R .
done
# 3. ncu of every kernel of two steps at the two Mixtral misses (Auto's choice: the merged tile at T = 64, SwapAb16 at T = 8).
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,launch__grid_size,launch__registers_per_thread,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
B="./carry/final-moe-gemm bench --layer --reps 2 --peer none --no-flush --no-ceilings --models mixtral-8x7b --backends auto"
timeout 90 ncu --metrics $M --csv --launch-count 12 $B --layer-tokens 64 --routing uniform > $R/ncu-mixtral-64-uniform.csv 2>&1; echo "ncu 64 rc=$?"
timeout 90 ncu --metrics $M --csv --launch-count 12 $B --layer-tokens 8 --routing zipf > $R/ncu-mixtral-8-zipf.csv 2>&1; echo "ncu 8 rc=$?"
tar czf $OUT/run3.tgz -C $R .
