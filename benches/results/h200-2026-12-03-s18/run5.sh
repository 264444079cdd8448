#!/usr/bin/env bash
# Session 18, run 5: the fused wgmma tiles' raster cut at expert boundaries (windows of kGroupM M tiles, each
# expert's piece M-fastest), kGroupM 1 -> 4 on the 64-row tile. carryz/: gpu-kern and kern-moe-gemm (the change),
# refac-moe-gemm (main f1a5d54). 1. GPU tests; 2. the two wgmma tiles forced, old / new, twice; 3. re-tune the
# buckets where experts hold several 64-row tiles (Mixtral 128-1024, Qwen3 256-512) on the new binary, merge into a
# copy of configs/h200; 4. the Auto suite, new binary, shipped tables / merged tables, twice.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R/tuned
timeout 200 ./carry/gpu-kern --include-ignored --test-threads=1 > $R/gpu-kern.log 2>&1
tail -3 $R/gpu-kern.log; grep -E "^test .*FAILED|panicked" $R/gpu-kern.log | head
tar czf $OUT/run5.tgz -C $R .
F="bench --layer --backends fused --fused-tile 64x128x64,128x256x64 --peer none --reps 20 --models mixtral-8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3 --layer-tokens 64,256,1024 --routing uniform,balanced,zipf"
for i in 1 2; do for v in refac kern; do
  timeout 90 ./carry/$v-moe-gemm $F --csv $R/tiles-$v-$i.csv > $R/tiles-$v-$i.log 2>&1; echo "tiles $v $i rc=$?"
done; done
tar czf $OUT/run5.tgz -C $R .
B=./carry/kern-moe-gemm
timeout 150 $B tune --model mixtral-8x7b --tokens 128,256,512,1024 --out $R/tuned > $R/tune-mixtral.log 2>&1; echo "tune mixtral rc=$?"
for m in qwen3-30b-a3b qwen3-235b-a22b; do
  timeout 60 $B tune --model $m --tokens 256,512 --out $R/tuned > $R/tune-$m.log 2>&1; echo "tune $m rc=$?"
done
python3 benches/results/h200-2026-12-03-s18/merge_tuned.py configs/h200 $R/tuned $R/merged | tee $R/merge.txt
tar czf $OUT/run5.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do
  timeout 100 $B $S --csv $R/suite-base-$i.csv > $R/suite-base-$i.log 2>&1; echo "suite shipped $i rc=$?"
  timeout 100 $B $S --tuned $R/merged --csv $R/suite-tuned-$i.csv > $R/suite-tuned-$i.log 2>&1; echo "suite tuned $i rc=$?"
done
tar czf $OUT/run5.tgz -C $R .
