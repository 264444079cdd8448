#!/usr/bin/env bash
# Builds every GPU executable here (no GPU needed) and copies it into carry/ (git-ignored) for the GPU host:
# carry/gpu (the GPU tests), carry/moe-gemm, carry/examples.tar.xz (the numbered examples); with CARRY_BENCHES=1 also the Criterion
# benches (carry/layer_bench, carry/grouped_gemm_bench), built with the `bench` feature in target/bench so that
# the feature does not rebuild the library of target/release back and forth; with CARRY_TORCH=1 also the PyTorch
# op (carry/torch), with CARRY_CANDLE=1 the candle op's tests (carry/candle_moe.xz).
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
if [ "${CARRY_CANDLE:-0}" = 1 ]; then
  # The candle op's GPU tests (ci/candle-downstream against candle's own FusedMoe), linked here without a GPU or
  # a driver: candle-core's `cuda` links libcuda, libcublas and libcurand when the binary is built (cudarc's
  # dynamic-linking), so the link takes cuBLAS, cuRAND (and NVRTC, named but left out by --as-needed) from
  # NVIDIA's PyPI wheels and libcuda from a stub of cudarc's driver bindings, every `cu*` function empty under
  # the soname libcuda.so.1 (what the toolkit's lib64/stubs/libcuda.so is for; the PyPI toolkit has none). The
  # binary records libcuda.so.1, libcublas.so.13 and libcurand.so.10: on the GPU host the driver and PyTorch's
  # nvidia wheels serve them (gpu_check.sh). carry/candle_moe.xz, xz-compressed.
  (
  link=target/candle-link
  mkdir -p "$link"
  if [ ! -e "$link/libcublas.so" ] || [ ! -e "$link/libcurand.so" ] || [ ! -e "$link/libnvrtc.so" ]; then
    # (NVRTC is named on the link line but nothing uses it: --as-needed leaves it out of the binary.)
    pip download --no-deps -q -d "$link/wheels" "nvidia-cublas==13.*" "nvidia-curand==10.*" "nvidia-cuda-nvrtc==13.*"
    for w in "$link"/wheels/nvidia_cublas*.whl "$link"/wheels/nvidia_curand*.whl "$link"/wheels/nvidia_cuda_nvrtc*.whl; do
      unzip -q -o -j "$w" 'nvidia/*/lib/*.so*' -d "$link"
    done
    ln -sf libcublas.so.13 "$link/libcublas.so"
    ln -sf libcublasLt.so.13 "$link/libcublasLt.so"
    ln -sf libcurand.so.10 "$link/libcurand.so"
    ln -sf libnvrtc.so.13 "$link/libnvrtc.so"
  fi
  nvcc=$(ls "$PWD"/third_party/pypi/nvidia/cu*/bin/nvcc | head -1)
  ln -sf "$(cd "$(dirname "$nvcc")/../lib" && pwd)/libcudart.so.13" "$link/libcudart.so"
  bindings=$(ls ~/.cargo/registry/src/*/cudarc-0.19.*/src/driver/sys/mod.rs | tail -1)
  grep -oE "fn cu[A-Za-z0-9_]+\(" "$bindings" | sort -u | sed 's/fn \(.*\)(/void \1(void) {}/' > "$link/cuda_stub.c"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$link/libcuda.so" "$link/cuda_stub.c"
  export PATH="$(dirname "$nvcc"):$PATH" NVCC="$nvcc" CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
  export LIBRARY_PATH="$PWD/$link${LIBRARY_PATH:+:$LIBRARY_PATH}" CARGO_TARGET_DIR="${CANDLE_TARGET_DIR:-$PWD/target/candle}"
  cargo test --release --no-run --manifest-path ci/candle-downstream/Cargo.toml
  bin=$(ls -t "$CARGO_TARGET_DIR"/release/deps/candle_moe-* | grep -v '\.d$' | head -1)
  xz -T2 -9 -c "$bin" > carry/candle_moe.xz
  )  # a subshell: candle's PATH, LIBRARY_PATH and target folder stay out of the rest
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
