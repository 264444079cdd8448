#!/usr/bin/env bash
# Session 11, device call 6: the merged tile's GEMM1 as one 32-row task per CTA over a run of up to 4 blocks,
# each warp through its own ring (run_gemm_kernel). The merged tile forced, e0f9296 (base) and the new binary
# alternating twice; then the new binary's GPU suite.
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R
C="bench --layer --backends fused --fused-tile swapab-merged --models qwen3-30b-a3b,qwen3-235b-a22b,gpt-oss-120b,deepseek-v3,mixtral-8x7b --layer-tokens 2,4,8,16,32,64,128,256 --routing uniform,zipf --peer none --reps 20"
for i in 1 2; do
  timeout 60 ./carry/base-moe-gemm $C > $R/run-base-$i.log 2>&1
  timeout 60 ./carry/moe-gemm $C > $R/run-new-$i.log 2>&1
done
tar czf $OUT/run6a.tgz -C $R .
( time timeout 150 ./carry/gpu --include-ignored --test-threads=1 ) > $R/gpu-run-kernel.log 2>&1
grep "test result" $R/gpu-run-kernel.log
tar czf $OUT/run6.tgz -C $R .
