//! The MoE layer over MXFP4 expert weights (`MoeLayer<bf16, Mxfp4ExpertWeights>`) on the H200: a gpt-oss MXFP4
//! checkpoint written by the test, kept in 4 bits on the device and run on Grouped, Contiguous, Masked and Auto
//! through the portable block-scaled GEMM (the SM100 CUTLASS kernel's operands: MXFP8 activations quantised per
//! group on the device, scale atoms, padded K and N), against the host reference `moe_forward_mx` under
//! `Fp8LayerBound`.
//!
//! `H = 1440` and `I = 448` are off the GEMMs' 128: K pads 1440 → 1536 and 448 → 512, GEMM2's N 1440 → 1536, so
//! a pad that is not zero, a `d2` read with the wrong row stride or scales read at the wrong atom shows here.

use std::sync::Arc;

use half::bf16;
use moe_gemm::checkpoint::Checkpoint;
use moe_gemm::layer::{LayerGemm, LayerShape};
use moe_gemm::reference::{fp8_layer_mismatch, moe_forward_mx, MxHostLayer};
use moe_gemm::*;

use crate::common::*;
use crate::layer::{views, weights_for};
use crate::mxfp4::gpt_oss;

#[test]
#[ignore = "needs an SM90 GPU"]
fn gpt_oss_mxfp4_layer_runs_in_four_bits_and_matches_the_host() {
    let prefix = "model.layers.3.mlp";
    let (e, k, h, i) = (8usize, 4usize, 1440usize, 448usize);
    // Scales 2^-7 ..= 2^-5, as the bf16 gpt-oss test's.
    let tensors = gpt_oss::tensors(prefix, e, h, i, 71, (120, 122), 0.5);
    let path = std::env::temp_dir().join(format!("moe-gemm-gpu-mx-layer-{}.safetensors", std::process::id()));
    gpt_oss::write(&path, &tensors);
    let experts = Checkpoint::open(&path).unwrap().pack_gpt_oss_mxfp4(prefix).unwrap();
    let _ = std::fs::remove_file(&path);
    let (_ctx, stream) = gpu();
    let w = Arc::new(Mxfp4ExpertWeights::upload_gpt_oss(&stream, &experts).unwrap());
    let shape =
        LayerShape { experts: e, global_experts: e, top_k: k, shared_groups: 0, hidden: h, inter: i, gated: true };
    let biases = 4 * (e * 2 * i + e * h);
    assert_eq!(w.bytes(), e * shape.mxfp4_expert_bytes() + biases, "the sizing's weight bytes are the upload's");
    assert_eq!((w.w13().n(), w.w13().k(), w.w2().n(), w.w2().k()), (2 * i, 1536, 1536, 512));
    let opts = MoeLayerOptions::new(64, k).backends(Backends::MX);
    let mut layer = MoeLayer::<bf16, Mxfp4ExpertWeights>::new(&stream, w.clone(), opts).unwrap();
    assert_eq!(layer.sizing().gemm(), LayerGemm::PortableMxf8f4);
    let mut scratch = MoeScratch::for_layers(&stream, [&layer]).unwrap();
    assert_eq!(scratch.bytes(), layer.needs().footprint().total(), "the footprint counts every byte");
    let e2 = layer.set_backend(Backend::Batched).unwrap_err().to_string();
    assert!(e2.contains("MXFP4") && e2.contains("Grouped"), "{e2}");
    let host = MxHostLayer::gpt_oss(&experts);
    for (t, seed) in [(1usize, 80u64), (5, 81), (40, 82)] {
        let ids = moe_gemm::random::topk_ids(t, k, e, seed);
        let wts = weights_for(t, k, seed + 1);
        let x = random_vec::<bf16>(t * h, seed + 2, 1.0);
        let want = moe_forward_mx(&host, &x, &ids, &wts, k);
        let max = want.iter().fold(0f32, |m, v| m.max(v.to_f32().abs()));
        assert!(max > 0.0, "T = {t}: the reference output is all zero: the test would prove nothing");
        let (xd, idd, wd) =
            (stream.clone_htod(&x).unwrap(), stream.clone_htod(&ids).unwrap(), stream.clone_htod(&wts).unwrap());
        for backend in [Backend::Grouped, Backend::Contiguous, Backend::Masked, Backend::Auto] {
            layer.set_backend(backend).unwrap();
            let mut y = stream.clone_htod(&vec![bf16::from_f32(f32::NAN); t * h]).unwrap();
            let (xv, iv, wv) = views(&xd, h, &idd, &wd, k);
            let mut yv = MatrixViewMut::of("y", &mut y, h).unwrap();
            layer.forward(&stream, &mut scratch, &xv, &iv, &wv, &mut yv).unwrap();
            scratch.check(&stream).unwrap();
            let got = stream.clone_dtoh(&y).unwrap();
            if let Some(m) = fp8_layer_mismatch(&got, &want, h) {
                panic!("T = {t}, {backend}: {m}");
            }
        }
    }
}
