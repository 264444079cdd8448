//! moe-gemm's candle operation against candle's own fused MoE (`candle_transformers::fused_moe::FusedMoe`, on
//! candle-nn's `moe_gemm` kernels), built from the same random weights through a `VarBuilder`: the same routing
//! (candle's softmax, top-k and renormalisation, computed once and given to both), outputs compared token by
//! token, at a decode and a prefill batch. On the GPU host: `carry/candle_moe --include-ignored`.

use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::{Activation, VarBuilder, VarMap};
use candle_transformers::fused_moe::{FusedMoe, MoeCfg};
use moe_gemm::candle::CandleMoe;
use moe_gemm::MoeLayerOptions;

fn weight(vars: &VarMap, name: &str) -> Tensor {
    vars.data().lock().unwrap().get(name).unwrap_or_else(|| panic!("no {name}")).as_tensor().clone()
}

#[test]
#[ignore = "needs an SM90 GPU"]
fn candle_moe_matches_candles_fused_moe() {
    let device = Device::new_cuda(0).unwrap();
    let Device::Cuda(cuda) = &device else { unreachable!() };
    let (e, h, i, k) = (16usize, 512usize, 256usize, 4usize);
    let vars = VarMap::new();
    let vb = VarBuilder::from_varmap(&vars, DType::BF16, &device);
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
    // The same tensors, packed as FusedMoe packs them: w13 = [gate; up] per expert, w2 = down.
    let per = |p: &str| (0..e).map(|x| weight(&vars, &format!("experts.{x}.{p}.weight"))).collect::<Vec<_>>();
    let (gate, up, down) = (per("gate_proj"), per("up_proj"), per("down_proj"));
    let w13: Vec<Tensor> = gate.iter().zip(&up).map(|(g, u)| Tensor::cat(&[g, u], 0).unwrap()).collect();
    let (w13, w2) = (Tensor::stack(&w13, 0).unwrap(), Tensor::stack(&down, 0).unwrap());
    let router = candle_nn::Linear::new(weight(&vars, "gate.weight"), None);

    for (tokens, prefill) in [(8usize, false), (96, true)] {
        let op = CandleMoe::from_tensors(cuda, &w13, &w2, MoeLayerOptions::new(tokens, k)).unwrap();
        let x = Tensor::randn(0f32, 1f32, (1, tokens, h), &device).unwrap().to_dtype(DType::BF16).unwrap();
        let want = fused.forward(&x, prefill).unwrap().reshape((tokens, h)).unwrap();
        // FusedMoe's routing, step for step: softmax of the gate in f32, top-k by arg-sort, renormalised.
        let x2 = x.reshape((tokens, h)).unwrap();
        let probs = candle_nn::ops::softmax_last_dim(&router.forward(&x2).unwrap().to_dtype(DType::F32).unwrap()).unwrap();
        let ids = probs.arg_sort_last_dim(false).unwrap().narrow(D::Minus1, 0, k).unwrap().contiguous().unwrap();
        let w = probs.gather(&ids, D::Minus1).unwrap();
        let w = w.broadcast_div(&w.sum_keepdim(D::Minus1).unwrap()).unwrap().contiguous().unwrap();
        // candle's U32 ids as they come, and as I32: the same output.
        let got = op.forward(&x2, &ids, &w).unwrap();
        let got_i32 = op.forward(&x2, &ids.to_dtype(DType::I32).unwrap(), &w).unwrap();
        let same = got.to_dtype(DType::F32).unwrap().sub(&got_i32.to_dtype(DType::F32).unwrap()).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
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
