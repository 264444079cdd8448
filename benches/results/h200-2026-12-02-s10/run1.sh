#!/usr/bin/env bash
# Session 10, device call 1: the GPU suite of the shared-position SwapAb32, racecheck of its test, and the tile
# forced on base (HEAD of session 9) and new binaries alternating twice.
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt
# A hang or a wrong result in the new kernel ends the call here.
if ! timeout 60 ./carry/gpu --include-ignored --test-threads=1 fused:: > $R/gpu-fused-first.log 2>&1; then
  tail -30 $R/gpu-fused-first.log; tar czf $OUT/run1.tgz -C $R .; exit 1
fi
( time timeout 240 ./carry/gpu --include-ignored --test-threads=1 ) > $R/gpu-new.log 2>&1
grep "test result" $R/gpu-new.log
( time timeout 150 compute-sanitizer --tool racecheck ./carry/gpu --include-ignored --exact fused::fused_gemms_match_the_reference_for_every_tile ) > $R/racecheck.log 2>&1
tail -4 $R/racecheck.log
B="bench --layer --backends fused --fused-tile fused-swapab-32 --models mixtral-8x7b,qwen3-30b-a3b,qwen3-235b-a22b,gpt-oss-120b --layer-tokens 16,32,64,128,256 --routing uniform,zipf --peer none --reps 20"
for i in 1 2; do
  ( time timeout 120 ./carry/base-moe-gemm $B ) > $R/ab32-base-$i.log 2>&1
  ( time timeout 120 ./carry/moe-gemm $B ) > $R/ab32-new-$i.log 2>&1
  tail -3 $R/ab32-new-$i.log
done
C="bench --layer --backends fused --fused-tile fused-swapab-16 --models mixtral-8x7b,qwen3-30b-a3b,gpt-oss-120b --layer-tokens 1,8 --peer none --reps 20"
./carry/base-moe-gemm $C > $R/ab16-base-1.log 2>&1
./carry/moe-gemm $C > $R/ab16-new-1.log 2>&1
tar czf $OUT/run1.tgz -C $R .
