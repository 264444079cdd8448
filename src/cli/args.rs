//! What the benchmark commands share: `moe-gemm bench`'s arguments ([`BenchArgs`], which `tune` builds too), the
//! suite's model shapes ([`MODELS`]) and writing a result file. Every command's module builds on this one, and it
//! on none of them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use cudarc::driver::{CudaSlice, CudaStream};
use moe_gemm::{Error, Result};

/// The element type of GEMM mode.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchDtype {
    /// The bf16 grouped GEMM on the suite models' shapes.
    Bf16,
    /// The FP8 blockwise grouped GEMM on DeepGEMM's shapes (see `fp8_bench.rs`); `--models`, `--tokens` and
    /// `--gemm` do not apply, `--config` takes FP8 configuration names, and the peer measures
    /// torch._scaled_grouped_mm too. With `--layer`: the layer over block-FP8 experts next to the bf16 layer, in
    /// one run (see `layer_bench.rs`).
    Fp8,
    /// With `--layer` only: the layer over MXFP4 experts (e2m1 + UE8M0 per 32, gpt-oss's format; MXFP8
    /// activations, the block-scaled grouped GEMM of the GPU's arch) next to the bf16 layer, in one run.
    Mxfp4,
    /// With `--layer` only: the layer over per-channel FP8 experts (e4m3 with one f32 scale per output row,
    /// llm-compressor's FP8-dynamic and Llama-4-style rowwise checkpoints; activations per token at run time, the
    /// rowwise grouped GEMM) next to the bf16 layer, in one run.
    Fp8Channel,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// GEMM mode's element type: bf16 (the suite models' shapes) or fp8 (the FP8 blockwise grouped GEMM on
    /// DeepGEMM's shapes: contiguous 4x8192, 8x4096 and masked 1x1024, 2x512, 4x256 rows at N x K = 4096 x 7168
    /// and 7168 x 2048). With --layer, fp8 times the layer over block-FP8 experts (e4m3, 128 x 128 f32 scales)
    /// at every point on the FP8 backends of --backends (grouped, contiguous, masked, auto), next to the bf16
    /// layer timed in the same run: each FP8 row has its floor (e4m3 + scale bytes / read bandwidth, FLOPs /
    /// dense fp8 rate) and its ratio to the bf16 layer's Auto at the same point; models whose H or I is not a
    /// multiple of 128 (gpt-oss) are reported as skipped. With --layer, mxfp4 and fp8-channel time the layer over
    /// MXFP4 or per-channel FP8 experts the same way.
    #[arg(long, value_enum, default_value_t = BenchDtype::Bf16)]
    pub dtype: BenchDtype,
    /// Time the whole MoE layer per backend instead of the single grouped GEMM.
    #[arg(long)]
    pub layer: bool,
    /// Token counts of --layer (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,256,1024,4096,16384")]
    pub layer_tokens: Vec<usize>,
    /// --layer: the whole suite: T = 1, 2, 4, ..., 256 (decode) and 512 ... 16384 (prefill), routings uniform,
    /// balanced and zipf (overrides --layer-tokens and --routing).
    #[arg(long)]
    pub suite: bool,
    /// --layer routings (comma-separated): uniform (seeded), balanced (every expert T·k/E rows), zipf (expert
    /// popularity ∝ 1/rank^1.2, a skewed batch).
    #[arg(long, value_delimiter = ',', default_value = "uniform")]
    pub routing: Vec<String>,
    /// --layer: a tensor-parallel slice: each GPU holds I / tp of every expert.
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// --layer: an expert-parallel slice: each GPU holds E / ep experts (every ep-th) and routing ranges over
    /// all E; the floor counts this GPU's experts and rows. The PyTorch peer has no expert map and is skipped.
    #[arg(long, default_value_t = 1)]
    pub ep: usize,
    /// --layer --ep W: time the NCCL expert-parallel step (`ExpertParallel`: dispatch, local experts, combine)
    /// over W GPUs of this host, next to the all-reduce EP of the expert-map slice (see `ep_bench.rs`).
    #[arg(long)]
    pub nccl: bool,
    /// --layer: also benchmark the shapes and token counts of these vLLM tuned fused-MoE config files
    /// (`E=..,N=..,device_name=...json`; H and k from the model suite when E and N match one, else --hidden/--top-k).
    #[arg(long)]
    pub vllm_config: Vec<PathBuf>,
    /// Hidden size for --vllm-config files that match no suite model.
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Top-k for --vllm-config files that match no suite model.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// --layer: write this crate's choices (backend, tile, schedule, cluster per token bucket, with the measured
    /// median) as vLLM-format config files into this folder.
    #[arg(long)]
    pub write_configs: Option<PathBuf>,
    /// --write-configs: where the folder already holds a table of that name, the buckets this run measured
    /// replace its own and its other buckets are kept (re-tuning some buckets of a shipped table).
    #[arg(long)]
    pub merge_configs: bool,
    /// --layer: Auto of the bf16 layer from the tuned files in this folder (`moe-gemm tune` or
    /// --write-configs wrote them on this GPU; a model without one keeps the cost model).
    #[arg(long)]
    pub tuned: Option<PathBuf>,
    /// Backends of --layer: eager, batched, grouped, contiguous, masked, fused, auto.
    #[arg(long, value_delimiter = ',', default_value = "batched,grouped,contiguous,masked,fused")]
    pub backends: Vec<String>,
    /// The Fused backend's tile for every point instead of its per-batch choice (decode-16, decode-32,
    /// decode-merged, 64x128x64, 128x256x64); several (comma-separated): Fused timed once per tile, and with
    /// `--write-configs` each bucket names the tile measured best.
    #[arg(long, value_delimiter = ',')]
    pub fused_tile: Vec<String>,
    /// Models to run (comma-separated): mixtral-8x7b, qwen3-30b-a3b, deepseek-v3, gpt-oss-120b.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "mixtral-8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3,gpt-oss-120b"
    )]
    pub models: Vec<String>,
    /// Token counts (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,8,64,512,4096")]
    pub tokens: Vec<usize>,
    /// Which GEMM: w13 (gate|up), w2 (down), or both.
    #[arg(long, default_value = "both")]
    pub gemm: String,
    /// Tile config: auto (the plan's heuristic), all (every compiled config), or a name from `moe-gemm info`.
    #[arg(long, default_value = "auto")]
    pub config: String,
    /// Timed repetitions per point.
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// Untimed launches before timing.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Do not flush L2 between repetitions.
    #[arg(long)]
    pub no_flush: bool,
    /// --layer with a quantised --dtype: time the bf16 layer only as the quantised rows' reference (its Auto, one
    /// row per point), not on every backend of --backends; --write-configs then writes the quantised table alone.
    #[arg(long)]
    pub quant_only: bool,
    /// --layer: also time one streaming-read kernel over each point's active weight bytes (bf16's and the
    /// quantised experts'), captured and replayed as the layer is: a measured lower bound per point (`read µs`,
    /// `x read`). Takes as much device memory again as the bf16 experts of the largest model.
    #[arg(long)]
    pub read_floor: bool,
    /// Also run the balanced-routing points (every expert gets exactly T·k/E rows).
    #[arg(long)]
    pub balanced: bool,
    /// Python interpreter for the PyTorch peer; "none" skips it.
    #[arg(long, default_value = "python3")]
    pub peer: String,
    /// Peer script (defaults to benches/peers/grouped_mm_peer.py under the working directory or the crate).
    #[arg(long)]
    pub peer_script: Option<PathBuf>,
    /// GEMM mode: the PyTorch peer also measures the dense fp8 rate (torch._scaled_mm, cuBLASLt) and
    /// torch._scaled_grouped_mm on e4m3 copies of each point: the ceiling and peer of the crate's FP8 path.
    #[arg(long)]
    pub fp8_peer: bool,
    /// Skip the route + layout timing (DeepSeek-V3 routing, T = 1, 64, 4096).
    #[arg(long)]
    pub no_routing: bool,
    /// --layer: write an SVG plot per model here (time against T: this crate's Auto and best backend, the
    /// PyTorch peer, the floor).
    #[arg(long)]
    pub plots: Option<PathBuf>,
    /// Write every point as CSV here.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Skip measuring the device's ceilings (read bandwidth, cuBLAS bf16 rate) at the start.
    #[arg(long)]
    pub no_ceilings: bool,
    /// Write every point as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Bytes written before each timed rep to flush L2.
const FLUSH_BYTES: usize = 512 << 20;

impl BenchArgs {
    /// How the reps meet L2, for a bench's header.
    pub fn l2(&self) -> &'static str {
        if self.no_flush {
            "not flushed"
        } else {
            "flushed before each rep"
        }
    }
    /// The buffer written before each rep to flush L2 on `stream` (`None` with `--no-flush`).
    pub fn flush_buffer(&self, stream: &Arc<CudaStream>) -> Result<Option<CudaSlice<u8>>> {
        Ok(if self.no_flush { None } else { Some(stream.alloc_zeros::<u8>(FLUSH_BYTES)?) })
    }
    /// The bytes of [`Self::flush_buffer`] (0 with `--no-flush`), for a results file.
    pub fn flush_bytes(&self) -> usize {
        if self.no_flush {
            0
        } else {
            FLUSH_BYTES
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Model {
    pub name: &'static str,
    pub experts: usize,
    pub top_k: usize,
    pub hidden: usize,
    pub inter: usize,
    /// MoE layers of the model (DeepSeek-V3: 61 layers, the first 3 dense).
    pub layers: usize,
    /// The shared expert's intermediate size `I_s` (0: none). Counted by `moe-gemm plan` (as `I_s / inter` more
    /// groups); the benchmarks time the routed experts only, so their numbers stay comparable.
    pub shared_inter: usize,
}

pub const MODELS: &[Model] = &[
    Model { name: "mixtral-8x7b", experts: 8, top_k: 2, hidden: 4096, inter: 14336, layers: 32, shared_inter: 0 },
    Model { name: "qwen3-30b-a3b", experts: 128, top_k: 8, hidden: 2048, inter: 768, layers: 48, shared_inter: 0 },
    Model { name: "qwen3-235b-a22b", experts: 128, top_k: 8, hidden: 4096, inter: 1536, layers: 94, shared_inter: 0 },
    Model { name: "deepseek-v3", experts: 256, top_k: 8, hidden: 7168, inter: 2048, layers: 58, shared_inter: 2048 },
    Model { name: "gpt-oss-120b", experts: 128, top_k: 4, hidden: 2880, inter: 2880, layers: 36, shared_inter: 0 },
];

/// Writes `text` to `path` and says so.
pub fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| Error::InvalidProblem(format!("cannot write {}: {e}", path.display())))?;
    println!("wrote {}", path.display());
    Ok(())
}
