#!/usr/bin/env bash
# Session 18, run 1. carryz/ (git-ignored): gpu-main and main-moe-gemm (main f0b042d: bc23ac6's chunked layout
# build + 251e98a), base-moe-gemm (afb13d2), cpdl-moe-gemm (branch cutlass-pdl 688e05d).
# 1. main's GPU tests; 2. Auto suite base / main twice; 3. Mixtral T = 512, 1024 uniform on Grouped, main / cpdl
# three times; 4. ncu of the same step, main and cpdl (per-kernel times with the kernels serialised).
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.mem,driver_version --format=csv > $R/gpu-info.txt
timeout 200 ./carry/gpu-main --include-ignored --test-threads=1 > $R/gpu-main.log 2>&1
tail -3 $R/gpu-main.log; grep -E "^test .*FAILED|panicked" $R/gpu-main.log | head
tar czf $OUT/run1.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do for v in base main; do
  timeout 100 ./carry/$v-moe-gemm $S --csv $R/suite-$v-$i.csv > $R/suite-$v-$i.log 2>&1; echo "$v $i rc=$?"
done; done
tar czf $OUT/run1.tgz -C $R .
M="bench --layer --backends grouped --peer none --reps 50 --models mixtral-8x7b --layer-tokens 512,1024 --routing uniform,balanced"
for i in 1 2 3; do for v in main cpdl; do
  timeout 60 ./carry/$v-moe-gemm $M --csv $R/mix-$v-$i.csv > $R/mix-$v-$i.log 2>&1; echo "mix $v $i rc=$?"
done; done
tar czf $OUT/run1.tgz -C $R .
K="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,launch__grid_size"
B="bench --layer --reps 2 --peer none --no-flush --no-ceilings --backends grouped --models mixtral-8x7b --layer-tokens 512 --routing uniform"
for v in main cpdl; do
  timeout 80 ncu --metrics $K --csv --launch-count 30 ./carry/$v-moe-gemm $B > $R/ncu-mix512-$v.csv 2>&1; echo "ncu $v rc=$?"
done
tar czf $OUT/run1.tgz -C $R .
