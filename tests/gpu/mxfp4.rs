//! A gpt-oss MXFP4 checkpoint on Hopper: the experts dequantised on the host into gpt-oss's bf16 format and run
//! by the bf16 layer on every backend, against the CPU reference `moe_forward` on the same dequantised weights.

use half::bf16;
use moe_gemm::checkpoint::Checkpoint;
use moe_gemm::dtype::DType;
use moe_gemm::reference::moe_forward;
use moe_gemm::reference::{first_mismatch, Tolerance};
use moe_gemm::*;

use crate::common::*;
use crate::layer::{weights_for, Rig};

#[path = "../common/gpt_oss.rs"]
pub(crate) mod gpt_oss;

#[test]
#[ignore = "needs an SM90 GPU"]
fn gpt_oss_mxfp4_checkpoint_runs_on_the_bf16_layer() {
    let prefix = "model.layers.0.mlp";
    let (e, k, h, i, t) = (8usize, 4usize, 128usize, 64usize, 40usize);
    // Scales 2^-7 ..= 2^-5: weights up to 6 · 2^-5 ≈ 0.19, the magnitude of the bf16 layer tests' weights.
    let tensors = gpt_oss::tensors(prefix, e, h, i, 41, (120, 122), 0.5);
    let path = std::env::temp_dir().join(format!("moe-gemm-gpu-mxfp4-{}.safetensors", std::process::id()));
    gpt_oss::write(&path, &tensors);
    let ckpt = Checkpoint::open(&path).unwrap();
    let p = ckpt.pack_gpt_oss_dequantized::<bf16>(prefix).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!((p.format, p.experts, p.hidden, p.inter), (ExpertFormat::GPT_OSS, e, h, i));
    let ids = moe_gemm::random::topk_ids(t, k, e, 42);
    let w = weights_for(t, k, 43);
    let x = random_vec::<bf16>(t * h, 44, 1.0);
    let want = moe_forward(&p, &x, &ids, &w, k);
    let wantf: Vec<f32> = want.iter().map(|v| v.to_f32()).collect();
    let max = wantf.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(max > 0.0, "the reference output is all zero: the test would prove nothing");
    // A few bf16 steps at the output's magnitude, as tests/gpu/layer.rs compares the bf16 gpt-oss layer.
    let step = 2.0 * DType::BF16.half_ulp();
    let tol = Tolerance { atol: 2.0 * max * step, rtol: 2.0 * step };
    let mut rig = Rig::new(&p, 64, k);
    let (ids_d, w_d) = (rig.stream.clone_htod(&ids).unwrap(), rig.stream.clone_htod(&w).unwrap());
    for backend in Backend::CONCRETE {
        let got: Vec<f32> = rig.forward(backend, &x, &ids_d, &w_d).iter().map(|v| v.to_f32()).collect();
        if let Some((at, a, b)) = first_mismatch(&got, &wantf, tol) {
            panic!("{backend:?}: element {at}: got {a}, reference {b} ({tol:?})");
        }
    }
}
