//! Shared experts on the CPU: the host type's checks, the split into routed-width groups (the packed groups run
//! through the routed reference compute exactly what the full-width shared reference does), the sizing and
//! footprint of the extended routing, and `moe-gemm plan` counting DeepSeek-V3's shared expert; the FP8
//! reference with a block-FP8 shared expert against the routed-only reference and the shared term written out.

mod common;

use std::process::Command;

use common::*;
use half::bf16;
use moe_gemm::checkpoint::{Fp8Config, PackedFp8Experts, SharedFp8Expert};
use moe_gemm::dtype::DType;
use moe_gemm::layer::{Footprint, GateUp, LayerShape, Storage};
use moe_gemm::quant::{per_token_group_quant, BlockFp8, BlockShape, GroupQuant, ScaleFormat, Scales, Ue8m0};
use moe_gemm::reference::{
    moe_forward, moe_forward_fp8, moe_forward_fp8_with_shared, moe_forward_with_shared, shared_gate_weights,
    Fp8HostLayer,
};
use moe_gemm::*;

fn routed(e: usize, h: usize, i: usize, format: ExpertFormat, biases: bool, seed: u64) -> PackedExperts<bf16> {
    let r13 = 2 * i;
    let mut rng = Rng(seed);
    let mut bias = |n: usize| Some((0..n).map(|_| rng.unit() * 0.5).collect::<Vec<f32>>());
    let (b13, b2) = if biases { (bias(e * r13), bias(e * h)) } else { (None, None) };
    let w13 = random_vec::<bf16>(e * r13 * h, seed + 1, 0.15);
    let w2 = random_vec::<bf16>(e * h * i, seed + 2, 0.15);
    PackedExperts::new(e, h, i, format, w13, w2, b13, b2).unwrap()
}

fn shared(h: usize, is: usize, gated: bool, seed: u64) -> SharedExpert<bf16> {
    SharedExpert::new(
        h,
        is,
        random_vec(is * h, seed, 0.15),
        random_vec(is * h, seed + 1, 0.15),
        random_vec(h * is, seed + 2, 0.15),
        gated.then(|| random_vec(h, seed + 3, 0.2)),
    )
    .unwrap()
}

fn bits(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Routing `[T, k]` extended by `m` shared groups with ids `e..e + m` and weight `s_t` (or 1), as the device's
/// extend_routing writes it.
fn extended(ids: &[i32], w: &[f32], k: usize, e: usize, m: usize, s: Option<&[f32]>) -> (Vec<i32>, Vec<f32>) {
    let t = ids.len() / k;
    let mut out = (Vec::new(), Vec::new());
    for tt in 0..t {
        out.0.extend_from_slice(&ids[tt * k..(tt + 1) * k]);
        out.1.extend_from_slice(&w[tt * k..(tt + 1) * k]);
        out.0.extend((0..m).map(|j| (e + j) as i32));
        out.1.extend((0..m).map(|_| s.map_or(1.0, |s| s[tt])));
    }
    out
}

fn weights_for(tokens: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..tokens * k).map(|_| rng.unit().abs() + 0.1).collect()
}

/// The groups the device runs (appended experts E..E+m) compute, through the routed reference, bit for bit what
/// the shared reference computes from the full-width tensors: DeepSeek-like (I_s = I, weight 1), Qwen2-MoE-like
/// (I_s = 4I, sigmoid gate), and interleaved, transposed, biased routed experts (the groups follow their format,
/// the biases get zero rows).
#[test]
fn packed_groups_compute_the_full_width_shared_expert() {
    let (h, i, t) = (32usize, 16usize, 6usize);
    let interleaved =
        ExpertFormat { gate_up: GateUp::Interleaved, activation: Activation::SiluGated, storage: Storage::InOut };
    let cases = [
        ("deepseek-like", ExpertFormat::SWIGLU, false, 8usize, 3usize, 1usize, false),
        ("qwen2-moe-like", ExpertFormat::SWIGLU, false, 6, 2, 4, true),
        ("interleaved in-out biased", interleaved, true, 4, 2, 2, false),
    ];
    for (name, format, biases, e, k, m, gated) in cases {
        let p = routed(e, h, i, format, biases, 1);
        let s = shared(h, m * i, gated, 10);
        let x = random_vec::<bf16>(t * h, 20, 1.0);
        let ids = moe_gemm::random::topk_ids(t, k, e, 21);
        let w = weights_for(t, k, 22);
        let sw = shared_gate_weights(&s, &x);
        assert_eq!(sw.is_some(), gated, "{name}");
        let want = moe_forward_with_shared(&p, &s, &x, &ids, &w, k, sw.as_deref());
        let packed = p.with_shared_groups(&s).unwrap();
        assert_eq!((packed.experts, packed.inter, packed.format), (e + m, i, format), "{name}");
        let (ids2, w2) = extended(&ids, &w, k, e, m, sw.as_deref());
        let got = moe_forward(&packed, &x, &ids2, &w2, k + m);
        assert_eq!(bits(&got), bits(&want), "{name}");
        // The shared expert moves the output: a dropped or unweighted shared expert would be seen.
        assert_ne!(bits(&moe_forward(&p, &x, &ids, &w, k)), bits(&want), "{name}");
        let zero = vec![0f32; t];
        assert_eq!(
            bits(&moe_forward_with_shared(&p, &s, &x, &ids, &w, k, Some(&zero))),
            bits(&moe_forward(&p, &x, &ids, &w, k)),
            "{name}: s_t = 0 leaves the routed sum"
        );
    }
}

/// The shared reference is the model's MLP: with I_s = I its rounding is the model's own (checked against the
/// definition written out here); with I_s = 4I it rounds GEMM2 per group, within a few bf16 steps of a single
/// rounding over I_s.
#[test]
fn shared_reference_is_the_swiglu_mlp() {
    let (h, i, e, k, t) = (32usize, 16usize, 4usize, 2usize, 5usize);
    let p = routed(e, h, i, ExpertFormat::SWIGLU, false, 31);
    let x = random_vec::<bf16>(t * h, 32, 1.0);
    let ids = moe_gemm::random::topk_ids(t, k, e, 33);
    let no_routing = vec![0f32; t * k];
    let r = |v: f32| bf16::from_f32(v).to_f32();
    for m in [1usize, 4] {
        let s = shared(h, m * i, false, 34);
        let got = moe_forward_with_shared(&p, &s, &x, &ids, &no_routing, k, None);
        let is = m * i;
        let (mut worst, mut max) = (0f32, 0f32);
        for tt in 0..t {
            let xr: Vec<f32> = x[tt * h..(tt + 1) * h].iter().map(|v| v.to_f32()).collect();
            let dot = |w: &[bf16]| -> f32 { (0..h).map(|c| xr[c] * w[c].to_f32()).sum() };
            let act: Vec<f32> = (0..is)
                .map(|n| {
                    let g = r(dot(&s.gate_proj[n * h..(n + 1) * h]));
                    let u = r(dot(&s.up_proj[n * h..(n + 1) * h]));
                    r(g / (1.0 + (-g).exp()) * u)
                })
                .collect();
            for o in 0..h {
                let y = r((0..is).map(|n| act[n] * s.down_proj[o * is + n].to_f32()).sum());
                let g = got[tt * h + o].to_f32();
                if m == 1 {
                    assert_eq!(g.to_bits(), y.to_bits(), "I_s = I: token {tt} output {o}");
                }
                worst = worst.max((g - y).abs());
                max = max.max(y.abs());
            }
        }
        assert!(worst <= 4.0 * 2f32.powi(-8) * max, "I_s = {m}I: error {worst} at max |y| {max}");
    }
}

#[test]
fn shared_expert_shapes_and_errors_name_the_constraint() {
    let (h, i) = (32usize, 16usize);
    let err = |r: Result<SharedExpert<bf16>>| r.unwrap_err().to_string();
    let msg =
        err(SharedExpert::new(h, 2 * i, vec![bf16::ZERO; 10], vec![bf16::ZERO; 1024], vec![bf16::ZERO; 1024], None));
    assert!(msg.contains("shared gate_proj has 10 elements, expected 1024"), "{msg}");
    let msg = err(SharedExpert::new(h, i, vec![bf16::ZERO; 512], vec![bf16::ZERO; 512], vec![bf16::ZERO; 511], None));
    assert!(msg.contains("shared down_proj has 511"), "{msg}");
    let gate = Some(vec![bf16::ZERO; h + 1]);
    let msg = err(SharedExpert::new(h, i, vec![bf16::ZERO; 512], vec![bf16::ZERO; 512], vec![bf16::ZERO; 512], gate));
    assert!(msg.contains("shared_expert_gate has 33 elements, expected 32"), "{msg}");
    assert!(err(SharedExpert::new(0, i, vec![], vec![], vec![], None)).contains("positive"));

    let p = routed(4, h, i, ExpertFormat::SWIGLU, false, 41);
    let odd = shared(h, 24, false, 42);
    let msg = odd.groups(i).unwrap_err().to_string();
    assert!(msg.contains("I_s = 24") && msg.contains("multiple") && msg.contains("I = 16"), "{msg}");
    let msg = p.with_shared_groups(&odd).unwrap_err().to_string();
    assert!(msg.contains("I_s = 24"), "{msg}");
    assert_eq!(shared(h, 4 * i, false, 43).groups(i).unwrap(), 4);
    let msg = p.with_shared_groups(&shared(16, i, false, 44)).unwrap_err().to_string();
    assert!(msg.contains("hidden size 16 differs") && msg.contains("32"), "{msg}");
    // gpt-oss has no shared expert: its clamped activation is not the shared MLP's.
    let gpt = routed(4, h, i, ExpertFormat::GPT_OSS, true, 45);
    let msg = gpt.with_shared_groups(&shared(h, i, false, 46)).unwrap_err().to_string();
    assert!(msg.contains("SwiGLU") && msg.contains("GptOssSwiglu"), "{msg}");
    // Public fields edited into lengths that do not fit: an error, not an index out of bounds.
    let mut short = shared(h, i, false, 47);
    short.up_proj.pop();
    assert!(p.with_shared_groups(&short).unwrap_err().to_string().contains("shared up_proj"));
    let mut bad_routed = p.clone();
    bad_routed.w2.pop();
    assert!(bad_routed.with_shared_groups(&shared(h, i, false, 48)).unwrap_err().to_string().contains("w2"));
}

/// Groups sliced off a shared expert (an expert-parallel split) append to the same tensors as the whole.
#[test]
fn slices_of_groups_make_up_the_shared_expert() {
    let (h, i) = (32usize, 16usize);
    let p = routed(3, h, i, ExpertFormat::SWIGLU, false, 51);
    let s = shared(h, 4 * i, true, 52);
    let (a, b) = (s.slice_groups(i, 0..1).unwrap(), s.slice_groups(i, 1..4).unwrap());
    assert_eq!((a.inter, b.inter), (i, 3 * i));
    assert_eq!(a.expert_gate, s.expert_gate, "every slice keeps the per-token gate");
    let whole = p.with_shared_groups(&s).unwrap();
    let parts = p.with_shared_groups(&a).unwrap().with_shared_groups(&b).unwrap();
    assert_eq!(parts, whole);
    assert!(s.slice_groups(i, 2..2).is_err());
    assert!(s.slice_groups(i, 3..5).unwrap_err().to_string().contains("4 groups"));
    assert!(s.slice_groups(24, 0..1).is_err());
}

#[test]
fn qwen2_gate_weights_are_the_rounded_sigmoid() {
    let h = 8usize;
    let mut s = shared(h, 16, true, 61);
    s.expert_gate = Some(vec![bf16::from_f32(0.5); h]);
    let x: Vec<bf16> = (0..2 * h).map(|n| bf16::from_f32(if n < h { 0.25 } else { -1.0 })).collect();
    let w = shared_gate_weights(&s, &x).unwrap();
    let sig = |z: f32| bf16::from_f32(1.0 / (1.0 + (-z).exp())).to_f32();
    assert_eq!(w, vec![sig(1.0), sig(-4.0)]);
    s.expert_gate = None;
    assert!(shared_gate_weights(&s, &x).is_none());
}

/// The sizing of a layer with shared groups: k + m slots per token, E + m GEMM groups, the extended routing in
/// the scratch and its bytes in the footprint, the extended expert map in the plan's bytes.
#[test]
fn shared_groups_size_the_scratch_and_the_plan() {
    let shape = |m: usize, global: usize| LayerShape {
        experts: 64,
        global_experts: global,
        top_k: 8,
        shared_groups: m,
        hidden: 1024,
        inter: 256,
        gated: true,
    };
    assert_eq!((shape(2, 64).slots(), shape(2, 64).groups(), shape(2, 128).layout_experts()), (10, 66, 130));
    let size = |m: usize, global: usize| {
        LayerSizing::new(shape(m, global), DType::BF16, 256, Backend::Grouped, None, None, None, global != 64, 132)
            .unwrap()
    };
    let (plain, with) = (size(0, 64), size(1, 64));
    let (n0, n1) = (plain.needs(), with.needs());
    assert_eq!((n0.routing_slots, n1.routing_slots), (0, 256 * 9));
    assert_eq!((n0.slots, n1.slots), (256 * 8, 256 * 9));
    assert_eq!((n0.groups, n1.groups), (64, 65));
    let routing_bytes = |fp: &Footprint| fp.parts.iter().find(|p| p.0 == "shared-expert routing").unwrap().1;
    assert_eq!(routing_bytes(&n0.footprint()), 0);
    assert_eq!(routing_bytes(&n1.footprint()), 256 * 9 * 8);
    assert!(n1.footprint().total() > n0.footprint().total());
    // A scratch sized without shared experts does not serve a layer with them, and says why.
    let msg = n0.check_covers(n1).unwrap_err().to_string();
    assert!(msg.contains("slots") || msg.contains("routing_slots"), "{msg}");
    n0.max(*n1).unwrap().check_covers(n1).unwrap();
    // Expert parallelism: the map covers the router's experts and the shared groups.
    assert_eq!(size(1, 128).plan_bytes(true).device, (128 + 1) * 4);
}

#[test]
fn plan_counts_deepseek_v3_shared_expert() {
    let out = Command::new(env!("CARGO_BIN_EXE_moe-gemm"))
        .args(["plan", "--model", "deepseek-v3,qwen3-30b-a3b", "--layers", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("shared expert I_s 2048 (1 group)"), "{text}");
    // 256 routed experts + 1 shared group of 3 x 7168 x 2048 bf16 (84 MiB each).
    assert!(text.contains(&format!("weights: {:.2} MiB per layer", 257.0 * 84.0)), "{text}");
    assert!(text.contains("shared-expert routing"), "{text}");
    let qwen = &text[text.find("qwen3-30b-a3b").unwrap()..];
    assert!(!qwen.contains("shared expert I_s") && !qwen.contains("shared-expert routing"), "{qwen}");
}

// ---------------------------------------------------------------------------------------------------------------
// The FP8 reference with a block-FP8 shared expert

/// Routed block-FP8 experts, a block-FP8 shared expert of `m` routed-width groups, and a batch.
struct Fp8Case {
    routed: PackedFp8Experts,
    shared: SharedFp8Expert,
    x: Vec<bf16>,
    ids: Vec<i32>,
    w: Vec<f32>,
    s_t: Vec<f32>,
    k: usize,
}

fn fp8_block(rows: usize, cols: usize, format: ScaleFormat, seed: u64) -> BlockFp8 {
    // Each 128 x 128 block at its own magnitude, so a block read under another's scale is seen.
    let mut rng = Rng(seed);
    let w: Vec<f32> =
        (0..rows * cols).map(|n| rng.unit() * 0.15 * (1 + (n / cols / 128 * 3 + n % cols / 128) % 4) as f32).collect();
    BlockFp8::quantize(&w, rows, cols, BlockShape::DEEPSEEK, format).unwrap()
}

/// (E, H, I, I_s / I, T, k).
type Fp8Shape = (usize, usize, usize, usize, usize, usize);

fn fp8_case(config: &Fp8Config, (e, h, i, m, t, k): Fp8Shape, seed: u64) -> Fp8Case {
    let routed = PackedFp8Experts::quantize(&routed(e, h, i, ExpertFormat::SWIGLU, false, seed), config).unwrap();
    let f = config.scale_format();
    let shared = SharedFp8Expert::new(
        fp8_block(m * i, h, f, seed + 1),
        fp8_block(m * i, h, f, seed + 2),
        fp8_block(h, m * i, f, seed + 3),
    )
    .unwrap();
    let mut rng = Rng(seed + 4);
    Fp8Case {
        routed,
        shared,
        x: random_vec(t * h, seed + 5, 1.0),
        ids: moe_gemm::random::topk_ids(t, k, e, seed + 6),
        w: weights_for(t, k, seed + 7),
        s_t: (0..t).map(|_| 0.25 + rng.unit().abs()).collect(),
        k,
    }
}

/// A block-FP8 matrix with its scale of block `(br, bc)` doubled.
fn with_block_scaled(b: &BlockFp8, br: usize, bc: usize) -> BlockFp8 {
    let (q, s) = b.clone().into_parts();
    let gc = b.cols().div_ceil(128);
    let mut v: Vec<f32> = (0..s.len()).map(|n| s.get(n).unwrap()).collect();
    v[br * gc + bc] *= 2.0;
    let s = match s.format() {
        ScaleFormat::Ue8m0 => Scales::Ue8m0(v.iter().map(|&x| Ue8m0::from_f32_ceil(x).unwrap()).collect()),
        _ => Scales::F32(v),
    };
    BlockFp8::from_parts(b.rows(), b.cols(), b.block(), q, s).unwrap()
}

/// The shapes: DeepSeek-V3-like (I_s = I, weight 1) and Qwen2-MoE-like (I_s = 2I, per-token weight), each with
/// f32 and UE8M0 scales.
fn fp8_cases() -> Vec<(String, Fp8Case)> {
    let mut out = Vec::new();
    for config in [Fp8Config::DEEPSEEK_V3, Fp8Config::DEEPSEEK_V3_1] {
        for (e, h, i, m, t, k) in [(4usize, 256usize, 128usize, 1usize, 5usize, 2usize), (6, 384, 128, 2, 7, 3)] {
            let name = format!("{:?} E {e} H {h} I {i} I_s {} T {t} k {k}", config.scale_format(), m * i);
            out.push((name, fp8_case(&config, (e, h, i, m, t, k), 30 + m as u64)));
        }
    }
    out
}

/// (a) A shared expert whose weights are all zero adds nothing: the output is the routed-only reference's, bit
/// for bit, with weight 1 and with per-token weights.
#[test]
fn fp8_reference_with_a_zero_shared_expert_is_the_routed_reference() {
    for (name, c) in fp8_cases() {
        let (h, is) = (c.shared.hidden(), c.shared.inter());
        let f = c.routed.scale_format();
        let zero = |r: usize, cols: usize| BlockFp8::quantize(&vec![0.0; r * cols], r, cols, BlockShape::DEEPSEEK, f);
        let z = SharedFp8Expert::new(zero(is, h).unwrap(), zero(is, h).unwrap(), zero(h, is).unwrap()).unwrap();
        let layer = Fp8HostLayer::new(&c.routed, Activation::SiluGated);
        let routed_only = moe_forward_fp8(&layer, &c.x, &c.ids, &c.w, c.k);
        for s in [None, Some(&c.s_t[..])] {
            let got = moe_forward_fp8_with_shared(&layer, &z, &c.x, &c.ids, &c.w, c.k, s);
            assert_eq!(bits(&got), bits(&routed_only), "{name}, s_t {:?}", s.is_some());
        }
        // The non-zero shared expert is visible.
        let got = moe_forward_fp8_with_shared(&layer, &c.shared, &c.x, &c.ids, &c.w, c.k, None);
        assert_ne!(bits(&got), bits(&routed_only), "{name}");
    }
}

/// The shared term `s_t · shared(x)` written out from the model's definition: the token's row quantised per 128
/// columns as the layer quantises it, each matrix dequantised exactly (e4m3 times its block scale, in f64),
/// GEMM1 in f64 rounded to bf16 through f32, SwiGLU in f32 rounded, `h` quantised by the same rules, GEMM2 in
/// f64 per `I`-wide slice, each rounded to bf16 and added with weight `s_t` in f32.
fn shared_term(s: &SharedFp8Expert, quant: &GroupQuant, inter: usize, x: &[f32], st: f32) -> Vec<f32> {
    let (h, is) = (s.hidden(), s.inter());
    let round = |v: f64| bf16::from_f32(v as f32).to_f32();
    let exact = |b: &BlockFp8| -> Vec<f64> {
        (0..b.rows() * b.cols())
            .map(|n| b.q()[n].to_f32() as f64 * b.scale_of(n / b.cols(), n % b.cols()).unwrap() as f64)
            .collect()
    };
    let act_of = |v: &[f32], len: usize| -> Vec<f64> {
        let (q, sc) = per_token_group_quant(v, 1, len, quant).unwrap();
        q.iter().enumerate().map(|(c, q)| q.to_f32() as f64 * sc[c / 128] as f64).collect()
    };
    let xa = act_of(x, h);
    let (g, u, d) = (exact(s.gate()), exact(s.up()), exact(s.down()));
    let dot = |w: &[f64], a: &[f64]| -> f64 { w.iter().zip(a).map(|(w, a)| w * a).sum() };
    let act: Vec<f32> = (0..is)
        .map(|n| {
            let (gv, uv) = (round(dot(&g[n * h..(n + 1) * h], &xa)), round(dot(&u[n * h..(n + 1) * h], &xa)));
            bf16::from_f32(gv / (1.0 + (-gv).exp()) * uv).to_f32()
        })
        .collect();
    let ha = act_of(&act, is);
    let mut term = vec![0f32; h];
    for (o, t) in term.iter_mut().enumerate() {
        for lo in (0..is).step_by(inter) {
            *t += st * round(dot(&d[o * is + lo..o * is + lo + inter], &ha[lo..lo + inter]));
        }
    }
    term
}

/// (b) The reference with the shared expert is the routed-only reference plus [`shared_term`], computed here
/// independently. With zero routing weights the routed part is exactly zero, and the two agree bit for bit
/// (they differ only by f64 rounding in the GEMMs' order of summation). With routing weights, the routed-only
/// output is rounded to bf16 before the term is added, so the output must lie between the bf16 roundings of
/// `routed ± half a bf16 step + term`: nothing looser.
#[test]
fn fp8_reference_adds_the_shared_term_written_out_independently() {
    for (name, c) in fp8_cases() {
        let layer = Fp8HostLayer::new(&c.routed, Activation::SiluGated);
        let (h, i) = (c.routed.hidden(), c.routed.inter());
        let tokens = c.x.len() / h;
        let zero_w = vec![0f32; c.w.len()];
        for s in [None, Some(&c.s_t[..])] {
            let terms: Vec<Vec<f32>> = (0..tokens)
                .map(|t| {
                    let x: Vec<f32> = c.x[t * h..(t + 1) * h].iter().map(|v| v.to_f32()).collect();
                    shared_term(&c.shared, &layer.quant, i, &x, s.map_or(1.0, |s| s[t]))
                })
                .collect();
            let only = moe_forward_fp8_with_shared(&layer, &c.shared, &c.x, &c.ids, &zero_w, c.k, s);
            let want: Vec<bf16> = terms.iter().flatten().map(|&v| bf16::from_f32(v)).collect();
            assert_eq!(bits(&only), bits(&want), "{name}, s_t {}: the shared term alone", s.is_some());

            let routed_only = moe_forward_fp8(&layer, &c.x, &c.ids, &c.w, c.k);
            let got = moe_forward_fp8_with_shared(&layer, &c.shared, &c.x, &c.ids, &c.w, c.k, s);
            for (n, ((g, r), t)) in got.iter().zip(&routed_only).zip(terms.iter().flatten()).enumerate() {
                let (r, t) = (r.to_f32(), *t);
                // Half a bf16 step of the routed sum, and f32 slack for the order of the additions.
                let half = if r == 0.0 { 0.0 } else { 2f32.powi(r.abs().log2().floor() as i32 - 8) };
                let slack = (r.abs() + t.abs()) * 2f32.powi(-22);
                let (lo, hi) = (bf16::from_f32(r - half + t - slack), bf16::from_f32(r + half + t + slack));
                assert!(lo <= *g && *g <= hi, "{name}, s_t {}: element {n}: {g} outside [{lo}, {hi}]", s.is_some());
            }
        }
    }
}

/// (c) A shared-expert weight changed in one 128 x 128 block (its scale doubled) changes the output: in gate or
/// up, of every output row; in down, of exactly the 128 output columns that block feeds.
#[test]
fn fp8_reference_sees_one_changed_shared_block() {
    for (name, c) in fp8_cases() {
        let layer = Fp8HostLayer::new(&c.routed, Activation::SiluGated);
        let h = c.routed.hidden();
        let want = moe_forward_fp8_with_shared(&layer, &c.shared, &c.x, &c.ids, &c.w, c.k, Some(&c.s_t));
        let (gr, gc) = (c.shared.inter() / 128 - 1, h / 128 - 1);
        let (g, u, d) = (c.shared.gate(), c.shared.up(), c.shared.down());
        let changed = [
            ("gate", SharedFp8Expert::new(with_block_scaled(g, gr, 0), u.clone(), d.clone()).unwrap()),
            ("up", SharedFp8Expert::new(g.clone(), with_block_scaled(u, 0, gc), d.clone()).unwrap()),
            ("down", SharedFp8Expert::new(g.clone(), u.clone(), with_block_scaled(d, 1, gr)).unwrap()),
        ];
        for (which, s) in changed {
            let got = moe_forward_fp8_with_shared(&layer, &s, &c.x, &c.ids, &c.w, c.k, Some(&c.s_t));
            let moved: Vec<usize> = (0..got.len()).filter(|&n| got[n].to_bits() != want[n].to_bits()).collect();
            assert!(!moved.is_empty(), "{name}: {which}: a doubled block changed nothing");
            if which == "down" {
                assert!(
                    moved.iter().all(|n| (128..256).contains(&(n % h))),
                    "{name}: down block [1, {gr}] moved {moved:?}"
                );
            }
        }
    }
}

/// The reference from the full-width shared matrices equals the routed reference over the shared groups
/// appended as experts (`with_shared_groups`, what the device uploads) with the routing extended, bit for bit:
/// the split loses nothing when `I` is a multiple of the 128-blocks.
#[test]
fn fp8_reference_equals_the_groups_appended_as_experts() {
    for (name, c) in fp8_cases() {
        let (all, m) = c.routed.with_shared_groups(&c.shared).unwrap();
        let e = c.routed.experts();
        for s in [None, Some(&c.s_t[..])] {
            let want = moe_forward_fp8_with_shared(
                &Fp8HostLayer::new(&c.routed, Activation::SiluGated),
                &c.shared,
                &c.x,
                &c.ids,
                &c.w,
                c.k,
                s,
            );
            let (ids, w) = extended(&c.ids, &c.w, c.k, e, m, s);
            let got = moe_forward_fp8(&Fp8HostLayer::new(&all, Activation::SiluGated), &c.x, &ids, &w, c.k + m);
            assert_eq!(bits(&got), bits(&want), "{name}, s_t {}", s.is_some());
        }
    }
}
