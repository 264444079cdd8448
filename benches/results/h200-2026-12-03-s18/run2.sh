#!/usr/bin/env bash
# Session 18, run 2: where cutlass-pdl loses Mixtral T = 512 uniform. carryz/: exp-moe-gemm (branch cpdl-exp: the
# GEMM through the waiting entry, MOE_CPDL picks where it is launched early: 0 nowhere, 1 both GEMMs, 2 GEMM1 only,
# 3 GEMM2 only, 4 both but prepare_groups does not trigger early) and main-moe-gemm. Grouped backend, three rounds.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
M="bench --layer --backends grouped --peer none --reps 30 --models mixtral-8x7b,qwen3-30b-a3b --layer-tokens 256,512,1024 --routing uniform"
for i in 1 2 3; do
  timeout 60 ./carry/main-moe-gemm $M --csv $R/p-main-$i.csv > $R/p-main-$i.log 2>&1; echo "main $i rc=$?"
  for m in 0 1 2 3 4; do
    MOE_CPDL=$m timeout 60 ./carry/exp-moe-gemm $M --csv $R/p-m$m-$i.csv > $R/p-m$m-$i.log 2>&1; echo "m$m $i rc=$?"
  done
  tar czf $OUT/run2.tgz -C $R .
done
