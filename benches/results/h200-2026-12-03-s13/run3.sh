#!/usr/bin/env bash
# Session 13, device call 7: SwapAb16 (the private-ring kernel) issuing its K steps in pairs (256 contiguous bytes
# per weight row asked for at once, a pair of stages refilled once both are read), against base (4ce9aaf) on
# the decode buckets under Auto, alternating twice: p1 with the L2::256B hint, pn without it (in every kernel).
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
( time timeout 120 ./carry/gpu --include-ignored --test-threads=1 fused ) > $R/gpu-fused-p1.log 2>&1
grep "test result" $R/gpu-fused-p1.log
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64,128,256 --routing uniform,balanced,zipf"
for i in 1 2; do
  for v in base p1 pn; do
    timeout 100 ./carry/$v-moe-gemm $S --csv $R/dec-$v-$i.csv > $R/dec-$v-$i.log 2>&1
  done
done
tar czf $OUT/run3.tgz -C $R .
