#!/usr/bin/env bash
# Session 10, device call 8: every graph-replay test of the GPU binary, the new one (SwapAb32 and SwapAbMerged
# forced in the Fused layer) among them.
cd "$(dirname "$0")/../../.."
timeout 90 ./carry/gpu --include-ignored --test-threads=1 replay 2>&1 | tee $OUT/gpu-replay.log | grep -E "^test |test result"
