#!/usr/bin/env bash
# Session 14, device call 6: two prototypes in one binary (combine-proto.patch), each behind an environment knob.
# - MOE_COMBINE_ROWS: GEMM2 with the combine fused where T * k is at most this (the last CTA of each column chunk
#   sums the chunk's pair rows per token; no sum_slots kernel). The layer GPU tests run with it at 64.
# - MOE_SPLIT_WANT: the SwapAb16 GEMM2's K split over warps while its warp tasks are fewer than this many times
#   the SMs' 8 resident warps (today 1).
# The decode points under Auto, alternating twice against base (43fd433): c0 (both off), c16, c64, w2, w3.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
MOE_COMBINE_ROWS=64 timeout 200 ./carry/gpu --include-ignored --test-threads=1 layer > $R/gpu-layer-c64.log 2>&1
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64,128,256 --routing uniform,balanced,zipf"
for i in 1 2; do
  timeout 100 ./carry/base-moe-gemm $S --csv $R/dec-base-$i.csv > $R/dec-base-$i.log 2>&1
  for k in 0 16 64; do
    MOE_COMBINE_ROWS=$k timeout 100 ./carry/moe-gemm $S --csv $R/dec-c$k-$i.csv > $R/dec-c$k-$i.log 2>&1
  done
  for w in 2 3; do
    MOE_SPLIT_WANT=$w timeout 100 ./carry/moe-gemm $S --csv $R/dec-w$w-$i.csv > $R/dec-w$w-$i.log 2>&1
  done
done
tar czf $OUT/run6.tgz -C $R .
