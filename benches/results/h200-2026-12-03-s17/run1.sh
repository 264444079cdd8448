#!/usr/bin/env bash
# Session 17, run 1: programmatic dependent launch along the layout backends' own kernels (gather, the grouped
# GEMM's prepare, activation, combine). carryz/ (git-ignored): base-moe-gemm (9e4f3c9, main with the hand-off),
# pdl-moe-gemm and gpu (the change). The GPU suite first, then the Auto layer suite alternating base / pdl twice.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.mem,driver_version --format=csv > $R/gpu-info.txt
timeout 200 ./carry/gpu --include-ignored --test-threads=1 > $R/gpu-pdl.log 2>&1
tail -3 $R/gpu-pdl.log; grep -E "^test .*FAILED|panicked" $R/gpu-pdl.log | head
tar czf $OUT/run1.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do for v in base pdl; do
  timeout 100 ./carry/$v-moe-gemm $S --csv $R/suite-$v-$i.csv > $R/suite-$v-$i.log 2>&1; echo "$v $i rc=$?"
done; done
tar czf $OUT/run1.tgz -C $R .
# Where the time goes now at the two Grouped misses: every kernel of a few steps under ncu (caches warm).
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,launch__grid_size,launch__registers_per_thread,sm__throughput.avg.pct_of_peak_sustained_elapsed"
B="./carry/pdl-moe-gemm bench --layer --reps 2 --peer none --no-flush --no-ceilings --backends grouped --layer-tokens 256"
timeout 60 ncu --metrics $M --csv --launch-count 40 $B --models qwen3-30b-a3b > $R/ncu-q30-t256.csv 2>&1
timeout 60 ncu --metrics $M --csv --launch-count 40 $B --models qwen3-235b-a22b > $R/ncu-q235-t256.csv 2>&1
tar czf $OUT/run1.tgz -C $R .
