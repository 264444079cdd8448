#!/usr/bin/env bash
# Session 10, device call 3: the SwapAb tiles with their CTAs ordered in groups of G layout blocks (blocks fastest),
# G = 1 (moe-gemm: the order before), 4, 16, 64; each tile forced, binaries alternating twice.
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R
M="--models mixtral-8x7b,qwen3-30b-a3b,qwen3-235b-a22b,gpt-oss-120b,deepseek-v3 --routing uniform,zipf --peer none --reps 20"
A="bench --layer --backends fused --fused-tile fused-swapab-32 --layer-tokens 16,32,64,128,256 $M"
B="bench --layer --backends fused --fused-tile fused-swapab-16 --layer-tokens 4,8,16,32,64 $M"
for i in 1 2; do
  for g in 1 4 16 64; do
    bin=./carry/moe-gemm-g$g; [ $g = 1 ] && bin=./carry/moe-gemm
    timeout 100 $bin $A > $R/g32-g$g-$i.log 2>&1
    timeout 100 $bin $B > $R/g16-g$g-$i.log 2>&1
  done
done
tar czf $OUT/run3.tgz -C $R .
