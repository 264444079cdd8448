//! Checkpoint packing on the CPU: real tensor names, safetensors files, exact round trips, errors naming the
//! tensor, and the packed layout computing what the per-expert tensors define.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::*;
use half::bf16;
use moe_gemm::checkpoint::{
    pack_experts, pack_shared_expert, save, unpack_experts, unpack_shared_expert, Checkpoint, ExpertNaming,
    NamedTensor, SharedNaming,
};
use moe_gemm::dtype::Element;
use moe_gemm::reference::moe_forward;
use moe_gemm::*;
use safetensors::tensor::{Dtype, TensorView};

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("moe-gemm-test-{}-{name}.safetensors", std::process::id()))
}

type Tensors = Vec<NamedTensor<bf16>>;

/// Tensors of any dtype written with safetensors directly: name, dtype, shape, little-endian bytes.
fn write_raw(path: &Path, tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: HashMap<String, TensorView<'_>> =
        tensors.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bits16<T: Element>(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|&x| T::from_f32(x).to_bits().to_le_bytes()).collect()
}

fn experts(prefix: &str, naming: ExpertNaming, e: usize, i: usize, h: usize) -> Tensors {
    let mut out = Vec::new();
    for x in 0..e {
        let [g, u, d] = naming.names(prefix, x);
        out.push((g, vec![i, h], random_vec::<bf16>(i * h, 10 * x as u64 + 1, 1.0)));
        out.push((u, vec![i, h], random_vec::<bf16>(i * h, 10 * x as u64 + 2, 1.0)));
        out.push((d, vec![h, i], random_vec::<bf16>(h * i, 10 * x as u64 + 3, 1.0)));
    }
    out
}

fn bits(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn mixtral_and_qwen_names_round_trip_bit_for_bit() {
    for (prefix, naming) in
        [("model.layers.3.block_sparse_moe", ExpertNaming::Mixtral), ("model.layers.0.mlp", ExpertNaming::GateUpDown)]
    {
        let original = experts(prefix, naming, 4, 16, 8);
        let path = tmp(&format!("{naming:?}"));
        save(&path, &original).unwrap();
        let ckpt = Checkpoint::open(&path).unwrap();
        assert!(ckpt.names().iter().any(|n| n.ends_with(if naming == ExpertNaming::Mixtral {
            "experts.2.w3.weight"
        } else {
            "experts.2.up_proj.weight"
        })));
        let packed = ckpt.pack_experts::<bf16>(prefix, 4, naming).unwrap();
        assert_eq!((packed.experts, packed.hidden, packed.inter), (4, 8, 16));
        // [gate | up]: expert 1's up rows start I rows into its block.
        let up1 = &original.iter().find(|t| t.0 == naming.names(prefix, 1)[1]).unwrap().2;
        assert_eq!(bits(&packed.w13[(2 * 16) * 8 + 16 * 8..(2 * 16) * 8 + 32 * 8]), bits(up1));
        let unpacked = unpack_experts(&packed, prefix, naming).unwrap();
        let mut a = original.clone();
        let mut b = unpacked.clone();
        a.sort_by(|x, y| x.0.cmp(&y.0));
        b.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!((&x.0, &x.1), (&y.0, &y.1));
            assert_eq!(bits(&x.2), bits(&y.2), "{}", x.0);
        }
        // Saving the unpacked tensors gives a file that packs to the same experts.
        let again = tmp(&format!("{naming:?}-again"));
        save(&again, &unpacked).unwrap();
        assert_eq!(Checkpoint::open(&again).unwrap().pack_experts::<bf16>(prefix, 4, naming).unwrap(), packed);
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_file(again);
    }
}

#[test]
fn missing_expert_and_bad_shapes_name_the_tensor() {
    let prefix = "model.layers.1.block_sparse_moe";
    let mut t = experts(prefix, ExpertNaming::Mixtral, 3, 16, 8);
    t.retain(|x| x.0 != "model.layers.1.block_sparse_moe.experts.2.w3.weight");
    let path = tmp("missing");
    save(&path, &t).unwrap();
    let err = Checkpoint::open(&path).unwrap().pack_experts::<bf16>(prefix, 3, ExpertNaming::Mixtral).unwrap_err();
    assert!(err.to_string().contains("experts.2.w3.weight") && err.to_string().contains("missing"), "{err}");

    let mut t = experts(prefix, ExpertNaming::Mixtral, 3, 16, 8);
    let w2 = t.iter_mut().find(|x| x.0.ends_with("experts.1.w2.weight")).unwrap();
    w2.1 = vec![16, 8]; // transposed by mistake
    let err = pack_experts(
        |n| Ok(t.iter().find(|x| x.0 == n).map(|x| (x.1.clone(), x.2.clone())).unwrap()),
        prefix,
        3,
        ExpertNaming::Mixtral,
    )
    .unwrap_err();
    assert!(err.to_string().contains("experts.1.w2.weight") && err.to_string().contains("[8, 16]"), "{err}");

    let f16s: Vec<NamedTensor<half::f16>> = vec![("x".into(), vec![2], vec![half::f16::ONE; 2])];
    save(&path, &f16s).unwrap();
    let err = Checkpoint::open(&path).unwrap().tensor::<bf16>("x").unwrap_err();
    assert!(err.to_string().contains("`x`") && err.to_string().contains("F16"), "{err}");
    let _ = std::fs::remove_file(path);
}

/// DeepSeek-V3's `e_score_correction_bias` reads as f32 whether the file holds it as F32 (the released
/// checkpoints) or as BF16 / F16 (some exports): the same values, exactly. Other dtypes are refused naming the
/// file, the tensor and the dtype.
#[test]
fn correction_bias_reads_as_f32_from_f32_bf16_and_f16() {
    let e = 64usize;
    let name = "model.layers.3.mlp.gate.e_score_correction_bias".to_string();
    // Multiples of 1/256 below 0.4 in magnitude: exact in bf16 and f16, so every file holds the same numbers.
    let bias: Vec<f32> = (0..e).map(|x| ((x * 37 % 199) as f32 - 99.0) / 256.0).collect();
    let counts = "model.layers.3.mlp.gate.tokens_per_expert".to_string();
    for (dtype, bytes) in
        [(Dtype::F32, f32_bytes(&bias)), (Dtype::BF16, bits16::<bf16>(&bias)), (Dtype::F16, bits16::<half::f16>(&bias))]
    {
        let path = tmp(&format!("bias-{dtype:?}"));
        write_raw(
            &path,
            &[
                (name.clone(), dtype, vec![e], bytes),
                (counts.clone(), Dtype::I32, vec![e], (0..e as i32).flat_map(|c| c.to_le_bytes()).collect()),
            ],
        );
        let ckpt = Checkpoint::open(&path).unwrap();
        assert_eq!(ckpt.file(), path.as_path());
        let (shape, got) = ckpt.tensor_f32(&name).unwrap();
        assert_eq!(shape, [e]);
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            bias.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{dtype:?}"
        );
        let file = path.display().to_string();
        let err = ckpt.tensor_f32(&counts).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::Checkpoint { .. }), "{err:?}");
        assert!(
            msg.contains(&counts) && msg.contains(&file) && msg.contains("I32") && msg.contains("F32, BF16 or F16"),
            "{msg}"
        );
        let msg = ckpt.tensor_f32("model.layers.3.mlp.gate.weight").unwrap_err().to_string();
        assert!(msg.contains("gate.weight") && msg.contains(&file) && msg.contains("missing"), "{msg}");
        let _ = std::fs::remove_file(path);
    }
}

#[test]
fn gpt_oss_packed_tensors_load_with_their_format() {
    let (e, h, i) = (2usize, 8usize, 16usize);
    let prefix = "model.layers.0.mlp";
    let t: Tensors = vec![
        (format!("{prefix}.experts.gate_up_proj"), vec![e, h, 2 * i], random_vec(e * h * 2 * i, 1, 1.0)),
        (format!("{prefix}.experts.gate_up_proj_bias"), vec![e, 2 * i], random_vec(e * 2 * i, 2, 1.0)),
        (format!("{prefix}.experts.down_proj"), vec![e, i, h], random_vec(e * i * h, 3, 1.0)),
        (format!("{prefix}.experts.down_proj_bias"), vec![e, h], random_vec(e * h, 4, 1.0)),
    ];
    let path = tmp("gptoss");
    save(&path, &t).unwrap();
    let p = Checkpoint::open(&path).unwrap().pack_gpt_oss::<bf16>(prefix).unwrap();
    assert_eq!(p.format, ExpertFormat::GPT_OSS);
    assert_eq!((p.experts, p.hidden, p.inter), (e, h, i));
    assert_eq!(p.b13.as_ref().unwrap()[5], t[1].2[5].to_f32());
    let _ = std::fs::remove_file(path);
}

/// f32 values whose low mantissa bits are set, so rounding them to bf16 differs from truncating them.
fn f32_weights(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    (0..n).map(|_| rng.unit() * (1.0 + 2f32.powi(-12))).collect()
}

/// Host conversion to bf16, and a check that it is not truncation for these values.
fn rounded(v: &[f32]) -> Vec<u16> {
    let r: Vec<u16> = v.iter().map(|&x| bf16::from_f32(x).to_bits()).collect();
    assert!(v.iter().zip(&r).any(|(x, b)| (x.to_bits() >> 16) as u16 != *b), "some values round up");
    r
}

/// Weights stored as F32 (or F16) load into bf16 experts, shared experts and gpt-oss experts equal to the host
/// conversion (round to nearest even); biases stay f32 exactly.
#[test]
fn f32_and_f16_stored_weights_load_into_bf16_rounded_to_nearest_even() {
    let (e, i, h, is) = (2usize, 16usize, 8usize, 32usize);
    let prefix = "model.layers.5.mlp";
    let mut store: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut want: HashMap<String, Vec<f32>> = HashMap::new();
    let mut put = |name: String, dtype: Dtype, shape: Vec<usize>, seed: u64| {
        let v = f32_weights(shape.iter().product(), seed);
        let bytes = match dtype {
            Dtype::F32 => f32_bytes(&v),
            _ => bits16::<half::f16>(&v),
        };
        // What the file holds, as f32: the F16 tensor's values are its own rounding.
        let held = match dtype {
            Dtype::F32 => v,
            _ => v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect(),
        };
        store.push((name.clone(), dtype, shape, bytes));
        want.insert(name, held);
    };
    for x in 0..e {
        let [g, u, d] = ExpertNaming::GateUpDown.names(prefix, x);
        // Expert 1's up projection in F16: dtypes may mix within a layer.
        let up = if x == 1 { Dtype::F16 } else { Dtype::F32 };
        put(g, Dtype::F32, vec![i, h], 10 * x as u64 + 1);
        put(u, up, vec![i, h], 10 * x as u64 + 2);
        put(d, Dtype::F32, vec![h, i], 10 * x as u64 + 3);
    }
    for (n, shape) in SharedNaming::SharedExperts.names(prefix).into_iter().zip([[is, h], [is, h], [h, is]]) {
        put(n, Dtype::F32, shape.to_vec(), 40 + shape[0] as u64);
    }
    let g = |s: &str| format!("{prefix}.experts.{s}");
    put(g("gate_up_proj"), Dtype::F32, vec![e, h, 2 * i], 51);
    put(g("gate_up_proj_bias"), Dtype::F32, vec![e, 2 * i], 52);
    put(g("down_proj"), Dtype::F32, vec![e, i, h], 53);
    put(g("down_proj_bias"), Dtype::F32, vec![e, h], 54);
    let path = tmp("f32-stored");
    write_raw(&path, &store);
    let ckpt = Checkpoint::open(&path).unwrap();
    let w = |n: &str| rounded(&want[n]);

    let s = ckpt.pack_shared_expert::<bf16>(prefix, SharedNaming::SharedExperts).unwrap();
    let [sg, su, sd] = SharedNaming::SharedExperts.names(prefix);
    assert_eq!((s.hidden, s.inter), (h, is));
    assert_eq!((bits(&s.gate_proj), bits(&s.up_proj), bits(&s.down_proj)), (w(&sg), w(&su), w(&sd)));

    let p = ckpt.pack_gpt_oss::<bf16>(prefix).unwrap();
    assert_eq!((p.experts, p.hidden, p.inter, p.format), (e, h, i, ExpertFormat::GPT_OSS));
    assert_eq!((bits(&p.w13), bits(&p.w2)), (w(&g("gate_up_proj")), w(&g("down_proj"))));
    assert_eq!(p.b13.as_deref(), Some(&want[&g("gate_up_proj_bias")][..]));
    assert_eq!(p.b2.as_deref(), Some(&want[&g("down_proj_bias")][..]));

    let r = ckpt.pack_experts::<bf16>(prefix, e, ExpertNaming::GateUpDown).unwrap();
    for x in 0..e {
        let [gn, un, dn] = ExpertNaming::GateUpDown.names(prefix, x);
        let held = |n: &str| want[n].iter().map(|&v| bf16::from_f32(v).to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&r.w13[x * 2 * i * h..(x * 2 + 1) * i * h]), held(&gn), "expert {x} gate");
        assert_eq!(bits(&r.w13[(x * 2 + 1) * i * h..(x + 1) * 2 * i * h]), held(&un), "expert {x} up");
        assert_eq!(bits(&r.w2[x * h * i..(x + 1) * h * i]), held(&dn), "expert {x} down");
    }
    // The same file read into f16: F16 tensors bit for bit, F32 ones rounded to nearest even.
    let s16 = ckpt.pack_shared_expert::<half::f16>(prefix, SharedNaming::SharedExperts).unwrap();
    let f16_bits = |v: &[f32]| v.iter().map(|&x| half::f16::from_f32(x).to_bits()).collect::<Vec<_>>();
    assert_eq!(s16.down_proj.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), f16_bits(&want[&sd]));
    let _ = std::fs::remove_file(path);
}

/// Integer and FP8 tensors are not converted into bf16 / f16 weights, and a finite value beyond f16's range is
/// not turned into infinity: each error names the file, the tensor, the stored dtype and what is accepted.
#[test]
fn integer_fp8_and_overflowing_weights_are_refused_by_name() {
    let (i, h) = (16usize, 8usize);
    let prefix = "model.layers.2.mlp";
    let [g, u, d] = SharedNaming::SharedExperts.names(prefix);
    let good = |name: &String, shape: Vec<usize>, seed| {
        (name.clone(), Dtype::F32, shape.clone(), f32_bytes(&f32_weights(shape.iter().product(), seed)))
    };
    let cases: [(Dtype, Vec<u8>, &str); 3] = [
        (Dtype::I32, (0..(h * i) as i32).flat_map(|x| x.to_le_bytes()).collect(), "I32"),
        (Dtype::F8_E4M3, vec![0x38; h * i], "F8_E4M3"),
        (Dtype::F32, f32_bytes(&[vec![1.0f32; h * i - 1], vec![1e6]].concat()), "beyond the range of f16"),
    ];
    for (dtype, bytes, want) in cases {
        let path = tmp(&format!("refused-{dtype:?}"));
        write_raw(&path, &[good(&g, vec![i, h], 1), good(&u, vec![i, h], 2), (d.clone(), dtype, vec![h, i], bytes)]);
        let ckpt = Checkpoint::open(&path).unwrap();
        let err = ckpt.pack_shared_expert::<half::f16>(prefix, SharedNaming::SharedExperts).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::Checkpoint { ref tensor, .. } if *tensor == d), "{err:?}");
        assert!(msg.contains(&path.display().to_string()) && msg.contains(want), "{msg}");
        if dtype != Dtype::F32 {
            assert!(msg.contains("F32, BF16 or F16"), "{msg}");
            let err = ckpt.pack_shared_expert::<bf16>(prefix, SharedNaming::SharedExperts).unwrap_err().to_string();
            assert!(err.contains(&d) && err.contains(want) && err.contains("bf16"), "{err}");
        } else {
            assert!(msg.contains(&format!("element {}", h * i - 1)), "{msg}");
            // bf16 holds 1e6: it rounds.
            ckpt.pack_shared_expert::<bf16>(prefix, SharedNaming::SharedExperts).unwrap();
        }
        let _ = std::fs::remove_file(path);
    }
}

/// The packed layer computes exactly what the per-expert tensors define: y = Σ w · W2 (silu(W1 x) ⊙ W3 x).
#[test]
fn packed_experts_compute_the_per_expert_definition() {
    let (e, i, h, k) = (3usize, 16usize, 8usize, 2usize);
    let prefix = "p";
    let t = experts(prefix, ExpertNaming::Mixtral, e, i, h);
    let get = |n: &str| Ok(t.iter().find(|x| x.0 == n).map(|x| (x.1.clone(), x.2.clone())).unwrap());
    let packed = pack_experts(get, prefix, e, ExpertNaming::Mixtral).unwrap();
    let x = random_vec::<bf16>(h, 9, 1.0);
    let (ids, w) = ([2i32, 0], [0.75f32, 0.25]);
    let y = moe_forward(&packed, &x, &ids, &w, k);
    let tensor = |n: &str| t.iter().find(|q| q.0 == n).unwrap().2.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
    for o in 0..h {
        let mut acc = 0f32;
        for (j, &ex) in ids.iter().enumerate() {
            let [g, u, d] = ExpertNaming::Mixtral.names(prefix, ex as usize);
            let (g, u, d) = (tensor(&g), tensor(&u), tensor(&d));
            let r = |v: f32| bf16::from_f32(v).to_f32();
            let act: Vec<f32> = (0..i)
                .map(|n| {
                    let gv = r((0..h).map(|c| g[n * h + c] * x[c].to_f32()).sum());
                    let uv = r((0..h).map(|c| u[n * h + c] * x[c].to_f32()).sum());
                    r(gv / (1.0 + (-gv).exp()) * uv)
                })
                .collect();
            acc += w[j] * r((0..i).map(|n| d[o * i + n] * act[n]).sum());
        }
        assert_eq!(y[o].to_bits(), bf16::from_f32(acc).to_bits(), "output {o}");
    }
}

#[test]
fn packed_experts_validate_lengths() {
    let err = PackedExperts::<bf16>::new(
        2,
        8,
        16,
        ExpertFormat::SWIGLU,
        vec![bf16::ZERO; 10],
        vec![bf16::ZERO; 256],
        None,
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("w13 (gate_up_proj) has 10 elements, expected 512"), "{err}");
}

/// Element counts that disagree with a tensor's own shape, and packed experts edited through their public fields
/// into lengths that do not fit E, H, I: errors naming the tensor or the sizes, never an index out of bounds.
#[test]
fn element_counts_that_do_not_fit_the_shapes_are_errors() {
    let prefix = "model.layers.2.mlp";
    // Gate one element short and up one long: together they would fill w13, each is wrong.
    let mut t = experts(prefix, ExpertNaming::GateUpDown, 2, 16, 8);
    t.iter_mut().find(|x| x.0.ends_with("experts.1.gate_proj.weight")).unwrap().2.pop();
    t.iter_mut().find(|x| x.0.ends_with("experts.1.up_proj.weight")).unwrap().2.push(bf16::ONE);
    let get = |n: &str| Ok(t.iter().find(|x| x.0 == n).map(|x| (x.1.clone(), x.2.clone())).unwrap());
    let err = pack_experts(get, prefix, 2, ExpertNaming::GateUpDown).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("experts.1.gate_proj.weight") && msg.contains("127 elements for shape [16, 8]"), "{msg}");

    let good = experts(prefix, ExpertNaming::GateUpDown, 2, 16, 8);
    let get = |n: &str| Ok(good.iter().find(|x| x.0 == n).map(|x| (x.1.clone(), x.2.clone())).unwrap());
    let packed = pack_experts(get, prefix, 2, ExpertNaming::GateUpDown).unwrap();
    let mut short = packed.clone();
    short.w2.truncate(100);
    let err = unpack_experts(&short, prefix, ExpertNaming::GateUpDown).unwrap_err();
    assert!(err.to_string().contains("w2 100 elements") && err.to_string().contains("E = 2, H = 8, I = 16"), "{err}");
    let mut more = packed.clone();
    more.experts = 3;
    assert!(unpack_experts(&more, prefix, ExpertNaming::GateUpDown).is_err());
    let mut huge = packed;
    huge.inter = usize::MAX;
    assert!(unpack_experts(&huge, prefix, ExpertNaming::GateUpDown).is_err());
}

/// A layer's shared-expert tensors as `naming` names them: gate/up `[I_s, H]`, down `[H, I_s]`, and Qwen2-MoE's
/// gate `[1, H]`.
fn shared_tensors(prefix: &str, naming: SharedNaming, is: usize, h: usize) -> Tensors {
    let [g, u, d] = naming.names(prefix);
    let mut out = vec![
        (g, vec![is, h], random_vec::<bf16>(is * h, 101, 1.0)),
        (u, vec![is, h], random_vec::<bf16>(is * h, 102, 1.0)),
        (d, vec![h, is], random_vec::<bf16>(h * is, 103, 1.0)),
    ];
    if let Some(n) = naming.gate_name(prefix) {
        out.push((n, vec![1, h], random_vec::<bf16>(h, 104, 1.0)));
    }
    out
}

/// DeepSeek-V3 / Kimi-K2 (`mlp.shared_experts.*`) and Qwen2-MoE (`mlp.shared_expert.*` + `shared_expert_gate`)
/// shared experts read from a safetensors file next to the routed experts, and written back bit for bit.
#[test]
fn shared_experts_load_by_their_real_names_and_round_trip() {
    let (e, i, h) = (4usize, 16usize, 8usize);
    for (naming, is, gate) in [
        (SharedNaming::SharedExperts, i, "model.layers.3.mlp.shared_experts.gate_proj.weight"),
        (SharedNaming::GatedSharedExpert, 4 * i, "model.layers.3.mlp.shared_expert.gate_proj.weight"),
    ] {
        let prefix = "model.layers.3.mlp";
        assert_eq!(naming.names(prefix)[0], gate);
        let mut tensors = experts(prefix, ExpertNaming::GateUpDown, e, i, h);
        let shared = shared_tensors(prefix, naming, is, h);
        tensors.extend(shared.iter().cloned());
        let path = tmp(&format!("shared-{naming:?}"));
        save(&path, &tensors).unwrap();
        let ckpt = Checkpoint::open(&path).unwrap();
        let routed = ckpt.pack_experts::<bf16>(prefix, e, ExpertNaming::GateUpDown).unwrap();
        let s = ckpt.pack_shared_expert::<bf16>(prefix, naming).unwrap();
        assert_eq!((s.hidden, s.inter), (h, is));
        assert_eq!(bits(&s.down_proj), bits(&shared[2].2));
        match naming {
            SharedNaming::GatedSharedExpert => {
                assert_eq!(bits(s.expert_gate.as_ref().unwrap()), bits(&shared[3].2));
                assert!(ckpt.names().contains(&"model.layers.3.mlp.shared_expert_gate.weight".to_string()));
            }
            _ => assert!(s.expert_gate.is_none()),
        }
        assert_eq!(s.groups(routed.inter).unwrap(), is / i);
        assert_eq!(routed.with_shared_groups(&s).unwrap().experts, e + is / i);
        let mut back = unpack_shared_expert(&s, prefix, naming).unwrap();
        let mut want = shared.clone();
        back.sort_by(|x, y| x.0.cmp(&y.0));
        want.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(back.len(), want.len());
        for (x, y) in back.iter().zip(&want) {
            assert_eq!((&x.0, &x.1, bits(&x.2)), (&y.0, &y.1, bits(&y.2)));
        }
        let _ = std::fs::remove_file(path);
    }
    // A gated expert under the ungated naming would lose its gate: refused.
    let gated = pack_shared_expert(
        |n| {
            Ok(shared_tensors("p", SharedNaming::GatedSharedExpert, 16, 8)
                .into_iter()
                .find(|t| t.0 == n)
                .map(|t| (t.1, t.2))
                .unwrap())
        },
        "p",
        SharedNaming::GatedSharedExpert,
    )
    .unwrap();
    assert!(unpack_shared_expert(&gated, "p", SharedNaming::SharedExperts).is_err());
}

#[test]
fn missing_or_misshapen_shared_tensors_name_the_tensor() {
    let (is, h) = (16usize, 8usize);
    let prefix = "model.layers.0.mlp";
    let naming = SharedNaming::GatedSharedExpert;
    let path = tmp("shared-missing");
    let mut t = shared_tensors(prefix, naming, is, h);
    t.retain(|x| !x.0.ends_with("shared_expert_gate.weight"));
    save(&path, &t).unwrap();
    let err = Checkpoint::open(&path).unwrap().pack_shared_expert::<bf16>(prefix, naming).unwrap_err();
    assert!(matches!(err, Error::Checkpoint { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("model.layers.0.mlp.shared_expert_gate.weight") && msg.contains("missing"), "{msg}");
    // DeepSeek naming on a Qwen2-MoE file: its shared_experts.* tensors are missing.
    let err = Checkpoint::open(&path).unwrap().pack_shared_expert::<bf16>(prefix, SharedNaming::SharedExperts);
    assert!(err.unwrap_err().to_string().contains("mlp.shared_experts.gate_proj.weight"));
    let _ = std::fs::remove_file(path);

    let lookup = |t: Tensors| {
        move |n: &str| -> Result<(Vec<usize>, Vec<bf16>)> {
            t.iter().find(|x| x.0 == n).map(|x| (x.1.clone(), x.2.clone())).ok_or_else(|| Error::Checkpoint {
                file: None,
                tensor: n.into(),
                problem: "missing".into(),
            })
        }
    };
    type Mutation = fn(&mut Tensors);
    let cases: [(&str, Mutation, &str); 5] = [
        ("shared_expert.down_proj.weight", |t| t[2].1 = vec![16, 8], "[16, 8], expected [8, 16]"),
        ("shared_expert.up_proj.weight", |t| t[1].1 = vec![16, 4], "expected [16, 8] like the gate"),
        ("shared_expert.gate_proj.weight", |t| t[0].1 = vec![128], "expected [I_s, H]"),
        ("shared_expert_gate.weight", |t| t[3].1 = vec![8], "expected [1, 8]"),
        ("shared_expert.up_proj.weight", |t| t[1].2.truncate(127), "127 elements for shape [16, 8]"),
    ];
    for (tensor, mutate, want) in cases {
        let mut t = shared_tensors(prefix, naming, is, h);
        mutate(&mut t);
        let err = pack_shared_expert(lookup(t), prefix, naming).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::Checkpoint { .. }), "{err:?}");
        assert!(msg.contains(&format!("{prefix}.{tensor}")) && msg.contains(want), "{tensor}: {msg}");
    }
}
