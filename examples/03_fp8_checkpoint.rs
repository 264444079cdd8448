//! A block-FP8 checkpoint from disk to the GPU layer: experts quantised per 128 x 128 block and written as a
//! DeepSeek-V3 checkpoint names them (`…experts.{e}.{gate,up,down}_proj.weight` in F8_E4M3 with their F32
//! `weight_scale_inv`) beside its `config.json`'s `quantization_config`, read back, uploaded, run by the layer and
//! checked against the FP8 CPU reference. Exits non-zero on a mismatch.
//!
//! `cargo run --release --example 03_fp8_checkpoint` (needs an SM90 GPU; says so otherwise).

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;

use half::bf16;
use moe_gemm::checkpoint::{ExpertNaming, Fp8Config, PackedFp8Experts};
use moe_gemm::random::{random_vec, topk_ids, SplitMix64};
use moe_gemm::reference::{fp8_layer_mismatch, moe_forward_fp8, Fp8HostLayer};
use moe_gemm::*;
use safetensors::tensor::{Dtype, TensorView};

const PREFIX: &str = "model.layers.3.mlp";
const CONFIG_JSON: &str = r#"{"model_type": "deepseek_v3", "quantization_config": {"quant_method": "fp8",
    "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}}"#;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("03_fp8_checkpoint: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes `p`'s experts as a DeepSeek-V3 checkpoint names them.
fn write_checkpoint(p: &PackedFp8Experts, path: &std::path::Path) -> Result<()> {
    let i = p.inter();
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let bytes = |m: &moe_gemm::quant::BlockFp8| -> (Vec<u8>, Vec<u8>) {
        let q = m.q().iter().map(|v| v.to_bits()).collect();
        let s = (0..m.scales().len()).flat_map(|j| m.scales().get(j).unwrap_or(0.0).to_le_bytes()).collect();
        (q, s)
    };
    for x in 0..p.experts() {
        let (w13, w2) = p.expert(x)?;
        let [g, u, d] = ExpertNaming::GateUpDown.names(PREFIX, x);
        for (name, m) in [(g, w13.slice_rows(0, i)?), (u, w13.slice_rows(i, 2 * i)?), (d, w2)] {
            let (q, s) = bytes(&m);
            let grid = m.block().grid(m.rows(), m.cols())?;
            tensors.push((format!("{name}_scale_inv"), Dtype::F32, vec![grid.0, grid.1], s));
            tensors.push((name, Dtype::F8_E4M3, vec![m.rows(), m.cols()], q));
        }
    }
    let views: HashMap<String, TensorView<'_>> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).expect("consistent tensor")))
        .collect();
    safetensors::serialize_to_file(views, None, path)
        .map_err(|e| Error::InvalidProblem(format!("writing {}: {e}", path.display())))
}

fn run() -> Result<bool> {
    // The checkpoint side needs no GPU: quantise, write, read back.
    let (e, k, h, i, tokens) = (16usize, 4usize, 512usize, 256usize, 24usize);
    let bf16_experts = PackedExperts::new(
        e,
        h,
        i,
        ExpertFormat::SWIGLU,
        random_vec::<bf16>(e * 2 * i * h, 1, 0.05),
        random_vec::<bf16>(e * h * i, 2, 0.05),
        None,
        None,
    )?;
    let config = Fp8Config::from_config_json(CONFIG_JSON)?.expect("the config declares FP8");
    let path = std::env::temp_dir().join(format!("moe-gemm-example-03-{}.safetensors", std::process::id()));
    let quantised = PackedFp8Experts::quantize(&bf16_experts, &config)?;
    write_checkpoint(&quantised, &path)?;
    let checkpoint = Checkpoint::open(&path)?;
    let experts = checkpoint.pack_fp8_experts(PREFIX, e, ExpertNaming::GateUpDown, &config)?;
    std::fs::remove_file(&path).ok();
    if experts != quantised {
        eprintln!("03_fp8_checkpoint: the experts read back differ from those written");
        return Ok(false);
    }
    println!(
        "read {e} block-FP8 experts ({} e4m3 weights) from {}",
        experts.w13().len() + experts.w2().len(),
        path.display()
    );

    if !device::driver_present() {
        println!("no CUDA device: the layer needs an SM90 GPU");
        return Ok(true);
    }
    let ctx = device::open(0)?;
    let stream = ctx.new_stream()?;
    let weights = Arc::new(Fp8ExpertWeights::upload(&stream, &experts, ExpertFormat::SWIGLU)?);
    let layer = MoeLayer::new(&stream, weights, MoeLayerOptions::new(tokens, k))?;
    let mut scratch = MoeScratch::for_layers(&stream, [&layer])?;

    let ids_host = topk_ids(tokens, k, e, 3);
    let mut rng = SplitMix64(4);
    let w_host: Vec<f32> = (0..tokens * k).map(|_| 0.1 + rng.unit().abs()).collect();
    let x_host = random_vec::<bf16>(tokens * h, 5, 1.0);
    let (x, ids, w) = (stream.clone_htod(&x_host)?, stream.clone_htod(&ids_host)?, stream.clone_htod(&w_host)?);
    let mut y = stream.alloc_zeros::<bf16>(tokens * h)?;
    let (xv, idv, wv) =
        (MatrixView::of("x", &x, h)?, MatrixView::of("topk_ids", &ids, k)?, MatrixView::of("topk_weights", &w, k)?);
    layer.forward(&stream, &mut scratch, &xv, &idv, &wv, &mut MatrixViewMut::of("y", &mut y, h)?)?;
    scratch.check(&stream)?;

    let got = stream.clone_dtoh(&y)?;
    let want = moe_forward_fp8(&Fp8HostLayer::new(&experts, Activation::SiluGated), &x_host, &ids_host, &w_host, k);
    println!("{tokens} tokens through {:?}", layer.backend_for(tokens));
    if let Some(m) = fp8_layer_mismatch(&got, &want, h) {
        eprintln!("03_fp8_checkpoint: {m}");
        return Ok(false);
    }
    println!("every token within the FP8 layer's bound of the CPU reference");
    Ok(true)
}
