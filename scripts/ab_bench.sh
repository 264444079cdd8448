#!/usr/bin/env bash
# A/B of two `moe-gemm` builds on the GPU host, in one call: each binary runs the same `bench --layer` twice,
# alternated (A B A B) so that clock and thermal drift fall on both, then `moe-gemm compare` merges each binary's
# runs by their lower median and prints B / A per point.
#   scripts/ab_bench.sh carry/moe-gemm carry/moe-gemm-exp OUTDIR --dtype fp8 --models deepseek-v3 --layer-tokens 1,4
set -euo pipefail
a=$1 b=$2 out=$3
shift 3
mkdir -p "$out"
for r in 1 2; do
  for side in a b; do
    bin=$a; [ "$side" = b ] && bin=$b
    "$bin" bench --layer --peer none --csv "$out/$side-$r.csv" "$@" > "$out/$side-$r.log" 2>&1
    echo "$side run $r: $(tail -1 "$out/$side-$r.log")"
  done
done
"$a" compare "$out/a-1.csv,$out/a-2.csv" "$out/b-1.csv,$out/b-2.csv" | tee "$out/compare.txt"
