#!/usr/bin/env bash
# Session 18, run 3: one PDL launch helper (cpp/pdl.cuh) and the fused GEMMs over a FusedBatch (host code only).
# carryz/: gpu-refac and refac-moe-gemm (the change), main-moe-gemm (main before it: f0b042d's library).
# 1. GPU tests; 2. Auto suite main / refac twice; 3. Qwen3-235B and Qwen3-30B T = 256 on Grouped, the merged tile
# and the 64-row tile, three routings, twice (does the merged tile with the hand-off now pass zipf?).
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
timeout 200 ./carry/gpu-refac --include-ignored --test-threads=1 > $R/gpu-refac.log 2>&1
tail -3 $R/gpu-refac.log; grep -E "^test .*FAILED|panicked" $R/gpu-refac.log | head
tar czf $OUT/run3.tgz -C $R .
T="bench --layer --backends grouped,fused --fused-tile swapab-merged,64x128x64 --peer none --reps 30 --models qwen3-235b-a22b,qwen3-30b-a3b --layer-tokens 256 --routing uniform,balanced,zipf"
for i in 1 2; do timeout 90 ./carry/refac-moe-gemm $T --csv $R/t256-$i.csv > $R/t256-$i.log 2>&1; echo "t256 $i rc=$?"; done
tar czf $OUT/run3.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do for v in main refac; do
  timeout 100 ./carry/$v-moe-gemm $S --csv $R/suite-$v-$i.csv > $R/suite-$v-$i.log 2>&1; echo "$v $i rc=$?"
done; done
tar czf $OUT/run3.tgz -C $R .
