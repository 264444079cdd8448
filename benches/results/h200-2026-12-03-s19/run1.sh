#!/usr/bin/env bash
# Session 19, run 1. carryz/ (git-ignored): gpu-main and main-moe-gemm (main d2225ff, e2008cb's library),
# ilv-moe-gemm (the merged tile's CTAs taking the layout's blocks alternately from its front and its end).
# 1. main's GPU tests; 2. the merged tile forced, four models x T = 32, 64, 256 x three routings, main / ilv twice;
# 3. gpu-ilv: the GPU tests of the ilv tree.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.mem,driver_version --format=csv > $R/gpu-info.txt
timeout 220 ./carry/gpu-main --include-ignored --test-threads=1 > $R/gpu-main.log 2>&1
tail -3 $R/gpu-main.log; grep -E "^test .*FAILED|panicked" $R/gpu-main.log | head
tar czf $OUT/run1.tgz -C $R .
M="bench --layer --backends fused --fused-tile swapab-merged --peer none --reps 30 --models qwen3-235b-a22b,qwen3-30b-a3b,mixtral-8x7b,gpt-oss-120b --layer-tokens 32,64,256 --routing uniform,balanced,zipf"
for i in 1 2; do for v in main ilv; do
  timeout 120 ./carry/$v-moe-gemm $M --csv $R/m-$v-$i.csv > $R/m-$v-$i.log 2>&1; echo "$v $i rc=$?"
done; tar czf $OUT/run1.tgz -C $R .; done
timeout 200 ./carry/gpu-ilv --include-ignored --test-threads=1 > $R/gpu-ilv.log 2>&1
tail -3 $R/gpu-ilv.log; grep -E "^test .*FAILED|panicked" $R/gpu-ilv.log | head
tar czf $OUT/run1.tgz -C $R .
