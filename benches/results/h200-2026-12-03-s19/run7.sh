#!/usr/bin/env bash
# Prepared in session 19 for the next session's first device call (NOT run in session 19). build7.sh fills
# carryz/: main (HEAD), wg2 (branch merged-wgmma at ea98876: wgmma for the merged tile's 64-position runs, main's
# Task::bind kept), trace (HEAD + merged-trace.patch).
# 1. GPU tests of main and wg2; 2. the merged tile forced (run 5's 36 points), main / wg2 twice; 3. Auto suite,
# main / wg2 twice; 4. per-CTA traces of the merged tile at Qwen3-235B T = 256, uniform and zipf.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
for v in main wg2; do
  timeout 200 ./carry/gpu-$v --include-ignored --test-threads=1 > $R/gpu-$v.log 2>&1
  tail -3 $R/gpu-$v.log; grep -E "^test .*FAILED|panicked" $R/gpu-$v.log | head
done
tar czf $OUT/run7.tgz -C $R .
M="bench --layer --backends fused --fused-tile swapab-merged --peer none --reps 30 --models qwen3-235b-a22b,qwen3-30b-a3b,mixtral-8x7b,gpt-oss-120b --layer-tokens 64,128,256 --routing uniform,balanced,zipf"
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do for v in main wg2; do
  timeout 60 ./carry/$v-moe-gemm $M --csv $R/m-$v-$i.csv > $R/m-$v-$i.log 2>&1; echo "m $v $i rc=$?"
  timeout 100 ./carry/$v-moe-gemm $S --csv $R/suite-$v-$i.csv > $R/suite-$v-$i.log 2>&1; echo "suite $v $i rc=$?"
done; done
tar czf $OUT/run7.tgz -C $R .
for r in uniform zipf; do
  MOE_MERGED_TRACE=$R/trace-q235-$r.csv timeout 60 ./carry/trace-moe-gemm bench --layer --backends fused \
    --fused-tile swapab-merged --peer none --reps 5 --models qwen3-235b-a22b --layer-tokens 256 --routing $r \
    > $R/trace-q235-$r.log 2>&1
  python3 benches/results/h200-2026-12-03-s19/merged_trace.py $R/trace-q235-$r.csv | tee $R/trace-q235-$r.txt
done
tar czf $OUT/run7.tgz -C $R .
