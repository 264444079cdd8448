#!/usr/bin/env bash
# Session 20, run 4. carryz/: final (main 67875c2), ho (branch merged-handoff-all: the merged tile's GEMM2 on the
# hand-off and launched early on any grid), hotrace (ho + merged-trace.patch).
# 1. GPU tests of ho; 2. Auto suite final / ho alternating twice; 3. merged tile forced, final / ho twice;
# 4. per-CTA traces (ho): Qwen3-235B T = 256 and Mixtral T = 64, uniform.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R/tuned; D=benches/results/h200-2026-12-03-s20
timeout 200 ./carry/gpu-ho --include-ignored --test-threads=1 > $R/gpu-ho.log 2>&1
tail -3 $R/gpu-ho.log; grep -E "^test .*FAILED|panicked" $R/gpu-ho.log | head
tar czf $OUT/run4.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
M="bench --layer --backends fused --fused-tile swapab-merged --peer none --reps 30 --models qwen3-235b-a22b,qwen3-30b-a3b,mixtral-8x7b,gpt-oss-120b,deepseek-v3 --layer-tokens 64,128,256,512 --routing uniform,zipf"
for i in 1 2; do for v in final ho; do
  timeout 100 ./carry/$v-moe-gemm $S --csv $R/suite-$v-$i.csv > $R/suite-$v-$i.log 2>&1; echo "suite $v $i rc=$?"
  timeout 60 ./carry/$v-moe-gemm $M --csv $R/m-$v-$i.csv > $R/m-$v-$i.log 2>&1; echo "m $v $i rc=$?"
done; tar czf $OUT/run4.tgz -C $R .; done
for p in "qwen3-235b-a22b 256" "mixtral-8x7b 64"; do set -- $p
  MOE_MERGED_TRACE=$R/trace-$1-$2.csv timeout 60 ./carry/hotrace-moe-gemm bench --layer --backends fused \
    --fused-tile swapab-merged --peer none --reps 5 --models $1 --layer-tokens $2 --routing uniform > $R/trace-$1-$2.log 2>&1
  python3 $D/trace_tail.py $R/trace-$1-$2.csv > $R/trace-$1-$2.txt 2>&1; cat $R/trace-$1-$2.txt
done
tar czf $OUT/run4.tgz -C $R .
