#!/usr/bin/env bash
# Session 13, device call 1: L2 burst prefetch in the SwapAb kernels (MOE_FD_BURST: every kBurst K steps the
# row-owning lanes send the next kBurst steps of their weight rows to L2 in one request). base = 4ce9aaf,
# b4 / b8 = 4 / 8 steps (512 B / 1 KB per row). Fused GPU tests (b8), the decode buckets under Auto alternating
# twice, ncu of Mixtral T = 64 (merged tile) and gpt-oss T = 1.
cd "$(dirname "$0")/../../.."
# The executables travel gzipped (carryz/, the working tree plus carry must stay under 64 MiB).
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
( time timeout 120 ./carry/gpu --include-ignored --test-threads=1 fused ) > $R/gpu-fused-b8.log 2>&1
grep "test result" $R/gpu-fused-b8.log
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64,128,256 --routing uniform,balanced,zipf"
for i in 1 2; do
  for v in base b4 b8; do
    timeout 100 ./carry/$v-moe-gemm $S --csv $R/dec-$v-$i.csv > $R/dec-$v-$i.log 2>&1
  done
done
tar czf $OUT/run1a.tgz -C $R .
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,launch__grid_size,lts__t_sector_hit_rate.pct"
N="ncu --metrics $M --csv --launch-count 24"
B="bench --layer --reps 1 --peer none --no-flush --no-ceilings --backends fused"
for v in base b4; do
  $N ./carry/$v-moe-gemm $B --fused-tile swapab-merged --models mixtral-8x7b --layer-tokens 64 > $R/ncu-mix64-$v.csv 2>&1
  $N ./carry/$v-moe-gemm $B --models gpt-oss-120b --layer-tokens 1 > $R/ncu-oss1-$v.csv 2>&1
done
tar czf $OUT/run1.tgz -C $R .
