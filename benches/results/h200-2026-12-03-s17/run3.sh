#!/usr/bin/env bash
# Session 17, run 3: the chunked layout build past 1024 rows (chunk: bc23ac6) and, on top of it, the SM90
# grouped GEMM launched with PDL behind a griddepcontrol wait (cpdl). carryz/ (git-ignored): base-moe-gemm
# (afb13d2), chunk-moe-gemm + gpu-chunk, cpdl-moe-gemm + gpu-cpdl. The GPU suite of cpdl, the Auto layer suite
# base / cpdl alternating twice, then chunk's GPU suite only where cpdl failed its tests.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
timeout 150 ./carry/gpu-cpdl --include-ignored --test-threads=1 > $R/gpu-cpdl.log 2>&1
tail -3 $R/gpu-cpdl.log; grep -E "^test .*FAILED|panicked" $R/gpu-cpdl.log | head
tar czf $OUT/run3.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
# (device time was short: base and cpdl alternate twice; chunk alone is not timed)
for v in base-1 cpdl-1 base-2 cpdl-2; do
  timeout 60 ./carry/${v%-*}-moe-gemm $S --csv $R/suite-$v.csv > $R/suite-$v.log 2>&1; echo "$v rc=$?"
done
tar czf $OUT/run3.tgz -C $R .
if ! grep -q "test result: ok" $R/gpu-cpdl.log; then
  timeout 150 ./carry/gpu-chunk --include-ignored --test-threads=1 > $R/gpu-chunk.log 2>&1; tail -3 $R/gpu-chunk.log
fi
tar czf $OUT/run3.tgz -C $R .
