#!/usr/bin/env bash
# On the GPU host, from the repository root, after scripts/carry.sh here: every GPU check in one go.
# Writes logs under ${OUT:-out}/ and prints the summary lines.
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
# cuBLAS (the dense-rate ceiling) from PyTorch's CUDA wheels, where present.
lib=$(python3 -c "import os,glob,nvidia; print(':'.join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(d+'/**/libcublas.so*', recursive=True)})))" 2>/dev/null)
export LD_LIBRARY_PATH="${lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# NCCL (the expert-parallel test) from PyTorch's wheels: cudarc's loader asks for libnccl.so, the wheel has .so.2.
nccl=$(python3 -c "import glob,nvidia; print(next(iter(p for d in nvidia.__path__ for p in glob.glob(d+'/**/libnccl.so*', recursive=True)), ''))" 2>/dev/null)
if [ -n "$nccl" ]; then
  mkdir -p "$out/nccl" && ln -sf "$nccl" "$out/nccl/libnccl.so"
  export LD_LIBRARY_PATH="$(cd "$out/nccl" && pwd):$LD_LIBRARY_PATH"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
./carry/moe-gemm info | tail -3
sha256sum carry/gpu
# NATIVE=0 leaves out the GPU test binary (a call that reruns only the ops or the sanitizers).
if [ "${NATIVE:-1}" = 1 ]; then
  ./carry/gpu --include-ignored --test-threads=1 > "$out/gpu.log" 2>&1; grep -E "test result|FAILED|panicked" "$out/gpu.log"
fi
# OPS=0 leaves out the PyTorch op, the candle op and the examples (a call that must hold the sanitizers).
ops=${OPS:-1}
# The PyTorch op (CARRY_TORCH=1 scripts/carry.sh): its tests against a torch reference, with the host's PyTorch.
if [ "$ops" = 1 ] && [ -d carry/torch ]; then
  PYTHONPATH=carry/torch python3 carry/torch/test_op.py > "$out/torch.log" 2>&1; tail -1 "$out/torch.log"
fi
# The candle op against candle's own FusedMoe (`CARRY_CANDLE=1 scripts/carry.sh`): it links libcublas and
# libcurand, which PyTorch's nvidia wheels provide (their folders are on LD_LIBRARY_PATH above).
if [ "$ops" = 1 ] && [ -f carry/candle_moe.xz ]; then
  curand=$(python3 -c "import os,glob,nvidia; print(':'.join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(d+'/**/libcurand.so*', recursive=True)})))" 2>/dev/null)
  xz -dc carry/candle_moe.xz > "$out/candle_moe" && chmod +x "$out/candle_moe"
  # The timing test (minutes) only with CANDLE_TIMING=1: its CSV goes to $out/candle-vs-fusedmoe.csv.
  skip=(--skip timing); [ "${CANDLE_TIMING:-0}" = 1 ] && skip=()
  LD_LIBRARY_PATH="$curand:$LD_LIBRARY_PATH" CANDLE_BENCH_CSV="$out/candle-vs-fusedmoe.csv" \
    "$out/candle_moe" --include-ignored --test-threads=1 --nocapture "${skip[@]}" > "$out/candle.log" 2>&1
  grep -E "test result|FAILED|panicked" "$out/candle.log"; rm -f "$out/candle_moe"
fi
if [ "$ops" = 1 ]; then
  mkdir -p "$out/bin" && tar xJf carry/examples.tar.xz -C "$out/bin"
  for ex in "$out"/bin/examples/*; do echo "== $(basename "$ex")"; "$ex"; echo "rc=$?"; done 2>&1 | tee "$out/examples.log"
  rm -rf "$out/bin"
fi
# BENCHES=0 leaves out the two short benches (expert-parallel layer, FP8 against its scaled-GEMM peer).
if [ "${BENCHES:-1}" = 1 ]; then
  ./carry/moe-gemm bench --layer --layer-tokens 1,64,4096 --models deepseek-v3 --ep 8 --peer none > "$out/ep.log" 2>&1
  grep -E "ceilings|Grouped\*|Batched\*|error" "$out/ep.log" | head -8
  ./carry/moe-gemm bench --models deepseek-v3 --tokens 64,4096 --gemm w13 --fp8-peer --no-routing > "$out/fp8peer.log" 2>&1
  grep -E "ceilings|fp8|scaled" "$out/fp8peer.log" | head -8
  # The per-channel FP8 layer beside the bf16 one (issue 35's second format), decode and prefill points.
  ./carry/moe-gemm bench --layer --dtype fp8-channel --backends grouped,auto --models mixtral-8x7b,qwen3-30b-a3b \
    --layer-tokens 1,8,64,4096 --peer none --csv "$out/fp8-channel.csv" > "$out/fp8-channel.log" 2>&1
  grep -E "ceilings|fp8-channel|error" "$out/fp8-channel.log" | head -12
fi
# SANITIZE=<seconds>: every GPU test under compute-sanitizer's four tools too, within that many seconds
# (scripts/sanitize.py; its last lines are one summary per tool; the logs go to $out/sanitize).
if [ -n "${SANITIZE:-}" ]; then
  # The long pairs first, by the times of the committed earlier runs, so that the deadline finds none unstarted.
  earlier=(); for f in benches/results/*/sanitize*.txt benches/results/*/racecheck*.txt benches/results/*/memcheck*.txt; do
    [ -f "$f" ] && earlier+=(--longest-first "$f"); done
  python3 scripts/sanitize.py --binary carry/gpu -j 15 --timeout 330 --deadline "$SANITIZE" "${earlier[@]}" \
    --logs "$out/sanitize" > "$out/sanitize.txt" 2>&1
  echo "sanitize.py rc=$?"; grep -v ": ok$" "$out/sanitize.txt" | tail -30
  tar czf "$out/sanitize-logs.tgz" -C "$out" sanitize && rm -rf "$out/sanitize"
fi
