#!/usr/bin/env bash
# Session 11, device call 1: the fused GEMM tests of the merged tile with GEMM1's K split in two; the merged tile
# forced, session 10's binary (base) and the new one alternating twice; SwapAb16 forced on the new one; the Auto
# suite of the new binary twice; racecheck of the fused test.
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R
timeout 120 ./carry/gpu --include-ignored --test-threads=1 fused > $R/gpu-fused.log 2>&1
grep "test result" $R/gpu-fused.log
C="bench --layer --backends fused --models qwen3-30b-a3b,qwen3-235b-a22b,gpt-oss-120b,deepseek-v3,mixtral-8x7b --layer-tokens 2,4,8,16,32,64,128,256 --routing uniform,zipf --peer none --reps 20"
for i in 1 2; do
  timeout 100 ./carry/base-moe-gemm $C --fused-tile fused-swapab-merged > $R/merged-base-$i.log 2>&1
  timeout 100 ./carry/moe-gemm $C --fused-tile fused-swapab-merged > $R/merged-new-$i.log 2>&1
done
timeout 100 ./carry/moe-gemm $C --fused-tile fused-swapab-16 > $R/s16-new-1.log 2>&1
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do timeout 100 ./carry/moe-gemm $S --csv $R/suite-new-$i.csv > $R/suite-new-$i.log 2>&1; done
tar czf $OUT/run1.tgz -C $R .
( timeout 150 compute-sanitizer --tool racecheck ./carry/gpu --include-ignored --test-threads=1 fused_gemms_match ) > $R/racecheck.log 2>&1
tail -5 $R/racecheck.log
cp $R/racecheck.log $OUT/
