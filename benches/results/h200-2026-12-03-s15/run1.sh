#!/usr/bin/env bash
# Session 15, call 1: session 14's run8 (live tiles; binaries rebuilt from 18b4892 = 43fd433's code) plus the
# GEMM1 K-split knob (g1-steps-knob.patch: MOE_G1_STEPS, the K steps each split keeps at least; base 8).
#   base-moe-gemm     HEAD as is
#   live-moe-gemm     ../h200-2026-12-03-s14/live-tiles.patch
#   liveall-moe-gemm  ../h200-2026-12-03-s14/live-tiles-all.patch
#   g1-moe-gemm       g1-steps-knob.patch
#   gpu               the GPU tests of live-tiles-all.patch
# The decode A/B, the GPU suite of liveall, then liveall's whole Auto suite twice.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=$OUT/r; mkdir -p $R  # straight under $OUT: what ran comes back even if the call is cut short
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64,128,256 --routing uniform,balanced,zipf"
for i in 1 2; do
  for v in base live liveall; do
    timeout 60 ./carry/$v-moe-gemm $S --csv $R/dec-$v-$i.csv > $R/dec-$v-$i.log 2>&1
  done
  for st in 16 32; do
    MOE_G1_STEPS=$st timeout 60 ./carry/g1-moe-gemm $S --csv $R/dec-g$st-$i.csv > $R/dec-g$st-$i.log 2>&1
  done
done
timeout 170 ./carry/gpu --include-ignored --test-threads=1 > $R/gpu-liveall.log 2>&1
# The whole Auto suite of liveall twice (its shipped tables as they are), in case it is the code kept.
for i in 1 2; do
  timeout 110 ./carry/liveall-moe-gemm bench --layer --suite --backends auto --peer none --reps 20 --csv $R/suite-liveall-$i.csv > $R/suite-liveall-$i.log 2>&1
done
gzip $R/*.csv $R/*.log 2>/dev/null; true
