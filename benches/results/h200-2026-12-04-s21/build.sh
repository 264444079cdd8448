#!/usr/bin/env bash
# Builds a revision (optionally with a patch) into carryz/NAME-moe-gemm.gz and carryz/gpu-NAME.gz through a worktree
# sharing this tree's target dir (s19's build7.sh, one target per call). Usage: build.sh NAME REV [PATCH]
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$(pwd); T=$ROOT/target; mkdir -p carryz
export MOE_GEMM_CUDA_CACHE=${MOE_GEMM_CUDA_CACHE:-/work/cudacache}
w=/tmp/build-$1
rm -rf "$w"; git worktree prune; git worktree add -q --detach "$w" "$2"
mkdir -p "$w/third_party"; ln -sfn "$ROOT/third_party/pypi" "$w/third_party/pypi"
[ -n "${3:-}" ] && (cd "$w" && git apply "$ROOT/$3")
touch "$w"/cpp/* "$w"/build.rs
(cd "$w" && CARGO_TARGET_DIR=$T cargo build --release --bins && CARGO_TARGET_DIR=$T cargo test --release --no-run)
gzip -c "$T/release/moe-gemm" > "carryz/$1-moe-gemm.gz"
gzip -c "$(ls -t "$T"/release/deps/gpu-* | grep -v '\.d$' | head -1)" > "carryz/gpu-$1.gz"
git worktree remove --force "$w"
touch cpp/* build.rs  # the next build of this tree rebuilds its own units
