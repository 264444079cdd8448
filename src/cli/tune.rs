//! `moe-gemm tune`: measures every backend of the layer on this GPU for one model, the Fused backend once per
//! tile of `--fused-tiles`, under uniform, balanced and zipf-skewed routing, and writes per token bucket the
//! backend (and Fused tile) whose worst ratio to the fastest is the least, with the best Fused tile beside it,
//! as a tuned file (`E=..,N=..,device_name=..,dtype=bf16.json`), which `TunedBackends::read` and
//! `MoeLayerOptions::tuned` give back to `Auto`. With `--dtype fp8` the same run also times the layer over
//! block-FP8 experts on its backends and writes its table too (`dtype=fp8_w8a8,block_shape=[128, 128]`). It is `bench --layer --write-configs` over the buckets asked
//! for, with every backend that can serve a batch (Eager synchronises: not one) and no PyTorch peer, so the
//! tuner and the benchmark measure the same way.

use std::path::PathBuf;

use clap::{Args, Parser};
use moe_gemm::{Error, Result};

use super::args::{BenchArgs, MODELS};

#[derive(Args, Clone, Debug)]
pub struct TuneArgs {
    /// The model whose MoE layer to tune (a suite model: mixtral-8x7b, qwen3-30b-a3b, qwen3-235b-a22b,
    /// deepseek-v3, gpt-oss-120b).
    #[arg(long)]
    pub model: String,
    /// Token buckets (comma-separated); default the suite's 1, 2, 4, ..., 16384.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192,16384")]
    pub tokens: Vec<usize>,
    /// Folder the tuned file is written into.
    #[arg(long, default_value = "configs")]
    pub out: PathBuf,
    /// Routings measured per bucket (comma-separated: uniform, balanced, zipf); each bucket takes the backend
    /// with the least worst ratio to the fastest over them.
    #[arg(long, value_delimiter = ',', default_value = "uniform,balanced,zipf")]
    pub routing: Vec<String>,
    /// Timed repetitions per point.
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// The Fused tiles measured per bucket (comma-separated; decode-32 is left out by default: with each tile
    /// forced on the H200 it led the others by at most 0.8%, benches/results/h200-2026-12-02-swapab-merged/tiles.txt).
    #[arg(long, value_delimiter = ',', default_value = "decode-16,decode-merged,64x128x64,128x256x64")]
    pub fused_tiles: Vec<String>,
    /// `bf16`: the 16-bit layer's table; `fp8`: the block-FP8 layer's too, from the same run.
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// With `--dtype fp8`: time the bf16 layer only as the FP8 rows' reference (its Auto) and write the FP8 table
    /// alone, leaving the bf16 tables as they are (6 of the 13 timed rows per point).
    #[arg(long)]
    pub fp8_only: bool,
    /// Where `--out` already holds the table, replace only the buckets of `--tokens` and keep its others
    /// (re-tuning the decode buckets of a shipped table, say); without it the table is written anew.
    #[arg(long)]
    pub merge: bool,
}

/// The bench arguments `tune` runs with, parsed by the bench's own parser so both share every default.
#[derive(Parser, Debug)]
struct AsBench {
    #[command(flatten)]
    bench: BenchArgs,
}

pub fn bench_args(t: &TuneArgs) -> Result<BenchArgs> {
    if !MODELS.iter().any(|m| m.name == t.model) {
        let names: Vec<&str> = MODELS.iter().map(|m| m.name).collect();
        return Err(Error::InvalidProblem(format!("--model {}: not a suite model ({})", t.model, names.join(", "))));
    }
    if t.tokens.is_empty() || t.tokens.contains(&0) {
        return Err(Error::InvalidProblem(format!(
            "--tokens {:?}: token buckets are batch sizes of at least 1",
            t.tokens
        )));
    }
    if !matches!(t.dtype.as_str(), "bf16" | "fp8") {
        return Err(Error::InvalidProblem(format!(
            "--dtype {}: tables are tuned for bf16 and block-FP8 (fp8) layers",
            t.dtype
        )));
    }
    if t.fp8_only && t.dtype != "fp8" {
        return Err(Error::InvalidProblem(format!(
            "--fp8-only with --dtype {}: it writes the block-FP8 table alone; give --dtype fp8",
            t.dtype
        )));
    }
    let tokens = t.tokens.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
    let mut argv = vec![
        "tune".to_string(),
        "--layer".into(),
        "--models".into(),
        t.model.clone(),
        "--layer-tokens".into(),
        tokens,
        "--backends".into(),
        "batched,grouped,contiguous,masked,fused".into(),
        "--routing".into(),
        t.routing.join(","),
        "--peer".into(),
        "none".into(),
        "--reps".into(),
        t.reps.to_string(),
        "--write-configs".into(),
        t.out.to_string_lossy().into_owned(),
        "--fused-tile".into(),
        t.fused_tiles.join(","),
        "--dtype".into(),
        t.dtype.clone(),
    ];
    if t.fp8_only {
        argv.push("--quant-only".into());
    }
    if t.merge {
        argv.push("--merge-configs".into());
    }
    AsBench::try_parse_from(argv).map(|a| a.bench).map_err(|e| Error::InvalidProblem(format!("tune: {e}")))
}

pub fn run(t: &TuneArgs) -> Result<()> {
    super::bench::run(bench_args(t)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tune_runs_the_layer_bench_over_every_serving_backend_and_writes_the_file() {
        let t = TuneArgs {
            model: "deepseek-v3".into(),
            tokens: vec![1, 64],
            out: "out/tuned".into(),
            reps: 7,
            routing: vec!["uniform".into(), "zipf".into()],
            fused_tiles: vec!["decode-16".into(), "64x128x64".into()],
            dtype: "fp8".into(),
            fp8_only: false,
            merge: false,
        };
        let b = bench_args(&t).unwrap();
        assert!(b.layer && !b.suite && !b.quant_only);
        assert_eq!((b.models, b.layer_tokens, b.reps), (vec!["deepseek-v3".to_string()], vec![1, 64], 7));
        assert_eq!(b.backends, ["batched", "grouped", "contiguous", "masked", "fused"]);
        assert_eq!((b.peer.as_str(), b.write_configs), ("none", Some(PathBuf::from("out/tuned"))));
        assert_eq!(b.routing, ["uniform", "zipf"]);
        assert_eq!(b.fused_tile, ["decode-16", "64x128x64"]);
        assert!(matches!(b.dtype, super::super::args::BenchDtype::Fp8));
        assert!(!b.merge_configs);
        let fp8_only = TuneArgs { fp8_only: true, merge: true, ..t.clone() };
        let b = bench_args(&fp8_only).unwrap();
        assert!(b.quant_only && b.merge_configs && matches!(b.dtype, super::super::args::BenchDtype::Fp8));
        assert_eq!(b.backends, ["batched", "grouped", "contiguous", "masked", "fused"]);
        let bf16_only = TuneArgs { fp8_only: true, dtype: "bf16".into(), ..t.clone() };
        assert!(bench_args(&bf16_only).unwrap_err().to_string().contains("--fp8-only with --dtype bf16"));
        let mxfp4 = TuneArgs { dtype: "mxfp4".into(), ..t };
        assert!(bench_args(&mxfp4).unwrap_err().to_string().contains("--dtype mxfp4"));
    }
}
