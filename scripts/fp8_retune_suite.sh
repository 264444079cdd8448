#!/usr/bin/env bash
# On the GPU host, in one call: re-tune the block-FP8 tables' buckets (`tune --dtype fp8 --fp8-only --merge` into a
# copy of configs/<gpu>/), then run issue 35's decode suite beside vLLM's block-FP8 `fused_experts` with those
# tables and read floors, and print its targets. Run from the checkout with the vLLM run folder that
# ../shared/peers/vllm/make_vllmrun.sh builds (RUN, default devrun/vllmrun; copy summarize.py there too).
#   OUT=/tmp/r TOKENS="1,2,4,8,16,32,64,128,256 512,1024,2048,4096,8192,16384" scripts/fp8_retune_suite.sh
# Env: GPU (configs folder: h100, h200; default: the one named like the GPU), TOKENS (buckets to tune; empty:
# none; several comma lists separated by spaces are tuned one after the other, every model's, so a call cut short
# keeps the lists it finished), MODELS, SUITE_MODELS, SUITE_BUDGET (seconds: the suite starts only before then),
# GPU_TESTS (an xz-compressed GPU test binary to run first, --include-ignored). Every stage's start is logged in
# $OUT/timeline.txt.
set -u
ROOT=$PWD R=$OUT T0=$(date +%s)
RUN=$(realpath "${RUN:-devrun/vllmrun}")
[ -n "${GPU_TESTS:-}" ] && GPU_TESTS=$(realpath "$GPU_TESTS")
el() { echo "[$(($(date +%s) - T0)) s] $*" | tee -a "$R/timeline.txt"; }
LIBS=$(python3 -c "import nvidia,glob;print(':'.join(sorted(d for p in nvidia.__path__ for d in glob.glob(p+'/*/lib'))))")
export LD_LIBRARY_PATH=$LIBS:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv | tee "$R/gpu.txt"
if [ -z "${GPU:-}" ]; then  # the configs folder of the GPU that came
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
    *H200*) GPU=h200 ;;
    *H100*) GPU=h100 ;;
    *) el "no configs folder for this GPU: set GPU"; exit 1 ;;
  esac
fi
cd "$RUN" && chmod +x moe-gemm && sha256sum moe-gemm > "$R/sha256.txt"
if [ -n "${GPU_TESTS:-}" ]; then
  el "gpu tests"
  xz -dc "$GPU_TESTS" > "$RUN/gpu" && chmod +x "$RUN/gpu" && sha256sum "$RUN/gpu" >> "$R/sha256.txt"
  (cd "$ROOT" && "$RUN/gpu" --include-ignored --test-threads=1) > "$R/gpu-tests.log" 2>&1
  echo "rc=$?" >> "$R/gpu-tests.log"; tail -3 "$R/gpu-tests.log"
fi
MODELS=${MODELS:-"qwen3-30b-a3b mixtral-8x7b qwen3-235b-a22b deepseek-v3"}
SUITE_MODELS=${SUITE_MODELS:-$MODELS}
mkdir -p "$R/tables" && cp "$ROOT/configs/$GPU"/* "$R/tables/"
for tokens in ${TOKENS:-}; do
  for m in $MODELS; do
    el "tune $m $tokens"
    echo "### moe-gemm tune --dtype fp8 --fp8-only --merge --model $m --tokens $tokens --reps 10" >> "$R/tune-$m.log"
    ./moe-gemm tune --dtype fp8 --fp8-only --merge --model "$m" --tokens "$tokens" --reps 10 --out "$R/tables" \
      >> "$R/tune-$m.log" 2>&1 || el "tune $m $tokens: rc $?"
  done
done
[ $(($(date +%s) - T0)) -lt "${SUITE_BUDGET:-600}" ] || { el "no time left for the suite"; exit 0; }
mkdir -p "$R/suite"
for m in $SUITE_MODELS; do
  for r in uniform zipf; do
    el "suite $m $r"
    VLLM_PEER_FP8=1 VLLM_PEER_FP8_VARIANTS=vllm_fp8_block ./moe-gemm bench --layer --dtype fp8 --backends auto \
      --read-floor --tuned "$R/tables" --models "$m" --layer-tokens 1,2,4,8,16,32,64,128,256 --routing $r \
      --json "$R/suite/$m-$r.json" --csv "$R/suite/$m-$r.csv" > "$R/suite/$m-$r.log" 2>&1 || el "suite $m $r: rc $?"
  done
done
# The per-run CSV files under one header.
first=1
for f in "$R"/suite/*.csv; do
  if [ $first = 1 ]; then cat "$f"; first=0; else tail -n +2 "$f"; fi
done > "$R/fp8-layer.csv"
python3 "$ROOT/scripts/fp8_targets.py" "$R/fp8-layer.csv" > "$R/targets.txt" 2>&1; tail -30 "$R/targets.txt"
[ -f summarize.py ] && python3 summarize.py "$R"/suite/*.json > "$R/summary.txt" 2>&1
el "done"
