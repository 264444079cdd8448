#!/usr/bin/env bash
# Session 11, device call 3: the GPU suite of c16997a (Fused tiles from the tuned tables; the re-tuned shipped
# tables compiled in), then the Auto suite of session 10's binary (base) and of c16997a (shipped tables, no
# --tuned) alternating twice.
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R
( time timeout 300 ./carry/gpu --include-ignored --test-threads=1 ) > $R/gpu-final-c16997a.log 2>&1
grep "test result" $R/gpu-final-c16997a.log
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do
  timeout 100 ./carry/base-moe-gemm $S --csv $R/fsuite-base-$i.csv > $R/fsuite-base-$i.log 2>&1
  timeout 100 ./carry/moe-gemm $S --csv $R/fsuite-new-$i.csv > $R/fsuite-new-$i.log 2>&1
done
tar czf $OUT/run3.tgz -C $R .
