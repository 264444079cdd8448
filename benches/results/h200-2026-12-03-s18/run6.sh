#!/usr/bin/env bash
# Session 18, run 6: where the merged tile loses Qwen3-235B T = 256 zipf (and where Grouped loses uniform): every
# kernel of two steps under ncu, merged tile and Grouped, uniform and zipf. carryz/: kern-moe-gemm (64c195d).
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,launch__grid_size,launch__registers_per_thread,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
B="./carry/kern-moe-gemm bench --layer --reps 2 --peer none --no-flush --no-ceilings --models qwen3-235b-a22b --layer-tokens 256"
for r in uniform zipf; do
  timeout 90 ncu --metrics $M --csv --launch-count 12 $B --backends fused --fused-tile swapab-merged --routing $r > $R/ncu-merged-$r.csv 2>&1; echo "merged $r rc=$?"
  timeout 90 ncu --metrics $M --csv --launch-count 16 $B --backends grouped --routing $r > $R/ncu-grouped-$r.csv 2>&1; echo "grouped $r rc=$?"
  tar czf $OUT/run6.tgz -C $R .
done
