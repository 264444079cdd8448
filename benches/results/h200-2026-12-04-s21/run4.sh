#!/usr/bin/env bash
# Session 21, run 4. carryz/: base (main 80ecb7b). Does the scratch's size move T = 1? gpt-oss and Qwen3-30B at
# T = 1 (Auto) in a process whose largest point is T = 1, 512 or 16384 (the layout's capacity follows the largest
# batch Auto sends each backend), alternating three times.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
for i in 1 2 3; do for t in 1 1,512 1,16384; do
  timeout 60 ./carry/base-moe-gemm bench --layer --backends auto --peer none --reps 40 --models gpt-oss-120b,qwen3-30b-a3b --layer-tokens $t --routing uniform --csv $R/cap-$t-$i.csv > $R/cap-$t-$i.log 2>&1; echo "cap $t $i rc=$?"
done; done
tar czf $OUT/run4.tgz -C $R .
