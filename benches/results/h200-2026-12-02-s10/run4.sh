#!/usr/bin/env bash
# Session 10, device call 4: the merged SwapAb tile (16-position blocks, up to 4 of one expert per CTA). Its GPU
# tests (and a mutant whose runs read past their expert), then every decode tile forced on the suite models at
# T = 4 ... 256, uniform and zipf, twice.
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R
if ! timeout 90 ./carry/gpu --include-ignored --test-threads=1 fused:: > $R/gpu-fused-merged.log 2>&1; then
  tail -30 $R/gpu-fused-merged.log; tar czf $OUT/run4.tgz -C $R .; exit 1
fi
grep "test result" $R/gpu-fused-merged.log
timeout 90 ./carry/gpu-mut --include-ignored --test-threads=1 fused:: > $R/gpu-mut.log 2>&1; grep -E "panicked|test result" $R/gpu-mut.log | head -4
M="--models mixtral-8x7b,qwen3-30b-a3b,qwen3-235b-a22b,gpt-oss-120b,deepseek-v3 --layer-tokens 4,8,16,32,64,128,256 --routing uniform,zipf --peer none --reps 20"
for i in 1 2; do
  for t in fused-swapab-merged fused-swapab-16 fused-swapab-32 fused-64x128x64; do
    timeout 100 ./carry/moe-gemm bench --layer --backends fused --fused-tile $t $M > $R/tile-$t-$i.log 2>&1
  done
  timeout 100 ./carry/moe-gemm bench --layer --backends grouped $M > $R/tile-grouped-$i.log 2>&1
done
tar czf $OUT/run4.tgz -C $R .
