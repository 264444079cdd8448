#!/usr/bin/env bash
# Builds every GPU executable here (no GPU needed) and copies it into carry/ (git-ignored) for the GPU host:
# carry/gpu (the GPU tests), carry/moe-gemm, carry/moe_layer (example), carry/layer_bench, carry/grouped_gemm_bench.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bins --examples
cargo test --release --no-run
cargo bench --no-run
mkdir -p carry
newest() { ls -t target/release/deps/"$1"-* | grep -v '\.d$' | head -1; }
cp target/release/moe-gemm carry/
cp target/release/examples/moe_layer carry/
cp "$(newest gpu)" carry/gpu
cp "$(newest layer)" carry/layer_bench
cp "$(newest grouped_gemm)" carry/grouped_gemm_bench
ls -la carry
