#!/usr/bin/env bash
# Builds run7.sh's and run8.sh's executables into carryz/ (git-ignored), each from its own worktree through one
# shared target dir: main (HEAD), wg2 (branch merged-wgmma), trace (HEAD + merged-trace.patch), w128 (branch
# merged-wgmma-128). Usage: build7.sh [NAME...] (default: all four). Cargo decides reruns of build.rs
# by mtime, so each tree's sources are touched before its build; MOE_GEMM_CUDA_CACHE makes unchanged units free.
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$(pwd); T=$ROOT/target; mkdir -p carryz
export MOE_GEMM_CUDA_CACHE=${MOE_GEMM_CUDA_CACHE:-/work/cudacache}
build() {  # name rev [patch]
  local w=/tmp/build7-$1
  rm -rf "$w"; git worktree prune; git worktree add -q --detach "$w" "$2"
  mkdir -p "$w/third_party"; ln -sfn "$ROOT/third_party/pypi" "$w/third_party/pypi"
  [ -n "${3:-}" ] && (cd "$w" && git apply "$ROOT/$3")
  touch "$w"/cpp/* "$w"/build.rs
  (cd "$w" && CARGO_TARGET_DIR=$T cargo build --release --bins && CARGO_TARGET_DIR=$T cargo test --release --no-run)
  gzip -c "$T/release/moe-gemm" > "carryz/$1-moe-gemm.gz"
  gzip -c "$(ls -t "$T"/release/deps/gpu-* | grep -v '\.d$' | head -1)" > "carryz/gpu-$1.gz"
  git worktree remove --force "$w"
}
want() { [ $# -eq 0 ] && return 0; for n in "${ARGS[@]}"; do [ "$n" = "$1" ] && return 0; done; return 1; }
ARGS=("$@")
if [ ${#ARGS[@]} -eq 0 ]; then ARGS=(main wg2 trace w128); fi
want main && build main HEAD
want wg2 && build wg2 merged-wgmma
want trace && build trace HEAD benches/results/h200-2026-12-03-s19/merged-trace.patch && rm -f carryz/gpu-trace.gz
want w128 && build w128 merged-wgmma-128
touch cpp/* build.rs  # the next build of this tree rebuilds its own units
ls -la carryz
