#!/usr/bin/env bash
# Session 13, device call 10: the final code against base (4ce9aaf) on one machine, the whole Auto suite
# alternating twice: run 5's suites ran on a machine 1-2% slower than session 12's, so the final code's two
# changes (kScanTmp; the plain units' SASS lowered from compute_90 PTX: sm_90 / sm_100 instead of sm_90a /
# sm_100a) are checked for speed here.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do
  timeout 120 ./carry/base-moe-gemm $S --csv $R/suite-base-$i.csv > $R/suite-base-$i.log 2>&1
  timeout 120 ./carry/moe-gemm $S --csv $R/suite-final-$i.csv > $R/suite-final-$i.log 2>&1
done
tar czf $OUT/run6.tgz -C $R .
