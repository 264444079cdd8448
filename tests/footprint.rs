//! The memory model on the host: the scratch a layer needs, checked against formulas written here from the
//! layouts' definitions (not from the library's sizing code), the serving targets (one scratch for any number of
//! layers, within 10% of one Grouped step's inherent need; plans under 1 MB), and `moe-gemm plan`.

use std::process::Command;

use moe_gemm::dtype::DType;
use moe_gemm::layer::{auto_backend, LayerShape, ScratchNeeds};
use moe_gemm::{Backend, Backends, LayerSizing};

/// (name, E, k, H, I, MoE layers) of the suite models.
const MODELS: [(&str, usize, usize, usize, usize, usize); 5] = [
    ("mixtral-8x7b", 8, 2, 4096, 14336, 32),
    ("qwen3-30b-a3b", 128, 8, 2048, 768, 48),
    ("qwen3-235b-a22b", 128, 8, 4096, 1536, 94),
    ("deepseek-v3", 256, 8, 7168, 2048, 58),
    ("gpt-oss-120b", 128, 4, 2880, 2880, 36),
];
const SM: usize = 132;

fn shape(e: usize, k: usize, h: usize, i: usize) -> LayerShape {
    LayerShape { experts: e, global_experts: e, top_k: k, shared_groups: 0, hidden: h, inter: i, gated: true }
}

fn sizing(s: LayerShape, t: usize, backends: Option<Backends>) -> LayerSizing {
    LayerSizing::new(s, DType::BF16, t, Backend::Auto, backends, None, None, false, SM).unwrap()
}

/// Rows of a layout padding each expert to `bm`: `rows` rows over at most `min(E, rows)` receiving experts.
fn padded(rows: usize, e: usize, bm: usize) -> usize {
    let mut r = rows + e.min(rows) * (bm - 1);
    while r % bm != 0 {
        r += 1;
    }
    r
}

/// The largest batch (≤ t) Auto runs on `b`, at least 1.
fn auto_max(e: usize, k: usize, h: usize, i: usize, t: usize, b: Backend) -> usize {
    (1..=t).filter(|&n| auto_backend(e, k, h, i, n) == b).max().unwrap_or(1)
}

/// The scratch bytes of Auto's default backends, from the layouts' definitions: Batched keeps one activation row
/// per (token, slot); Grouped permutes T·k rows; Fused pads each active expert to its tile (128 rows once the
/// average active expert gets 64, else 64; its expert ids per block of the smallest tile, 16 rows) and writes
/// GEMM2's rows by (token, slot).
fn expected_bytes(e: usize, k: usize, h: usize, i: usize, t: usize, n: &ScratchNeeds) -> usize {
    let (tb, tg, tf) = (
        auto_max(e, k, h, i, t, Backend::Batched).min(4096 / k),
        auto_max(e, k, h, i, t, Backend::Grouped),
        auto_max(e, k, h, i, t, Backend::Fused),
    );
    let (rb, rg) = (tb * k, tg * k);
    let rf_rows = tf * k;
    let bm = if rf_rows / e.min(rf_rows) >= 64 { 128 } else { 64 };
    let rf = padded(rf_rows, e, bm).max(padded(rf_rows, e, 64));
    let rows = rb.max(rg).max(rf);
    let a = rg * h;
    let d1 = rg.max(rf) * 2 * i;
    let hbuf = rows * i;
    let d2 = rg.max(rf_rows) * h;
    // One expert id and one hand-off counter per block of the smallest Fused tile (16 rows: Decode16).
    let tiles = rg.max([16, 32, 64, 128].iter().map(|&b| padded(rf_rows, e, b) / b).max().unwrap());
    let layout_ints = e + (e + 1) + 2 * rg.max(rf) + 2 * tiles + t * k + 1 + n.layout_scratch_ints;
    (a + d1 + hbuf + d2) * 2 + layout_ints * 4 + n.workspace_bytes + 4
}

#[test]
fn scratch_footprint_matches_the_layout_formulas_on_the_suite_models() {
    for (name, e, k, h, i, _) in MODELS {
        for t in [1usize, 8, 64, 256, 4096] {
            let s = sizing(shape(e, k, h, i), t, None);
            let n = s.needs();
            let got = n.footprint().total();
            let want = expected_bytes(e, k, h, i, t, n);
            assert_eq!(got, want, "{name} max_tokens {t}: footprint {got} B, formula {want} B ({n:?})");
        }
    }
}

#[test]
fn one_scratch_serves_every_layer_and_stays_near_one_grouped_step() {
    for (name, e, k, h, i, layers) in MODELS {
        let t = 4096;
        let s = sizing(shape(e, k, h, i), t, None);
        let one = *s.needs();
        let mut all = one;
        for _ in 1..layers {
            all = all.max(one).unwrap();
        }
        assert_eq!(all, one, "{name}: the scratch grows with the layer count");
        // What one Grouped step of T tokens inherently holds: permuted rows, GEMM1 out, activation, GEMM2 out at
        // T·k rows, its layout (ids per position, per flat row, per expert) and the GEMM workspace.
        let rows = t * k;
        let grouped = rows * (h + 2 * i + i + h) * 2
            + (e + (e + 1) + 3 * rows + rows + 1 + one.layout_scratch_ints) * 4
            + one.workspace_bytes;
        let total = one.footprint().total();
        assert!(
            total as f64 <= 1.10 * grouped as f64,
            "{name}: scratch {total} B exceeds 1.10 x one Grouped step's {grouped} B"
        );
        let plan = s.plan_bytes(false);
        assert!(plan.device + plan.host < 1 << 20, "{name}: plan of {plan:?} bytes");
        assert_eq!(plan.device, 0, "{name}: no expert map, no device bytes in the plan");
        let ep = LayerSizing::new(
            LayerShape { experts: e / 2, global_experts: e, ..shape(e, k, h, i) },
            DType::BF16,
            t,
            Backend::Auto,
            None,
            None,
            None,
            true,
            SM,
        )
        .unwrap();
        assert_eq!(ep.plan_bytes(true).device, e * 4, "{name}: the expert map is the plan's only device bytes");
        assert_eq!(ep.backends(), Backends::of(Backend::Grouped), "{name}: Auto with an expert map runs Grouped");
    }
}

#[test]
fn explicit_backends_get_room_for_max_tokens_and_the_old_per_layer_total_is_gone() {
    // DeepSeek-V3 at 4096 tokens: every backend at full size is what each layer used to allocate (about 2.9 GB);
    // Auto's default needs a fraction of that, once for the whole model.
    let s = shape(256, 8, 7168, 2048);
    let all = sizing(s, 4096, Some(Backends::ALL)).needs().footprint().total();
    let auto = sizing(s, 4096, None).needs().footprint().total();
    assert!(all as f64 > 1.9 * auto as f64, "all backends {all} B vs Auto's {auto} B");
    assert!(auto < 1_400_000_000, "Auto's scratch {auto} B");
    // Masked gets E·max_m rows; a set without it never pays for them.
    let masked = sizing(s, 4096, Some(Backends::of(Backend::Masked))).needs().h_rows;
    assert_eq!(masked, 256 * 256);
    assert_eq!(sizing(s, 4096, Some(Backends::of(Backend::Grouped))).needs().h_rows, 4096 * 8);
}

#[test]
fn invalid_sizings_name_the_constraint() {
    let s = shape(8, 2, 128, 64);
    let err = |r: moe_gemm::Result<LayerSizing>| r.unwrap_err().to_string();
    let e1 = err(LayerSizing::new(s, DType::BF16, 0, Backend::Auto, None, None, None, false, SM));
    assert!(e1.contains("max_tokens = 0"), "{e1}");
    let e2 = err(LayerSizing::new(s, DType::BF16, 8, Backend::Auto, Some(Backends::NONE), None, None, false, SM));
    assert!(e2.contains("empty"), "{e2}");
    let e3 = err(LayerSizing::new(
        s,
        DType::BF16,
        8,
        Backend::Fused,
        Some(Backends::AUTO.with(Backend::Eager)).map(|b| b.iter().filter(|&x| x != Backend::Fused).collect()),
        None,
        None,
        false,
        SM,
    ));
    assert!(e3.contains("not among"), "{e3}");
    let e4 = err(LayerSizing::new(s, DType::BF16, 8, Backend::Auto, Some(Backends::ALL), None, None, true, SM));
    assert!(e4.contains("expert map"), "{e4}");
    let e5 = err(LayerSizing::new(shape(8, 9, 128, 64), DType::BF16, 8, Backend::Auto, None, None, None, false, SM));
    assert!(e5.contains("top_k = 9"), "{e5}");
    // A scratch of another dtype or too small is refused by name.
    let a = *sizing(s, 64, None).needs();
    let b = *sizing(s, 128, None).needs();
    assert!(a.check_covers(&b).unwrap_err().to_string().contains("scratch capacity"));
    b.check_covers(&a).unwrap();
    let f16 = *LayerSizing::new(s, DType::F16, 64, Backend::Auto, None, None, None, false, SM).unwrap().needs();
    assert!(a.max(f16).is_err());
}

#[test]
fn moe_gemm_plan_prints_every_suite_model_with_its_layer_count() {
    let out = Command::new(env!("CARGO_BIN_EXE_moe-gemm")).args(["plan", "--max-tokens", "4096"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    for (name, e, k, h, i, layers) in MODELS {
        assert!(text.contains(&format!("{name} ({layers} MoE layers")), "{name} missing:\n{text}");
        if name != "deepseek-v3" {
            // (DeepSeek-V3's shared expert adds a group; the others match the plain shape.)
            let total = sizing(shape(e, k, h, i), 4096, None).needs().footprint().total();
            assert!(text.contains(&format!(" {total} B ")), "{name}: {total} B not printed:\n{text}");
        }
    }
    let (ok, bad) = {
        let o = Command::new(env!("CARGO_BIN_EXE_moe-gemm")).args(["plan", "--model", "llama"]).output().unwrap();
        (o.status.success(), String::from_utf8_lossy(&o.stderr).to_string())
    };
    assert!(!ok && bad.contains("deepseek-v3"), "{bad}");
}

/// Over block-FP8 weights Batched's expand kernel quantises h once into the scratch: e4m3 rows for every
/// (token, slot) row of its largest pass and one arrival counter per row per 128 columns of h; without
/// Batched neither is held for it.
#[test]
fn fp8_batched_holds_h_quantised_once_and_its_arrival_counters() {
    let shape = LayerShape {
        experts: 256,
        global_experts: 256,
        top_k: 8,
        shared_groups: 1,
        hidden: 7168,
        inter: 2048,
        gated: true,
    };
    let batched = Some(Backends::of(Backend::Batched));
    let s = LayerSizing::new_fp8(shape, 5, Backend::Batched, batched, None, false, SM).unwrap();
    let n = s.needs();
    assert_eq!((n.h_fp8_rows, n.arrival_words), (5 * 9, 5 * 9 * 16), "5 tokens x (8 + 1 shared) slots");
    let f = n.footprint();
    assert!(f.parts.iter().any(|(name, b)| name.contains("arrival") && *b == 5 * 9 * 16 * 4), "{f}");
    let grouped = Some(Backends::of(Backend::Grouped));
    let g = LayerSizing::new_fp8(shape, 5, Backend::Grouped, grouped, None, false, SM).unwrap();
    assert_eq!((g.needs().h_fp8_rows, g.needs().arrival_words), (5 * 9, 0), "Grouped's own h rows, no counters");
    let dense = LayerSizing::new(shape, DType::BF16, 5, Backend::Batched, batched, None, None, false, SM).unwrap();
    assert_eq!((dense.needs().h_fp8_rows, dense.needs().arrival_words), (0, 0));
}
