#!/usr/bin/env bash
# Session 17, run 2: the chunked layout build past 1024 rows (256-row chunks, PDL-chained passes, batched scan).
# carryz/ (git-ignored): base-moe-gemm (afb13d2: main with PDL), chunk-moe-gemm and gpu (the change).
# The GPU suite first, then the Auto layer suite alternating base / chunk twice.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
timeout 200 ./carry/gpu --include-ignored --test-threads=1 > $R/gpu-chunk.log 2>&1
tail -3 $R/gpu-chunk.log; grep -E "^test .*FAILED|panicked" $R/gpu-chunk.log | head
tar czf $OUT/run2.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do for v in base chunk; do
  timeout 100 ./carry/$v-moe-gemm $S --csv $R/suite-$v-$i.csv > $R/suite-$v-$i.log 2>&1; echo "$v $i rc=$?"
done; done
tar czf $OUT/run2.tgz -C $R .
