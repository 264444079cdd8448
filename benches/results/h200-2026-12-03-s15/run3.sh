#!/usr/bin/env bash
# Session 15, NOT RUN (the session's device time was spent: seven calls got no machine). Binaries built here
# from the library code of 43fd433 (unchanged since) and gzipped into carryz/ (git-ignored, kept on this machine):
#   base-moe-gemm   HEAD's code
#   proto-moe-gemm  live16-merged-blocks.patch: live tiles in SwapAb16's private rings only
#                   (live-tiles-16.patch) and the merged tile's blocks per CTA as a knob per GEMM
#                   (merged-blocks-knob.patch: MOE_MERGED_BLOCKS1 / MOE_MERGED_BLOCKS2, 4 as in base, or 2)
#   gpu             the GPU tests of that patch
# proto with both knobs unset is live16; p2 splits only GEMM2's 48-64-position runs over two CTAs; p22 both
# GEMMs'. Decode points under Auto alternating three times; the merged tile forced at T = 64-256; the GPU
# suite with the knobs unset and at 2. Tarred into run3.tgz (at most 8 files come back per call).
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64,128,256 --routing uniform,balanced,zipf"
M="bench --layer --backends fused --fused-tile swapab-merged --peer none --reps 20 --layer-tokens 64,128,256 --routing uniform,balanced,zipf"
run() {  # variant, command args, csv prefix, i
  local v=$1 args=$2 pre=$3 i=$4
  case $v in
    base) timeout 60 ./carry/base-moe-gemm $args --csv $R/$pre-base-$i.csv > $R/$pre-base-$i.log 2>&1 ;;
    live16) timeout 60 ./carry/proto-moe-gemm $args --csv $R/$pre-live16-$i.csv > $R/$pre-live16-$i.log 2>&1 ;;
    p2) MOE_MERGED_BLOCKS2=2 timeout 60 ./carry/proto-moe-gemm $args --csv $R/$pre-p2-$i.csv > $R/$pre-p2-$i.log 2>&1 ;;
    p22) MOE_MERGED_BLOCKS1=2 MOE_MERGED_BLOCKS2=2 timeout 60 ./carry/proto-moe-gemm $args --csv $R/$pre-p22-$i.csv > $R/$pre-p22-$i.log 2>&1 ;;
  esac
}
for i in 1 2 3; do for v in base live16 p2 p22; do run $v "$S" dec $i; done; done
for i in 1 2; do for v in base p2 p22; do run $v "$M" merged $i; done; done
tar czf $OUT/run3.tgz -C $R .
timeout 170 ./carry/gpu --include-ignored --test-threads=1 > $R/gpu-proto.log 2>&1
tail -3 $R/gpu-proto.log
MOE_MERGED_BLOCKS1=2 MOE_MERGED_BLOCKS2=2 timeout 170 ./carry/gpu --include-ignored --test-threads=1 > $R/gpu-proto-p22.log 2>&1
tail -3 $R/gpu-proto-p22.log
tar czf $OUT/run3.tgz -C $R .
