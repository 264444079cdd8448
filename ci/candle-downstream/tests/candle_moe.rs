//! moe-gemm's candle operation against candle's own fused MoE (`candle_transformers::fused_moe::FusedMoe`, on
//! candle-nn's `moe_gemm` kernels), built from the same random weights through a `VarBuilder`: the same routing
//! (candle's softmax, top-k and renormalisation, computed once and given to both), outputs compared token by
//! token, at a decode and a prefill batch; candle-transformers' Mixtral, Qwen2-MoE, Qwen3-MoE (bf16 and over
//! block-FP8 experts) and DeepSeek-V2 blocks through their public `Model`s; the op captured in a CUDA graph. On
//! the GPU host: `carry/candle_moe --include-ignored`.

use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::{Activation, VarBuilder, VarMap};
use candle_transformers::fused_moe::{FusedMoe, MoeCfg};
use moe_gemm::candle::CandleMoe;
use moe_gemm::MoeLayerOptions;

fn weight(vars: &VarMap, name: &str) -> Tensor {
    vars.data().lock().unwrap().get(name).unwrap_or_else(|| panic!("no {name}")).as_tensor().clone()
}

/// candle's `FusedMoe` with random weights through a `VarBuilder`, the same tensors packed as it packs them
/// (`w13 = [gate; up]` per expert, `w2 = down`), and its gate.
fn fused_moe(device: &Device, e: usize, k: usize, h: usize, i: usize) -> (FusedMoe, Tensor, Tensor, candle_nn::Linear) {
    let vars = VarMap::new();
    let vb = VarBuilder::from_varmap(&vars, DType::BF16, device);
    let cfg = MoeCfg {
        hidden_size: h,
        num_experts: e,
        num_experts_per_tok: k,
        moe_intermediate_size: i,
        norm_topk_prob: true,
        act: Activation::Silu,
        decoder_sparse_step: None,
    };
    let fused = FusedMoe::new(&cfg, vb, DType::BF16).unwrap();
    // Written in place expert by expert, with no stacked temporaries: at DeepSeek-V3's shapes each copy of the
    // experts is 22.5 GB, and the VarMap's, FusedMoe's, these and the op's must fit one GPU.
    let (w13, w2) = (
        Tensor::zeros((e * 2 * i, h), DType::BF16, device).unwrap(),
        Tensor::zeros((e * h, i), DType::BF16, device).unwrap(),
    );
    for x in 0..e {
        let get = |p: &str| weight(&vars, &format!("experts.{x}.{p}.weight"));
        w13.slice_set(&get("gate_proj"), 0, x * 2 * i).unwrap();
        w13.slice_set(&get("up_proj"), 0, x * 2 * i + i).unwrap();
        w2.slice_set(&get("down_proj"), 0, x * h).unwrap();
    }
    let (w13, w2) = (w13.reshape((e, 2 * i, h)).unwrap(), w2.reshape((e, h, i)).unwrap());
    (fused, w13, w2, candle_nn::Linear::new(weight(&vars, "gate.weight"), None))
}

/// FusedMoe's routing, step for step: softmax of the gate in f32, top-k by arg-sort, renormalised.
fn candle_routing(router: &candle_nn::Linear, x: &Tensor, k: usize) -> (Tensor, Tensor) {
    let probs = candle_nn::ops::softmax_last_dim(&router.forward(x).unwrap().to_dtype(DType::F32).unwrap()).unwrap();
    let ids = probs.arg_sort_last_dim(false).unwrap().narrow(D::Minus1, 0, k).unwrap().contiguous().unwrap();
    let w = probs.gather(&ids, D::Minus1).unwrap();
    (ids, w.broadcast_div(&w.sum_keepdim(D::Minus1).unwrap()).unwrap().contiguous().unwrap())
}

/// The op over `fp8`'s experts given as candle tensors: e4m3 weights as F8E4M3, their block scales as F32.
fn fp8_op(
    cuda: &candle_core::CudaDevice,
    device: &Device,
    fp8: &moe_gemm::checkpoint::PackedFp8Experts,
    quant: moe_gemm::quant::GroupQuant,
    options: MoeLayerOptions,
) -> CandleMoe<moe_gemm::layer::Fp8ExpertWeights> {
    let (e, h, i) = (fp8.experts(), fp8.hidden(), fp8.inter());
    let ((g13r, g13c), (g2r, g2c)) = fp8.grids();
    let scales = |s: &moe_gemm::quant::Scales| (0..s.len()).map(|j| s.get(j).unwrap()).collect::<Vec<f32>>();
    let w13 = Tensor::from_vec(fp8.w13().to_vec(), (e, 2 * i, h), device).unwrap();
    let s13 = Tensor::from_vec(scales(fp8.w13_scales()), (e, g13r, g13c), device).unwrap();
    let w2 = Tensor::from_vec(fp8.w2().to_vec(), (e, h, i), device).unwrap();
    let s2 = Tensor::from_vec(scales(fp8.w2_scales()), (e, g2r, g2c), device).unwrap();
    CandleMoe::from_fp8_tensors(cuda, (&w13, &s13), (&w2, &s2), quant, options).unwrap()
}

/// A one-layer Qwen3-MoE of E experts, top-k, hidden H, expert width I (renormalised top-k).
fn qwen3_config(e: usize, k: usize, h: usize, i: usize) -> candle_transformers::models::qwen3_moe::Config {
    serde_json::from_str(&format!(
        r#"{{"vocab_size": {h}, "hidden_size": {h}, "intermediate_size": 1024, "num_hidden_layers": 1,
            "num_attention_heads": 8, "head_dim": 64, "attention_bias": false, "num_key_value_heads": 2,
            "max_position_embeddings": 64, "sliding_window": null, "max_window_layers": 1,
            "tie_word_embeddings": false, "rope_theta": 1e6, "rms_norm_eps": 1e-6, "use_sliding_window": false,
            "hidden_act": "silu", "decoder_sparse_step": 1, "moe_intermediate_size": {i},
            "num_experts_per_tok": {k}, "num_experts": {e}, "norm_topk_prob": true}}"#
    ))
    .unwrap()
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn candle_moe_matches_candles_fused_moe() {
    let device = Device::new_cuda(0).unwrap();
    let Device::Cuda(cuda) = &device else { unreachable!() };
    let (e, h, i, k) = (16usize, 512usize, 256usize, 4usize);
    let (fused, w13, w2, router) = fused_moe(&device, e, k, h, i);

    for (tokens, prefill) in [(8usize, false), (96, true)] {
        let op = CandleMoe::from_tensors(cuda, &w13, &w2, MoeLayerOptions::new(tokens, k)).unwrap();
        let x = Tensor::randn(0f32, 1f32, (1, tokens, h), &device).unwrap().to_dtype(DType::BF16).unwrap();
        let want = fused.forward(&x, prefill).unwrap().reshape((tokens, h)).unwrap();
        let x2 = x.reshape((tokens, h)).unwrap();
        let (ids, w) = candle_routing(&router, &x2, k);
        // candle's U32 ids as they come, and as I32: the same output. (candle has no CUDA kernel that casts
        // U32 to I32, so the I32 copy is made on the host.)
        let got = op.forward(&x2, &ids, &w).unwrap();
        let ids_i32 = ids.to_device(&Device::Cpu).unwrap().to_dtype(DType::I32).unwrap().to_device(&device).unwrap();
        let got_i32 = op.forward(&x2, &ids_i32, &w).unwrap();
        let same = got
            .to_dtype(DType::F32)
            .unwrap()
            .sub(&got_i32.to_dtype(DType::F32).unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert_eq!(same, 0.0, "U32 and I32 ids give different outputs");

        let (g, r): (Vec<Vec<f32>>, Vec<Vec<f32>>) = (
            got.to_dtype(DType::F32).unwrap().to_vec2().unwrap(),
            want.to_dtype(DType::F32).unwrap().to_vec2().unwrap(),
        );
        let max = r.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
        // Both compute in bf16 with f32 accumulation but round their intermediates at different points (candle
        // rounds silu(gate) and the product separately): a few bf16 steps of the largest output.
        let bound = 4.0 * max / 256.0;
        for (t, (gr, rr)) in g.iter().zip(&r).enumerate() {
            let worst = gr.iter().zip(rr).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst <= bound, "T = {tokens}, token {t}: |moe-gemm - candle| = {worst} > {bound} (max {max})");
        }
        println!("T = {tokens} (prefill {prefill}): every token within {bound:.4} of candle's FusedMoe (max {max:.3})");
    }
}

/// Block-FP8 experts given as candle F8E4M3 tensors with their F32 block scales: the op equals moe-gemm's FP8 CPU
/// reference within the FP8 layer's bound (the GPU layer tests' `fp8_layer_mismatch`).
#[test]
#[ignore = "needs an SM90 GPU"]
fn candle_moe_over_fp8_tensors_matches_the_fp8_reference() {
    use half::bf16;
    use moe_gemm::checkpoint::{Fp8Config, PackedFp8Experts};
    use moe_gemm::reference::{fp8_layer_mismatch, moe_forward_fp8, Fp8HostLayer};
    use moe_gemm::{Activation, ExpertFormat, PackedExperts};

    let device = Device::new_cuda(0).unwrap();
    let Device::Cuda(cuda) = &device else { unreachable!() };
    let (e, h, i, k, tokens) = (8usize, 512usize, 256usize, 2usize, 24usize);
    // Seeded values in [-scale, scale) (the `cli` feature's generator is not built here).
    let random_vec = |n: usize, seed: u64, scale: f32| -> Vec<bf16> {
        let mut z = seed;
        (0..n)
            .map(|_| {
                z = z.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                bf16::from_f32(((z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale)
            })
            .collect()
    };
    let dense = PackedExperts::new(
        e,
        h,
        i,
        ExpertFormat::SWIGLU,
        random_vec(e * 2 * i * h, 1, 0.05),
        random_vec(e * h * i, 2, 0.05),
        None,
        None,
    )
    .unwrap();
    let config = Fp8Config::DEEPSEEK_V3;
    let fp8 = PackedFp8Experts::quantize(&dense, &config).unwrap();
    let op = fp8_op(cuda, &device, &fp8, config.activation_quant(), MoeLayerOptions::new(tokens, k));
    let x_host = random_vec(tokens * h, 3, 1.0);
    // k distinct experts per token.
    let ids_host: Vec<i32> = (0..tokens * k).map(|n| ((n / k + (n % k) * (e / k)) % e) as i32).collect();
    let w_host: Vec<f32> = (0..tokens * k).map(|n| 0.25 + 0.5 * (n % 2) as f32).collect();
    let x = Tensor::from_vec(x_host.clone(), (tokens, h), &device).unwrap();
    let ids = Tensor::from_vec(ids_host.clone(), (tokens, k), &device).unwrap();
    let w = Tensor::from_vec(w_host.clone(), (tokens, k), &device).unwrap();
    let got: Vec<bf16> = op.forward(&x, &ids, &w).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    let want = moe_forward_fp8(&Fp8HostLayer::new(&fp8, Activation::SiluGated), &x_host, &ids_host, &w_host, k);
    if let Some(m) = fp8_layer_mismatch(&got, &want, h) {
        panic!("candle FP8 op vs the FP8 reference: {m}");
    }
}

/// The op captured in a CUDA graph on candle's stream (the caller's `y`, nothing allocated): each replay, with new
/// routing written into the captured id and weight tensors, is bit-equal to an eager call on the same tensors. A
/// graph that kept the routing of its capture, or read anything the capture had on the host, differs.
#[test]
#[ignore = "needs an SM90 GPU"]
fn candle_moe_replays_in_a_captured_graph_bit_equal_to_eager() {
    use moe_gemm::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let device = Device::new_cuda(0).unwrap();
    let Device::Cuda(cuda) = &device else { unreachable!() };
    let (e, h, i, k, tokens) = (16usize, 512usize, 256usize, 4usize, 24usize);
    let (_fused, w13, w2, router) = fused_moe(&device, e, k, h, i);
    let op = CandleMoe::from_tensors(cuda, &w13, &w2, MoeLayerOptions::new(tokens, k)).unwrap();
    let randn = || Tensor::randn(0f32, 1f32, (tokens, h), &device).unwrap().to_dtype(DType::BF16).unwrap();
    let x = randn();
    let (ids, w) = candle_routing(&router, &x, k);
    let y = Tensor::zeros((tokens, h), DType::BF16, &device).unwrap();
    let bits = |t: &Tensor| -> Vec<u16> {
        t.flatten_all().unwrap().to_vec1::<half::bf16>().unwrap().iter().map(|v| v.to_bits()).collect()
    };
    op.forward_into(&y, &x, &ids, &w).unwrap();
    let first = bits(&y);
    let stream = cuda.cuda_stream();
    stream.synchronize().unwrap();
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    op.forward_into(&y, &x, &ids, &w).unwrap();
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("a captured graph");
    let mut changed = 0;
    for r in 0..10 {
        // Routing of other tokens' logits: new ids and weights, written into the captured tensors.
        let (ids_r, w_r) = candle_routing(&router, &randn(), k);
        ids.slice_set(&ids_r, 0, 0).unwrap();
        w.slice_set(&w_r, 0, 0).unwrap();
        graph.launch().unwrap();
        let replayed = bits(&y);
        let eager = bits(&op.forward(&x, &ids, &w).unwrap());
        assert!(replayed == eager, "replay {r}: the graph's output differs from eager on the same routing");
        changed += usize::from(replayed != first);
    }
    // The routings differ from the first, so the outputs must too: a replay stuck on the captured routing fails.
    assert!(changed > 0, "no replay changed the output: the new routing did not reach the graph");
    println!("10 replays with new routing: bit-equal to eager ({changed} differ from the captured step)");
}

/// A one-layer candle-transformers model reached through its public `Model` (the MoE blocks are private): its
/// attention's output projection zeroed, so that the layer's output is `h + moe(norm(h))` with `h` the embeddings,
/// the final norm's weight ones (and `lm_head`, where the model has one, the identity), fed T tokens as a batch
/// of T one-token sequences. The same layer with the op in the block's place, from the same `VarMap`, must give
/// the same hidden states token by token within a few bf16 steps of the MoE output.
/// The experts' gate, up and down projections of the Qwen and DeepSeek blocks (Mixtral's: `w1`, `w3`, `w2`).
const PROJ: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// How a block weights its top-k experts.
#[derive(Clone, Copy)]
enum Weights {
    Renormalised,
    Scaled(f64),
}

/// A block's shared expert.
#[derive(Clone, Copy, PartialEq)]
enum Shared {
    None,
    /// Qwen2-MoE's: `{moe}.shared_expert.{gate,up,down}_proj`, weighted per token by
    /// `sigmoid(x · {moe}.shared_expert_gate)`.
    Gated,
    /// DeepSeek-V2's: `{moe}.shared_experts.{gate,up,down}_proj` (`n_shared_experts` experts as one MLP), added.
    Plain,
}

struct OneLayer<'a> {
    vars: &'a VarMap,
    /// The MoE block's prefix (`model.layers.0.block_sparse_moe`, `model.layers.0.mlp`).
    moe: String,
    /// The experts' gate, up and down projections under `{moe}.experts.{x}`.
    names: [&'a str; 3],
    /// Renormalise the top-k routing weights (Mixtral, Qwen3-MoE), or scale them by this factor (Qwen2-MoE's
    /// `norm_topk_prob: false`: 1; DeepSeek-V2's `routed_scaling_factor`).
    routing: Weights,
    /// The gate's logits in F32 from the bf16 input (DeepSeek-V2's `MoeGate`), not in the model's dtype.
    gate_f32: bool,
    /// The model's dtype, in which the op's side computes everything but the op (F32 or BF16).
    dtype: DType,
    /// The block's softmax runs in the model's dtype (Qwen2-MoE's block), not in F32 (FusedMoe, Mixtral in F32):
    /// the routing must be the block's bit for bit, or a near tie picks another expert.
    softmax_in_dtype: bool,
    /// The block's shared expert, if it has one.
    shared: Shared,
    /// (E, k, H, I, T).
    dims: (usize, usize, usize, usize, usize),
    /// Block-FP8 experts whose dequantised weights the model holds: the op runs on these, not on the model's bf16
    /// copy, and the bound adds the activations' e4m3 rounding (see [`OneLayer::check`]).
    fp8: Option<&'a moe_gemm::checkpoint::PackedFp8Experts>,
}

impl<'a> OneLayer<'a> {
    /// A block under `moe` with experts' projections `names` (gate, up, down): renormalised top-k, the gate and
    /// softmax as FusedMoe computes them, bf16, no shared expert, bf16 experts; the tests change what differs.
    fn new(vars: &'a VarMap, moe: &str, names: [&'a str; 3], dims: (usize, usize, usize, usize, usize)) -> Self {
        OneLayer {
            vars,
            moe: moe.into(),
            names,
            routing: Weights::Renormalised,
            gate_f32: false,
            dtype: DType::BF16,
            softmax_in_dtype: false,
            shared: Shared::None,
            dims,
            fp8: None,
        }
    }

    /// Zeroes every variable whose name contains `part` (the attention's `o_proj`, its bias too where it has one).
    fn zero(vars: &mut VarMap, part: &str) {
        let names: Vec<String> = vars.data().lock().unwrap().keys().filter(|n| n.contains(part)).cloned().collect();
        assert!(!names.is_empty(), "no variable named *{part}*");
        for n in names {
            let t = weight(vars, &n);
            vars.set_one(&n, t.zeros_like().unwrap()).unwrap();
        }
    }

    /// The token ids fed to the model: T distinct rows of the embedding.
    fn ids(&self, device: &Device) -> Tensor {
        let (_, _, h, _, tokens) = self.dims;
        let ids: Vec<u32> = (0..tokens as u32).map(|t| (t * 37 + 11) % h as u32).collect();
        Tensor::new(ids.as_slice(), device).unwrap()
    }

    /// Checks `got_model` (`[T, H]`, the model's output for [`Self::ids`]) against the op in the block's place.
    fn check(&self, name: &str, cuda: &candle_core::CudaDevice, device: &Device, got_model: &Tensor) {
        let (e, k, h, i, tokens) = self.dims;
        let (moe, [g, u, d]) = (&self.moe, self.names);
        let (w13, w2) = (
            Tensor::zeros((e * 2 * i, h), DType::BF16, device).unwrap(),
            Tensor::zeros((e * h, i), DType::BF16, device).unwrap(),
        );
        for x in 0..e {
            let get =
                |p: &str| weight(self.vars, &format!("{moe}.experts.{x}.{p}.weight")).to_dtype(DType::BF16).unwrap();
            w13.slice_set(&get(g), 0, x * 2 * i).unwrap();
            w13.slice_set(&get(u), 0, x * 2 * i + i).unwrap();
            w2.slice_set(&get(d), 0, x * h).unwrap();
        }
        let (w13, w2) = (w13.reshape((e, 2 * i, h)).unwrap(), w2.reshape((e, h, i)).unwrap());
        let options = MoeLayerOptions::new(tokens, k);
        let shared_name = if self.shared == Shared::Plain { "shared_experts" } else { "shared_expert" };
        let shared =
            |p: &str| weight(self.vars, &format!("{moe}.{shared_name}.{p}.weight")).to_dtype(DType::BF16).unwrap();
        // Over FP8 experts the op runs on them; else on the model's bf16 experts (with its shared expert).
        let op_fp8 = self.fp8.map(|fp8| fp8_op(cuda, device, fp8, fp8.activation_quant(), options));
        let op = op_fp8.is_none().then(|| {
            if self.shared != Shared::None {
                let (sg, su, sd) = (shared("gate_proj"), shared("up_proj"), shared("down_proj"));
                CandleMoe::from_tensors_with_shared(cuda, &w13, &w2, (&sg, &su, &sd), options).unwrap()
            } else {
                CandleMoe::from_tensors(cuda, &w13, &w2, options).unwrap()
            }
        });

        // h = embeddings, y = op(norm(h)) under the block's routing, then the final norm: each step as the model
        // takes it, in its dtype (the op's input and output converted to and from bf16).
        let (layer, dt) = (moe.rsplit_once('.').unwrap().0, self.dtype);
        let hs = weight(self.vars, "model.embed_tokens.weight").index_select(&self.ids(device), 0).unwrap();
        let norm = |x: &Tensor, name: &str| candle_nn::ops::rms_norm(x, &weight(self.vars, name), 1e-6).unwrap();
        let xn = norm(&hs, &format!("{layer}.post_attention_layernorm.weight"));
        let gate = weight(self.vars, &format!("{moe}.gate.weight"));
        let logits = if self.gate_f32 {
            xn.to_dtype(DType::F32).unwrap().matmul(&gate.t().unwrap().to_dtype(DType::F32).unwrap()).unwrap()
        } else {
            candle_nn::Linear::new(gate, None).forward(&xn).unwrap()
        };
        let probs = if self.softmax_in_dtype {
            candle_nn::ops::softmax_last_dim(&logits).unwrap()
        } else {
            candle_nn::ops::softmax_last_dim(&logits.to_dtype(DType::F32).unwrap()).unwrap()
        };
        let tk = probs.arg_sort_last_dim(false).unwrap().narrow(D::Minus1, 0, k).unwrap().contiguous().unwrap();
        let tw = probs.gather(&tk, D::Minus1).unwrap().to_dtype(DType::F32).unwrap();
        let tw = match self.routing {
            Weights::Renormalised => tw.broadcast_div(&tw.sum_keepdim(D::Minus1).unwrap()).unwrap(),
            Weights::Scaled(f) => (tw * f).unwrap(),
        };
        let (x_op, tw) = (xn.to_dtype(DType::BF16).unwrap(), tw.contiguous().unwrap());
        let y = match (&op_fp8, &op, self.shared) {
            (Some(op), _, _) => op.forward(&x_op, &tk, &tw).unwrap(),
            (None, Some(op), Shared::Plain) => {
                let ones = Tensor::ones((tokens, 1), DType::F32, device).unwrap();
                op.forward_with_shared(&x_op, &tk, &tw, &ones).unwrap()
            }
            (None, Some(op), Shared::Gated) => {
                // The block's gate: sigmoid(x · shared_expert_gate) in the model's dtype, given to the op in F32.
                let sg = candle_nn::Linear::new(weight(self.vars, &format!("{moe}.shared_expert_gate.weight")), None);
                let sw = candle_nn::ops::sigmoid(&sg.forward(&xn).unwrap()).unwrap().to_dtype(DType::F32).unwrap();
                op.forward_with_shared(&x_op, &tk, &tw, &sw.contiguous().unwrap()).unwrap()
            }
            (None, Some(op), Shared::None) => op.forward(&x_op, &tk, &tw).unwrap(),
            (None, None, _) => unreachable!("the bf16 op is built when there are no FP8 experts"),
        };
        let y = y.to_dtype(dt).unwrap();
        let pre = (&hs + &y).unwrap();
        let got_op = norm(&pre, "model.norm.weight");

        let f = |t: &Tensor| -> Vec<Vec<f32>> { t.to_dtype(DType::F32).unwrap().to_vec2().unwrap() };
        let (m, o, ys, pre) = (f(got_model), f(&got_op), f(&y), f(&pre));
        // Over FP8 experts the op also rounds x and h to e4m3 where the block keeps bf16: the crate's FP8-vs-dense
        // bound on the dequantised weights, |Δy| ≤ max|y_dense| / 8 (`reference::fp8_vs_dense_tolerance`, derived
        // and checked on the CPU there); the op's max|y| is within that of the block's, so max|y_op| / 7 covers it.
        let fp8_atol = match self.fp8 {
            Some(_) => ys.iter().flatten().fold(0f32, |a, v| a.max(v.abs())) / 7.0,
            None => 0.0,
        };
        for t in 0..tokens {
            // The op's MoE output carries the bf16 rounding of its inputs, weights, h and y (and the block its
            // own, in a bf16 model): a few bf16 steps (2^-8 relative) of its largest entry; the final norm
            // scales that by 1 / rms of the pre-norm row (its weight is 1); the model's own output rounding in
            // a bf16 model is the last term.
            let ymax = ys[t].iter().fold(0f32, |a, v| a.max(v.abs()));
            let rms = (pre[t].iter().map(|v| v * v).sum::<f32>() / h as f32).sqrt();
            let bound = (4.0 * ymax / 256.0 + fp8_atol) / rms + 2.0 / 256.0;
            let worst = m[t].iter().zip(&o[t]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst <= bound, "{name}, token {t}: |block - op| = {worst} > {bound} (max |y| {ymax}, rms {rms})");
        }
        let over = if self.fp8.is_some() { " over block-FP8 experts" } else { "" };
        println!("{name} block (one layer, {tokens} tokens): every token within its bound of the op{over}");
    }
}

/// candle-transformers' Mixtral (`models::mixtral`: softmax over the experts, top-2, renormalised, a loop over the
/// experts of `w2(silu(w1 x) * w3 x)`). Its block runs in F32 only in candle-transformers 0.11.1 (it multiplies
/// the experts' outputs by an F32 tensor of routing weights: "dtype mismatch in mul" in BF16), so the model is
/// F32 and the op, which is bf16, takes the same weights rounded to bf16.
#[test]
#[ignore = "needs an SM90 GPU"]
fn candle_moe_matches_candle_transformers_mixtral_block() {
    use candle_transformers::models::mixtral;
    let device = Device::new_cuda(0).unwrap();
    let Device::Cuda(cuda) = &device else { unreachable!() };
    let (e, k, h, i, tokens) = (8usize, 2usize, 512usize, 1024usize, 48usize);
    let cfg: mixtral::Config = serde_json::from_str(&format!(
        r#"{{"vocab_size": {h}, "hidden_size": {h}, "intermediate_size": {i}, "num_hidden_layers": 1,
            "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_act": "silu",
            "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "sliding_window": 64,
            "num_experts_per_tok": {k}, "num_local_experts": {e}, "use_flash_attn": false}}"#
    ))
    .unwrap();
    let mut vars = VarMap::new();
    let mut model = mixtral::Model::new(&cfg, VarBuilder::from_varmap(&vars, DType::F32, &device)).unwrap();
    OneLayer::zero(&mut vars, "self_attn.o_proj");
    vars.set_one("lm_head.weight", Tensor::eye(h, DType::F32, &device).unwrap()).unwrap();
    let block = OneLayer {
        dtype: DType::F32,
        ..OneLayer::new(&vars, "model.layers.0.block_sparse_moe", ["w1", "w3", "w2"], (e, k, h, i, tokens))
    };
    let got = model.forward(&block.ids(&device).reshape((tokens, 1)).unwrap(), 0).unwrap();
    block.check("Mixtral", cuda, &device, &got.reshape((tokens, h)).unwrap());
}

/// candle-transformers' Qwen2-MoE (`models::qwen2_moe`, bf16: softmax, top-4, not renormalised, as Qwen2-MoE's
/// `norm_topk_prob: false`, and its shared expert weighted per token by `sigmoid(x · shared_expert_gate)`),
/// through `CandleMoe::from_tensors_with_shared` and `forward_with_shared`.
#[test]
#[ignore = "needs an SM90 GPU"]
fn candle_moe_matches_candle_transformers_qwen2_moe_block() {
    use candle_transformers::models::qwen2_moe;
    let device = Device::new_cuda(0).unwrap();
    let Device::Cuda(cuda) = &device else { unreachable!() };
    let (e, k, h, i, tokens) = (16usize, 4usize, 512usize, 256usize, 40usize);
    let cfg: qwen2_moe::Config = serde_json::from_str(&format!(
        r#"{{"vocab_size": {h}, "hidden_size": {h}, "intermediate_size": 1024, "num_hidden_layers": 1,
            "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 64,
            "sliding_window": 64, "max_window_layers": 1, "tie_word_embeddings": false, "rope_theta": 1e6,
            "rms_norm_eps": 1e-6, "use_sliding_window": false, "hidden_act": "silu", "decoder_sparse_step": 1,
            "moe_intermediate_size": {i}, "shared_expert_intermediate_size": 512, "num_experts_per_tok": {k},
            "num_experts": {e}, "norm_topk_prob": false}}"#
    ))
    .unwrap();
    let mut vars = VarMap::new();
    let mut model = qwen2_moe::Model::new(&cfg, VarBuilder::from_varmap(&vars, DType::BF16, &device)).unwrap();
    OneLayer::zero(&mut vars, "self_attn.o_proj");
    vars.set_one("lm_head.weight", Tensor::eye(h, DType::BF16, &device).unwrap()).unwrap();
    let block = OneLayer {
        routing: Weights::Scaled(1.0),
        softmax_in_dtype: true,
        shared: Shared::Gated,
        ..OneLayer::new(&vars, "model.layers.0.mlp", PROJ, (e, k, h, i, tokens))
    };
    let got = model.forward(&block.ids(&device).reshape((tokens, 1)).unwrap(), 0).unwrap();
    block.check("Qwen2-MoE", cuda, &device, &got.reshape((tokens, h)).unwrap());
}

/// candle-transformers' DeepSeek-V2 (`models::deepseek2`, bf16: a gate in F32, softmax, top-4 by greedy selection,
/// weights times `routed_scaling_factor`, not renormalised; two shared experts as one MLP of twice the width,
/// added unweighted), through `CandleMoe::from_tensors_with_shared` with a shared weight of 1. Greedy, as
/// DeepSeek-V2-Lite routes: candle-transformers 0.11.1's `group_limited_greedy` is not DeepSeek-V2's grouped
/// routing (it takes the top `topk_group` of the expert scores as group indices and then ranks the 0/1 group
/// mask, not the scores), so a block in that mode is not a reference for the crate's grouped router.
#[test]
#[ignore = "needs an SM90 GPU"]
fn candle_moe_matches_candle_transformers_deepseek_v2_block() {
    use candle_transformers::models::deepseek2;
    let device = Device::new_cuda(0).unwrap();
    let Device::Cuda(cuda) = &device else { unreachable!() };
    let (e, k, h, i, tokens) = (16usize, 4usize, 512usize, 256usize, 40usize);
    let cfg: deepseek2::DeepSeekV2Config = serde_json::from_str(&format!(
        r#"{{"vocab_size": {h}, "hidden_size": {h}, "intermediate_size": 1024, "moe_intermediate_size": {i},
            "num_hidden_layers": 1, "num_attention_heads": 4, "n_shared_experts": 2, "n_routed_experts": {e},
            "routed_scaling_factor": 2.0, "topk_method": "greedy", "num_experts_per_tok": {k},
            "moe_layer_freq": 1, "first_k_dense_replace": 0, "norm_topk_prob": false, "scoring_func": "softmax",
            "hidden_act": "silu", "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": false, "rope_theta": 10000.0, "rope_scaling": null, "attention_bias": false,
            "q_lora_rank": null, "qk_rope_head_dim": 16, "kv_lora_rank": 64, "v_head_dim": 32,
            "qk_nope_head_dim": 32, "n_group": 1, "topk_group": 1}}"#
    ))
    .unwrap();
    let mut vars = VarMap::new();
    let mut model = deepseek2::DeepSeekV2::new(&cfg, VarBuilder::from_varmap(&vars, DType::BF16, &device)).unwrap();
    OneLayer::zero(&mut vars, "self_attn.o_proj");
    // The model returns the logits of each sequence's last position: one token per sequence, through an
    // identity head, are the final norm's rows.
    vars.set_one("lm_head.weight", Tensor::eye(h, DType::BF16, &device).unwrap()).unwrap();
    let block = OneLayer {
        routing: Weights::Scaled(2.0),
        gate_f32: true,
        shared: Shared::Plain,
        ..OneLayer::new(&vars, "model.layers.0.mlp", PROJ, (e, k, h, i, tokens))
    };
    let got = model.forward(&block.ids(&device).reshape((tokens, 1)).unwrap(), 0).unwrap();
    block.check("DeepSeek-V2", cuda, &device, &got.reshape((tokens, h)).unwrap());
}

/// candle-transformers' Qwen3-MoE (`models::qwen3_moe`, bf16: on CUDA its layer runs candle's `FusedMoe`; softmax,
/// top-8, renormalised).
#[test]
#[ignore = "needs an SM90 GPU"]
fn candle_moe_matches_candle_transformers_qwen3_moe_block() {
    use candle_transformers::models::qwen3_moe;
    let device = Device::new_cuda(0).unwrap();
    let Device::Cuda(cuda) = &device else { unreachable!() };
    let (e, k, h, i, tokens) = (32usize, 8usize, 512usize, 256usize, 40usize);
    let cfg = qwen3_config(e, k, h, i);
    let mut vars = VarMap::new();
    let mut model = qwen3_moe::Model::new(&cfg, VarBuilder::from_varmap(&vars, DType::BF16, &device)).unwrap();
    OneLayer::zero(&mut vars, "self_attn.o_proj");
    let block = OneLayer::new(&vars, "model.layers.0.mlp", PROJ, (e, k, h, i, tokens));
    let got = model.forward(&block.ids(&device).reshape((tokens, 1)).unwrap(), 0).unwrap();
    block.check("Qwen3-MoE", cuda, &device, &got.reshape((tokens, h)).unwrap());
}

/// candle-transformers' Qwen3-MoE block over block-FP8 experts (DeepSeek-V3's format: 128×128 blocks, f32 scales).
/// The model's random experts get a magnitude per 128×128 block (×0.25 to ×4, so that a scale read from the wrong
/// block, expert or grid orientation moves the output by about its own size), are quantised by the crate, and the
/// model then holds their dequantised values; the op runs on the e4m3 weights and scales as candle F8E4M3 and F32
/// tensors. The block's output is the dense layer on the weights the FP8 ones stand for.
#[test]
#[ignore = "needs an SM90 GPU"]
fn candle_moe_over_fp8_experts_matches_candle_transformers_qwen3_moe_block() {
    use candle_transformers::models::qwen3_moe;
    use moe_gemm::checkpoint::{Fp8Config, PackedFp8Experts};
    use moe_gemm::{ExpertFormat, PackedExperts};
    let device = Device::new_cuda(0).unwrap();
    let Device::Cuda(cuda) = &device else { unreachable!() };
    let (e, k, h, i, tokens) = (16usize, 4usize, 512usize, 256usize, 40usize);
    let cfg = qwen3_config(e, k, h, i);
    // A first model creates the random variables; the second, built after they are replaced, is the one run
    // (on CUDA the block's FusedMoe stacks the experts when it is built, so later writes would not reach it).
    let mut vars = VarMap::new();
    drop(qwen3_moe::Model::new(&cfg, VarBuilder::from_varmap(&vars, DType::BF16, &device)).unwrap());
    OneLayer::zero(&mut vars, "self_attn.o_proj");
    let moe = "model.layers.0.mlp";
    let name = |x: usize, p: &str| format!("{moe}.experts.{x}.{p}.weight");
    // [rows, cols] of the model's weight, each 128×128 block scaled by 4^((row block + 3 · col block + x) % 3 − 1).
    let host = |n: &str, x: usize| -> Vec<half::bf16> {
        let w = weight(&vars, n);
        let (r, c) = w.dims2().unwrap();
        let v: Vec<half::bf16> = w.flatten_all().unwrap().to_vec1().unwrap();
        (0..r * c)
            .map(|j| {
                let f = 4f32.powi(((j / c / 128 + 3 * (j % c / 128) + x) % 3) as i32 - 1);
                half::bf16::from_f32(v[j].to_f32() * f)
            })
            .collect()
    };
    let (mut w13, mut w2) = (Vec::new(), Vec::new());
    for x in 0..e {
        w13.extend(host(&name(x, "gate_proj"), x));
        w13.extend(host(&name(x, "up_proj"), x));
        w2.extend(host(&name(x, "down_proj"), x));
    }
    let dense = PackedExperts::new(e, h, i, ExpertFormat::SWIGLU, w13, w2, None, None).unwrap();
    let fp8 = PackedFp8Experts::quantize(&dense, &Fp8Config::DEEPSEEK_V3).unwrap();
    for x in 0..e {
        let (a, b) = fp8.expert(x).unwrap();
        let bf = |v: Vec<f32>, shape: (usize, usize)| {
            Tensor::from_vec(v, shape, &device).unwrap().to_dtype(DType::BF16).unwrap()
        };
        let a = bf(a.dequantize(), (2 * i, h));
        vars.set_one(name(x, "gate_proj"), a.narrow(0, 0, i).unwrap().contiguous().unwrap()).unwrap();
        vars.set_one(name(x, "up_proj"), a.narrow(0, i, i).unwrap().contiguous().unwrap()).unwrap();
        vars.set_one(name(x, "down_proj"), bf(b.dequantize(), (h, i))).unwrap();
    }
    let mut model = qwen3_moe::Model::new(&cfg, VarBuilder::from_varmap(&vars, DType::BF16, &device)).unwrap();
    let block = OneLayer { fp8: Some(&fp8), ..OneLayer::new(&vars, moe, PROJ, (e, k, h, i, tokens)) };
    let got = model.forward(&block.ids(&device).reshape((tokens, 1)).unwrap(), 0).unwrap();
    block.check("Qwen3-MoE", cuda, &device, &got.reshape((tokens, h)).unwrap());
}

/// Times candle's `FusedMoe.forward` (its gate, softmax, top-k and fused experts) beside the crate's op at the
/// suite's shapes, in one process on one stream: median of `reps` eager runs each (candle's op allocates, so
/// neither side is graph-captured), a 512 MB write before each run to flush L2, CUDA events on candle's stream.
/// Three columns: FusedMoe whole; candle's own routing ops followed by the crate's op (the same function); the
/// crate's op alone. Prints a CSV (and writes it to `$CANDLE_BENCH_CSV` if set). Not a pass/fail check: the
/// outputs' agreement is `candle_moe_matches_candles_fused_moe`'s.
#[test]
#[ignore = "needs an SM90 GPU (a timing run, minutes)"]
fn candle_moe_beside_fused_moe_timing() {
    use moe_gemm::cudarc::driver::sys::CUevent_flags;
    let device = Device::new_cuda(0).unwrap();
    let Device::Cuda(cuda) = &device else { unreachable!() };
    let stream = cuda.cuda_stream();
    let ctx = stream.context().clone();
    let flush = Tensor::zeros((128 << 20,), DType::F32, &device).unwrap();
    let reps = 20usize;
    let median = |f: &mut dyn FnMut()| -> f32 {
        for _ in 0..3 {
            f();
        }
        let mut t: Vec<f32> = (0..reps)
            .map(|_| {
                flush.affine(1.0, 1.0).unwrap();
                let (a, b) = (
                    ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).unwrap(),
                    ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).unwrap(),
                );
                a.record(&stream).unwrap();
                f();
                b.record(&stream).unwrap();
                b.synchronize().unwrap();
                a.elapsed_ms(&b).unwrap() * 1e3
            })
            .collect();
        t.sort_by(f32::total_cmp);
        t[reps / 2]
    };
    let mut csv = String::from("model,tokens,fused_moe_us,candle_routing_plus_op_us,op_us,op_over_fused_moe\n");
    for (name, e, k, h, i) in [
        ("mixtral-8x7b", 8usize, 2usize, 4096usize, 14336usize),
        ("qwen3-30b-a3b", 128, 8, 2048, 768),
        ("qwen3-235b-a22b", 128, 8, 4096, 1536),
        ("deepseek-v3", 256, 8, 7168, 2048),
    ] {
        // Four copies of the experts live at once (see `fused_moe`): DeepSeek-V3's need 90 GB, more than an
        // H100 has. A shape that cannot fit is said and left out, not failed: this test measures, it does not check.
        let need = 4 * e * 3 * h * i * 2;
        let (free, _) = ctx.mem_get_info().unwrap();
        if need + (1 << 30) > free {
            println!(
                "{name}: left out, its four copies of the experts need {} GiB and {} GiB are free",
                need >> 30,
                free >> 30
            );
            continue;
        }
        let (fused, w13, w2, router) = fused_moe(&device, e, k, h, i);
        let tokens = [1usize, 8, 64, 256, 1024];
        let op = CandleMoe::from_tensors(cuda, &w13, &w2, MoeLayerOptions::new(*tokens.last().unwrap(), k)).unwrap();
        drop((w13, w2));
        for t in tokens {
            let x = Tensor::randn(0f32, 1f32, (1, t, h), &device).unwrap().to_dtype(DType::BF16).unwrap();
            let x2 = x.reshape((t, h)).unwrap();
            let route = || candle_routing(&router, &x2, k);
            let (ids, w) = route();
            let y = op.forward(&x2, &ids, &w).unwrap();
            let fused_us = median(&mut || drop(fused.forward(&x, t > 1).unwrap()));
            let both_us = median(&mut || {
                let (ids, w) = route();
                drop(op.forward(&x2, &ids, &w).unwrap())
            });
            let op_us = median(&mut || op.forward_into(&y, &x2, &ids, &w).unwrap());
            let line = format!("{name},{t},{fused_us:.1},{both_us:.1},{op_us:.1},{:.3}", both_us / fused_us);
            println!("{line}");
            csv.push_str(&line);
            csv.push('\n');
        }
    }
    if let Ok(path) = std::env::var("CANDLE_BENCH_CSV") {
        std::fs::write(&path, &csv).unwrap();
    }
}
