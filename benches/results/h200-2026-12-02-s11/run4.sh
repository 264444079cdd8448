#!/usr/bin/env bash
# Session 11, device call 4: the merged tile's one-block runs streamed as SwapAb16 (private rings, S = 1). The
# fused GPU tests; the merged tile forced, c16997a (base) and the new binary alternating twice; the decode buckets
# re-tuned with it and merged into copies of c16997a's tables; the Auto suite of c16997a (its tables) and of the
# new binary with the merged copies (--tuned), alternating twice.
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R/tuned
timeout 120 ./carry/gpu --include-ignored --test-threads=1 fused > $R/gpu-fused-private16.log 2>&1
grep "test result" $R/gpu-fused-private16.log
C="bench --layer --backends fused --fused-tile swapab-merged --models qwen3-30b-a3b,qwen3-235b-a22b,gpt-oss-120b,deepseek-v3,mixtral-8x7b --layer-tokens 2,4,8,16,32,64,128,256 --routing uniform,zipf --peer none --reps 20"
for i in 1 2; do
  timeout 100 ./carry/base-moe-gemm $C > $R/p16-base-$i.log 2>&1
  timeout 100 ./carry/moe-gemm $C > $R/p16-new-$i.log 2>&1
done
for m in mixtral-8x7b qwen3-30b-a3b qwen3-235b-a22b deepseek-v3 gpt-oss-120b; do
  timeout 150 ./carry/moe-gemm tune --model $m --tokens 1,2,4,8,16,32,64,128,256 --out $R/tuned --reps 20 > $R/tune-$m.log 2>&1
done
python3 benches/results/h200-2026-12-02-s10/merge_tables.py $R/tuned configs/h200 $R/tables > $R/merge.log
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do
  timeout 100 ./carry/base-moe-gemm $S --csv $R/psuite-base-$i.csv > $R/psuite-base-$i.log 2>&1
  timeout 100 ./carry/moe-gemm $S --tuned $R/tables --csv $R/psuite-new-$i.csv > $R/psuite-new-$i.log 2>&1
done
tar czf $OUT/run4.tgz -C $R .
