//! Plans a server can trust, on the CPU: `Auto` runs only backends its plan made room for, and a forced
//! backend runs full passes or is refused by name. The plans are sized for a described H200 (no GPU).

use moe_gemm::dtype::DType;
use moe_gemm::layer::{LayerShape, WeightFormat};
use moe_gemm::tuning::TunedBackends;
use moe_gemm::*;

fn h200() -> DeviceInfo {
    DeviceInfo::described("NVIDIA H200", (9, 0), 132)
}

fn shape(experts: usize, top_k: usize, hidden: usize, inter: usize) -> LayerShape {
    LayerShape { experts, global_experts: experts, top_k, shared_groups: 0, hidden, inter, gated: true }
}

/// DeepSeek-V3, Qwen3-30B-A3B and Mixtral-8x7B's expert layers.
fn models() -> [(&'static str, LayerShape); 3] {
    [
        ("deepseek-v3", shape(256, 8, 7168, 2048)),
        ("qwen3-30b", shape(128, 8, 2048, 768)),
        ("mixtral", shape(8, 2, 4096, 14336)),
    ]
}

/// Every non-empty subset of `of`.
fn subsets(of: Backends) -> Vec<Backends> {
    let all: Vec<Backend> = of.iter().collect();
    (1u32..1 << all.len()).map(|m| (0..all.len()).filter(|i| m >> i & 1 == 1).map(|i| all[i]).collect()).collect()
}

const SERVING: [Backend; 5] =
    [Backend::Batched, Backend::Grouped, Backend::Contiguous, Backend::Masked, Backend::Fused];

fn tokens() -> impl Iterator<Item = usize> {
    (1..=64).chain((72..=4096).step_by(41)).chain([128, 256, 512, 1024, 2048, 4096])
}

/// A plan on an H200 with its shipped tuned table (where one was tuned for the shape).
fn size(s: LayerShape, format: WeightFormat, max: usize, backend: Backend, set: Option<Backends>) -> LayerSizing {
    let tuned = TunedBackends::shipped("NVIDIA H200", format, s.global_experts, s.inter);
    LayerSizing::for_device(&h200(), s, DType::BF16, format, max, backend, set, None, None, false, tuned).unwrap()
}

/// A plan by the cost model alone (`MoeLayerOptions::cost_model_only`, `moe-gemm plan` without `--gpu-name`).
fn untuned(s: LayerShape, max: usize, backend: Backend, set: Option<Backends>) -> LayerSizing {
    LayerSizing::for_device(&h200(), s, DType::BF16, WeightFormat::Dense, max, backend, set, None, None, false, None)
        .unwrap()
}

/// `MoeLayerOptions::new(T, k).backends(set)` under `Auto`: for every model, every non-empty subset of the
/// serving backends and batches of 1 to 4096 tokens, Auto picks a backend of the set (the shipped H200 tables
/// and the cost model restricted to it), and every pass of a forward has room. Before, Auto picked Batched or
/// Fused on a Grouped-only plan and every forward failed at run time.
#[test]
fn auto_picks_only_backends_the_plan_made_room_for() {
    let serving: Backends = SERVING.into_iter().collect();
    for (name, s) in models() {
        for set in subsets(serving) {
            let z = size(s, WeightFormat::Dense, 4096, Backend::Auto, Some(set));
            assert_eq!(z.backends(), set);
            for t in tokens() {
                let b = z.backend_for(Backend::Auto, t);
                assert!(set.contains(b), "{name} {{{set}}}: Auto picks {b} at T = {t}");
                assert!(z.passes(Backend::Auto, t).is_ok(), "{name} {{{set}}}: T = {t} has no room");
            }
        }
        // A set of one: that one, at every batch.
        for b in SERVING {
            let z = size(s, WeightFormat::Dense, 4096, Backend::Auto, Some(Backends::of(b)));
            assert!(tokens().all(|t| z.backend_for(Backend::Auto, t) == b), "{name}: {{{b}}}");
        }
        // FP8 experts over the FP8 backends.
        for set in subsets(Backends::FP8) {
            let z = size(s, WeightFormat::Fp8Block, 4096, Backend::Auto, Some(set));
            for t in tokens() {
                let b = z.backend_for(Backend::Auto, t);
                assert!(set.contains(b), "{name} FP8 {{{set}}}: Auto picks {b} at T = {t}");
            }
        }
    }
}

/// A tuned table given by the caller whose buckets name backends outside the planned set: Auto never runs
/// them. And a layer planned for one forced backend then switched to Auto stays on it.
#[test]
fn auto_ignores_tuned_buckets_of_unplanned_backends_and_a_forced_plan_stays_forced() {
    let (_, qwen) = models()[1];
    let tuned = TunedBackends::new(128, 768, &[(1, Backend::Batched), (64, Backend::Fused), (512, Backend::Masked)]);
    let grouped = Backends::of(Backend::Grouped).with(Backend::Contiguous);
    let z = LayerSizing::for_device(
        &h200(),
        qwen,
        DType::BF16,
        WeightFormat::Dense,
        1024,
        Backend::Auto,
        Some(grouped),
        None,
        None,
        false,
        Some(tuned.unwrap()),
    )
    .unwrap();
    for t in tokens().filter(|&t| t <= 1024) {
        assert!(grouped.contains(z.backend_for(Backend::Auto, t)), "T = {t}");
    }
    // Planned for Grouped alone (no `backends`): `set_backend(Auto)` may only pick Grouped.
    let z = size(qwen, WeightFormat::Dense, 512, Backend::Grouped, None);
    assert!(tokens().all(|t| z.backend_for(Backend::Auto, t) == Backend::Grouped));
}

/// Qwen3-30B-shaped, max_tokens 512, Auto by its cost model: Grouped has room for 1 token per pass, so forcing it
/// would run a 512-token batch as 512 passes. `check_full_passes` (what `MoeLayer::set_backend` runs) refuses it
/// naming the room and max_tokens; a plan that names the backend in `backends` gives it full passes.
#[test]
fn forcing_a_backend_without_full_passes_is_refused_by_name() {
    let (_, qwen) = models()[1];
    let auto = untuned(qwen, 512, Backend::Auto, None);
    assert_eq!(auto.tokens_per_pass(Backend::Grouped), 1);
    assert_eq!(auto.passes(Backend::Grouped, 512).unwrap(), 512);
    let msg = match auto.check_full_passes(Backend::Grouped) {
        Err(Error::InvalidProblem(m)) => m,
        other => panic!("expected InvalidProblem, got {other:?}"),
    };
    for want in ["backend grouped has room for 1 token per pass", "max_tokens 512", "512 passes", "backends("] {
        assert!(msg.contains(want), "{want:?} not in: {msg}");
    }
    // Auto's own passes are untouched; Fused has the room Auto gives it.
    auto.check_full_passes(Backend::Auto).unwrap();
    assert_eq!(auto.passes(Backend::Auto, 512).unwrap(), 1);
    // Every serving backend named in `backends`: full passes for each, a 512-token batch in one pass.
    let serving: Backends = SERVING.into_iter().collect();
    let full = untuned(qwen, 512, Backend::Auto, Some(serving));
    for b in SERVING {
        full.check_full_passes(b).unwrap();
        assert_eq!(full.tokens_per_pass(b), full.full_pass_tokens(b), "{b}");
        let want = 512usize.div_ceil(full.full_pass_tokens(b));
        assert_eq!(full.passes(b, 512).unwrap(), want, "{b}");
    }
    // Masked is bounded by its rows per expert (256 by default), Batched by its 4096 rows: full all the same.
    assert_eq!((full.full_pass_tokens(Backend::Masked), full.full_pass_tokens(Backend::Batched)), (256, 512));
    // A forced backend planned alone gets full passes too.
    for b in SERVING {
        untuned(qwen, 512, b, None).check_full_passes(b).unwrap();
    }
}

/// DeepSeek-V3 at max_tokens 4096 under Auto: the room `moe-gemm plan` prints per backend is the number a
/// forced backend's refusal names.
#[test]
fn tokens_per_pass_is_the_number_the_refusal_names() {
    let (_, ds) = models()[0];
    let z = untuned(ds, 4096, Backend::Auto, None);
    for b in z.backends().iter() {
        let room = z.tokens_per_pass(b);
        assert!(room >= 1, "{b}");
        match z.check_full_passes(b) {
            Ok(()) => assert_eq!(room, z.full_pass_tokens(b), "{b}"),
            Err(e) => assert!(e.to_string().contains(&format!("room for {room} token")), "{b}: {e}"),
        }
    }
    assert_eq!(z.tokens_per_pass(Backend::Grouped), 4096);
    assert_eq!(z.tokens_per_pass(Backend::Masked), 0, "no room: not in the plan");
}

/// A tuned table applies to layers of its own weight format and shape only: a bf16 table given to a block-FP8
/// plan (or the reverse) is refused, naming both formats, as is a table of another `E` or `N`; the plan's
/// Auto source says where its choices come from (a given table, the cost model, Grouped alone).
#[test]
fn plans_refuse_a_table_of_another_format_or_shape_and_say_what_auto_follows() {
    use moe_gemm::layer::AutoSource;
    let s = shape(256, 8, 7168, 2048);
    let plan = |format, tuned| {
        LayerSizing::for_device(&h200(), s, DType::BF16, format, 64, Backend::Auto, None, None, None, false, tuned)
    };
    let bf16 = TunedBackends::new(256, 2048, &[(1, Backend::Batched), (64, Backend::Grouped)]).unwrap();
    let fp8 = bf16.with_format(WeightFormat::Fp8Block).unwrap();
    let err = plan(WeightFormat::Fp8Block, Some(bf16)).unwrap_err().to_string();
    assert!(err.contains("measured over dense experts") && err.contains("fp8 block"), "{err}");
    let err = plan(WeightFormat::Dense, Some(fp8)).unwrap_err().to_string();
    assert!(err.contains("measured over fp8 block") && err.contains("are dense"), "{err}");
    let wide = TunedBackends::new(256, 4096, &[(1, Backend::Grouped)]).unwrap();
    let err = plan(WeightFormat::Dense, Some(wide)).unwrap_err().to_string();
    assert!(err.contains("tuned backends for E = 256, N = 4096"), "{err}");
    let p = plan(WeightFormat::Fp8Block, Some(fp8)).unwrap();
    assert_eq!(
        (p.backend_for(Backend::Auto, 1), p.backend_for(Backend::Auto, 64)),
        (Backend::Batched, Backend::Grouped)
    );
    assert_eq!(p.auto_source(), AutoSource::GivenTable);
    assert_eq!(plan(WeightFormat::Fp8Block, None).unwrap().auto_source(), AutoSource::CostModel);
    // Per-channel FP8 picks Batched or Grouped by the FP8 cost model; MXFP4 runs the layout backends alone.
    assert_eq!(plan(WeightFormat::Fp8Channel, None).unwrap().auto_source(), AutoSource::CostModel);
    assert_eq!(plan(WeightFormat::Mxfp4, None).unwrap().auto_source(), AutoSource::GroupedOnly);
    let shipped = TunedBackends::shipped("NVIDIA H200", WeightFormat::Dense, 256, 2048).unwrap();
    let p = plan(WeightFormat::Dense, Some(shipped)).unwrap();
    assert_eq!(p.auto_source(), AutoSource::ShippedTable("E=256,N=2048,device_name=NVIDIA_H200,dtype=bf16.json"));
    assert!(p.auto_source().to_string().contains("shipped table E=256,N=2048"), "{}", p.auto_source());
}
