#!/usr/bin/env bash
# Builds every GPU executable here (no GPU needed) and copies it into carry/ (git-ignored) for the GPU host:
# carry/gpu (the GPU tests), carry/moe-gemm, carry/examples.tar.xz (the numbered examples); with CARRY_BENCHES=1 also the Criterion
# benches (carry/layer_bench, carry/grouped_gemm_bench), built with the `bench` feature in target/bench so that
# the feature does not rebuild the library of target/release back and forth; with CARRY_TORCH=1 also the PyTorch
# op (carry/torch).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bins --examples
cargo test --release --no-run
mkdir -p carry
newest() { ls -t target/release/deps/"$1"-* | grep -v '\.d$' | head -1; }
cp target/release/moe-gemm carry/
# The numbered examples, xz-compressed (each links the whole library: five raw binaries would pass the GPU
# call's 64 MiB); gpu_check.sh unpacks them.
rm -rf carry/examples carry/examples.tar.xz
mkdir -p carry/examples
for ex in examples/[0-9][0-9]_*.rs; do ex=$(basename "$ex" .rs); cp "target/release/examples/$ex" carry/examples/; done
tar cJf carry/examples.tar.xz -C carry examples && rm -rf carry/examples
cp "$(newest gpu)" carry/gpu
if [ "${CARRY_BENCHES:-0}" = 1 ]; then
  CARGO_TARGET_DIR=target/bench cargo bench --no-run --features bench
  benched() { ls -t target/bench/release/deps/"$1"-* | grep -v '\.d$' | head -1; }
  cp "$(benched layer)" carry/layer_bench
  cp "$(benched grouped_gemm)" carry/grouped_gemm_bench
fi
if [ "${CARRY_TORCH:-0}" = 1 ]; then
  # The PyTorch op (python/): its package with the extension module, and its tests; on the GPU host
  # `PYTHONPATH=carry/torch python3 carry/torch/test_op.py`.
  cargo build --release --manifest-path python/Cargo.toml
  rm -rf carry/torch && mkdir -p carry/torch/moe_gemm_torch
  cp python/moe_gemm_torch/__init__.py carry/torch/moe_gemm_torch/
  cp python/target/release/lib_native.so carry/torch/moe_gemm_torch/_native.abi3.so
  cp python/tests/test_op.py carry/torch/
fi
if [ "${CARRY_PLANTED:-0}" = 1 ]; then
  # The sanitizer check's planted bugs (build.rs, MOE_GEMM_PLANT): one test binary each, then the clean build
  # again, so that target/release holds no planted code.
  for plant in warp-race row-store uninit-status; do
    MOE_GEMM_PLANT=$plant cargo test --release --no-run --test gpu
    cp "$(newest gpu)" carry/gpu-plant-$plant
  done
  cargo test --release --no-run --test gpu
fi
ls -la carry
