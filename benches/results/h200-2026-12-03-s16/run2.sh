#!/usr/bin/env bash
# Session 16, run 2: ready-flags-proto.patch (GEMM2's CTAs of a layout block start once GEMM1 has written that
# block's h, counted per block in static device flags) against HEAD (e73c19c, live16).
# carryz/: live16-moe-gemm (HEAD), flags-moe-gemm and gpu (the patch). Decode points under Auto alternating
# three times, then the GEMM test suite on the patch. Tarred into run2.tgz.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64,128,256 --routing uniform,balanced,zipf"
for i in 1 2 3; do for v in live16 flags; do
  timeout 60 ./carry/$v-moe-gemm $S --csv $R/dec-$v-$i.csv > $R/dec-$v-$i.log 2>&1; echo "$v $i rc=$?"
done; done
tar czf $OUT/run2.tgz -C $R .
timeout 250 ./carry/gpu --include-ignored --test-threads=1 > $R/gpu-flags.log 2>&1
tail -3 $R/gpu-flags.log; grep -E "^test .*FAILED|panicked" $R/gpu-flags.log | head
tar czf $OUT/run2.tgz -C $R .
