#!/usr/bin/env bash
# Session 20, first device call: s19's run7.sh and run8.sh in one call (carryz/ from s19's build7.sh; main rebuilt
# at 117d5c9). 1. GPU tests main, wg2 (branch merged-wgmma, ea98876); 2. merged tile forced, main/wg2/w128 twice;
# 3. per-CTA traces, Qwen3-235B T = 256; 4. Auto suite main/wg2 twice; 5. GPU tests w128 (merged-wgmma-128).
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R; S19=benches/results/h200-2026-12-03-s19
gpu() { timeout 200 ./carry/gpu-$1 --include-ignored --test-threads=1 > $R/gpu-$1.log 2>&1
  tail -3 $R/gpu-$1.log; grep -E "^test .*FAILED|panicked" $R/gpu-$1.log | head; tar czf $OUT/run1.tgz -C $R .; }
gpu main; gpu wg2
M="bench --layer --backends fused --fused-tile swapab-merged --peer none --reps 30 --models qwen3-235b-a22b,qwen3-30b-a3b,mixtral-8x7b,gpt-oss-120b --layer-tokens 64,128,256 --routing uniform,balanced,zipf"
for i in 1 2; do for v in main wg2 w128; do
  timeout 60 ./carry/$v-moe-gemm $M --csv $R/m-$v-$i.csv > $R/m-$v-$i.log 2>&1; echo "m $v $i rc=$?"
done; done
tar czf $OUT/run1.tgz -C $R .
for r in uniform zipf; do
  MOE_MERGED_TRACE=$R/trace-q235-$r.csv timeout 60 ./carry/trace-moe-gemm bench --layer --backends fused \
    --fused-tile swapab-merged --peer none --reps 5 --models qwen3-235b-a22b --layer-tokens 256 --routing $r \
    > $R/trace-q235-$r.log 2>&1
  python3 $S19/merged_trace.py $R/trace-q235-$r.csv > $R/trace-q235-$r.txt 2>&1
done
tar czf $OUT/run1.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do for v in main wg2; do
  timeout 100 ./carry/$v-moe-gemm $S --csv $R/suite-$v-$i.csv > $R/suite-$v-$i.log 2>&1; echo "suite $v $i rc=$?"
done; done
tar czf $OUT/run1.tgz -C $R .
gpu w128
