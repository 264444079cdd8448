#!/usr/bin/env bash
# Session 12, device call 3: the single-CTA layout build with one read of topk_ids and warp-contiguous segments,
# the three-barrier block scan, the 16-byte activation kernel. GPU suite; ncu of the kernels around the GEMMs
# (Qwen3-30B T = 256 Grouped, Mixtral T = 64 Fused); the Auto suite, base (7897e53) and new alternating twice.
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R
( time timeout 200 ./carry/gpu --include-ignored --test-threads=1 ) > $R/gpu-run3.log 2>&1
grep "test result" $R/gpu-run3.log
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,launch__grid_size,launch__registers_per_thread,sm__throughput.avg.pct_of_peak_sustained_elapsed"
N="ncu --metrics $M --csv --launch-count 40"
B="bench --layer --reps 2 --peer none --no-flush --no-ceilings"
$N ./carry/moe-gemm $B --backends grouped --models qwen3-30b-a3b --layer-tokens 256 > $R/ncu-q30-t256-new.csv 2>&1
$N ./carry/moe-gemm $B --backends fused --models mixtral-8x7b --layer-tokens 64 > $R/ncu-mixtral-t64-new.csv 2>&1
tar czf $OUT/run3a.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do
  timeout 100 ./carry/base-moe-gemm $S --csv $R/lsuite-base-$i.csv > $R/lsuite-base-$i.log 2>&1
  timeout 100 ./carry/moe-gemm $S --csv $R/lsuite-new-$i.csv > $R/lsuite-new-$i.log 2>&1
done
tar czf $OUT/run3.tgz -C $R .
