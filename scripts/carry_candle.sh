#!/usr/bin/env bash
# Builds ci/candle-downstream's GPU tests (moe-gemm's candle op against candle's own FusedMoe) here, without a GPU
# or a driver, and puts them in carry/candle_moe.xz for the GPU host (scripts/gpu_check.sh runs them).
#
# candle-core's `cuda` feature links libcuda, libcublas and libcurand when the binary is built (cudarc's
# dynamic-linking). This machine has none of them, so the link takes cuBLAS and cuRAND from NVIDIA's PyPI wheels
# and libcuda from a stub made of cudarc's driver bindings: every `cu*` function it declares, empty, under the
# soname libcuda.so.1 (what the CUDA toolkit's lib64/stubs/libcuda.so is for; the PyPI toolkit has none). The
# binary records libcuda.so.1, libcublas.so.13 and libcurand.so.10: on the GPU host the driver and PyTorch's
# nvidia wheels serve them (gpu_check.sh puts those on LD_LIBRARY_PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
link=target/candle-link
mkdir -p "$link" carry
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
ls -la carry/candle_moe.xz
