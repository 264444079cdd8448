#!/usr/bin/env bash
# Session 16, run 4: the GEMM1 -> GEMM2 hand-off as landed on branch gemm2-handoff (merged tile, early GEMM2s;
# counters in the layout, zeroed by its build). carryz/: live16-moe-gemm (main, e73c19c), handoff-moe-gemm and
# gpu (the branch). The GEMM test suite first, then the decode points under Auto alternating twice.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
timeout 170 ./carry/gpu --include-ignored --test-threads=1 > $R/gpu-handoff.log 2>&1
tail -3 $R/gpu-handoff.log; grep -E "^test .*FAILED|panicked" $R/gpu-handoff.log | head
tar czf $OUT/run4.tgz -C $R .
S="bench --layer --backends auto --peer none --reps 20 --layer-tokens 1,2,4,8,16,32,64,128,256 --routing uniform,balanced,zipf"
for i in 1 2; do for v in live16 handoff; do
  timeout 40 ./carry/$v-moe-gemm $S --csv $R/dec-$v-$i.csv > $R/dec-$v-$i.log 2>&1; echo "$v $i rc=$?"
done; done
tar czf $OUT/run4.tgz -C $R .
