#!/usr/bin/env bash
# Session 12, device call 2: where the time goes at the points still within ~2% of vLLM. ncu per kernel
# (duration, DRAM throughput, grid, registers) of one step, caches warm (--no-flush), every kernel of the run (no ceilings). 7897e53 (carry/base-moe-gemm).
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,launch__grid_size,launch__registers_per_thread,sm__throughput.avg.pct_of_peak_sustained_elapsed"
N="ncu --metrics $M --csv --launch-count 150"
B="./carry/base-moe-gemm bench --layer --reps 2 --peer none --no-flush --no-ceilings"
$N $B --backends fused --fused-tile swapab-merged --models mixtral-8x7b --layer-tokens 64 > $R/ncu-mixtral-t64-merged.csv 2>&1
$N $B --backends fused --fused-tile 64x128x64 --models mixtral-8x7b --layer-tokens 64 > $R/ncu-mixtral-t64-64.csv 2>&1
$N $B --backends grouped --models qwen3-30b-a3b --layer-tokens 256 > $R/ncu-q30-t256.csv 2>&1
$N $B --backends grouped --models qwen3-235b-a22b --layer-tokens 256 > $R/ncu-q235-t256.csv 2>&1
$N $B --backends fused --models qwen3-30b-a3b --layer-tokens 1 > $R/ncu-q30-t1.csv 2>&1
tar czf $OUT/run2.tgz -C $R .
