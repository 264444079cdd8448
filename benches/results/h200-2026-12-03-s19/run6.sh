#!/usr/bin/env bash
# Session 19, run 6 (prepared, NOT run: no device time left). carryz/: trace-moe-gemm, built from main with
# merged-trace.patch applied. Per-CTA traces of the merged tile at Qwen3-235B T = 256, uniform and zipf (one
# point per process: the trace keeps the last replay), read by merged_trace.py.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
for r in uniform zipf; do
  MOE_MERGED_TRACE=$R/trace-q235-$r.csv timeout 60 ./carry/trace-moe-gemm bench --layer --backends fused \
    --fused-tile swapab-merged --peer none --reps 5 --models qwen3-235b-a22b --layer-tokens 256 --routing $r \
    > $R/trace-q235-$r.log 2>&1
  python3 benches/results/h200-2026-12-03-s19/merged_trace.py $R/trace-q235-$r.csv | tee $R/trace-q235-$r.txt
done
tar czf $OUT/run6.tgz -C $R .
