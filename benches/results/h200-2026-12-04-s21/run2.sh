#!/usr/bin/env bash
# Session 21, run 2. carryz/: base (main 80ecb7b), pf8 / pf16 (pf-proto.patch: in the shared-ring mainloop every
# kPf K steps each row-owning lane sends its rows' next kPf steps to L2, MOE_PF = 8 / 16), proto (run 1's K split
# at S = 1). Merged tile forced, 5 models, T = 16 / 64 / 256, and the Auto suite, alternating twice.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
S="bench --layer --suite --backends auto --peer none --reps 20"
M="bench --layer --backends fused --fused-tile swapab-merged --peer none --reps 30 --models qwen3-235b-a22b,qwen3-30b-a3b,mixtral-8x7b,gpt-oss-120b,deepseek-v3 --layer-tokens 16,64,256 --routing uniform,zipf"
for i in 1 2; do for v in base pf8 pf16 proto; do
  timeout 60 ./carry/$v-moe-gemm $M --csv $R/m-$v-$i.csv > $R/m-$v-$i.log 2>&1; echo "m $v $i rc=$?"
  [ $v = proto ] && continue
  timeout 100 ./carry/$v-moe-gemm $S --csv $R/suite-$v-$i.csv > $R/suite-$v-$i.log 2>&1; echo "suite $v $i rc=$?"
done; tar czf $OUT/run2.tgz -C $R .; done
