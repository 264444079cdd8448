//! CPU tests of the FP8 layer planned for a described B200 (no SM100 GPU exists in this project; nothing here
//! runs a kernel): the sizing picks the SM100 FP8 blockwise GEMM, sizes its workspace as that plan asks, runs
//! Grouped under Auto, takes the layout and decode backends and refuses Fused (SM90 wgmma kernels) naming the
//! backend and both arches; an H200 keeps the SM90 plan and the sizing it had. Dense bf16 layers take the SM100
//! bf16 grouped GEMM there.

use moe_gemm::dtype::DType;
use moe_gemm::kernels::grouped_fp8::GroupedGemmFp8Shape;
use moe_gemm::kernels::grouped_fp8_sm100::GroupedGemmFp8Sm100;
use moe_gemm::layer::{LayerGemm, LayerShape, WeightFormat};
use moe_gemm::*;

fn b200() -> DeviceInfo {
    DeviceInfo::described("NVIDIA B200", (10, 0), 148)
}

fn h200() -> DeviceInfo {
    DeviceInfo::described("NVIDIA H200", (9, 0), 132)
}

fn shape(e: usize, k: usize, h: usize, i: usize) -> LayerShape {
    LayerShape { experts: e, global_experts: e, top_k: k, shared_groups: 0, hidden: h, inter: i, gated: true }
}

fn fp8_on(
    dev: &DeviceInfo,
    s: LayerShape,
    t: usize,
    backend: Backend,
    backends: Option<Backends>,
) -> Result<LayerSizing> {
    LayerSizing::for_device(dev, s, DType::BF16, WeightFormat::Fp8Block, t, backend, backends, None, None, false, None)
}

/// The workspace of the SM100 FP8 plan of `[groups, n, k]` over `max_rows` rows, as the plan itself reports it.
fn sm100_workspace(groups: usize, n: usize, k: usize, max_rows: usize) -> usize {
    let shape = GroupedGemmFp8Shape::new(groups, n, k, max_rows).unwrap();
    GroupedGemmFp8Sm100::for_device(b200(), shape).unwrap().workspace_bytes()
}

#[test]
fn on_a_b200_the_fp8_layer_plans_the_sm100_gemm_and_auto_runs_grouped() {
    let s = shape(256, 8, 7168, 2048);
    for t in [1usize, 64, 4096] {
        let auto = fp8_on(&b200(), s, t, Backend::Auto, None).unwrap();
        assert_eq!(auto.gemm(), LayerGemm::Sm100Fp8Blockwise, "T = {t}");
        assert_eq!(auto.backends(), Backends::of(Backend::Grouped), "T = {t}: Auto runs Grouped on SM100");
        assert_eq!(auto.pass_tokens(), vec![(Backend::Grouped, t)]);
        // GEMM1 [E, 2I, H] and GEMM2 [E, H, I] over T·k rows: the sizing's workspace is the SM100 plans'.
        let want = sm100_workspace(256, 4096, 7168, t * 8).max(sm100_workspace(256, 7168, 2048, t * 8));
        assert_eq!(auto.needs().workspace_bytes, want, "T = {t}");
        // The footprint reports that workspace.
        let fp = auto.needs().footprint();
        let ws = fp.parts.iter().find(|(p, _)| p.contains("workspace")).map(|(_, b)| *b);
        assert_eq!(ws, Some(want), "T = {t}: {:?}", fp.parts);
        // The activations and intermediates are the SM90 layer's: same operands, same quantisation.
        let sm90 = fp8_on(&h200(), s, t, Backend::Grouped, None).unwrap();
        let (a, b) = (auto.needs(), sm90.needs());
        assert_eq!(
            (a.a_fp8_rows, a.h_fp8_rows, a.d1_rows, a.h_rows, a.d2_rows),
            (b.a_fp8_rows, b.h_fp8_rows, b.d1_rows, b.h_rows, b.d2_rows),
            "T = {t}"
        );
        // One SM100 plan per GEMM (one compiled configuration).
        let host = auto.plan_bytes(false).host;
        assert!(host > 0 && host < sm90.plan_bytes(false).host + 1024, "T = {t}: {host}");
    }
}

#[test]
fn on_a_b200_the_layout_and_decode_backends_plan_and_fused_is_refused_naming_both_arches() {
    let s = shape(64, 8, 1024, 512);
    for b in [Backend::Grouped, Backend::Contiguous, Backend::Masked, Backend::Batched] {
        let sz = fp8_on(&b200(), s, 64, b, None).unwrap();
        assert_eq!((sz.gemm(), sz.backends()), (LayerGemm::Sm100Fp8Blockwise, Backends::of(b)));
    }
    let layouts = Backends::of(Backend::Batched).with(Backend::Grouped).with(Backend::Contiguous).with(Backend::Masked);
    let all = fp8_on(&b200(), s, 64, Backend::Masked, Some(layouts)).unwrap();
    assert_eq!(all.backends(), layouts);
    assert!(all.needs().workspace_bytes > 0);
    for r in [fp8_on(&b200(), s, 64, Backend::Fused, None), fp8_on(&b200(), s, 64, Backend::Auto, Some(Backends::FP8))]
    {
        match r {
            Err(e @ Error::UnsupportedArch { required: "sm_90a", major: 10, minor: 0, .. }) => {
                let m = e.to_string();
                assert!(m.contains("fused backend") && m.contains("sm_90a") && m.contains("NVIDIA B200"), "{m}");
                assert!(m.contains("10.0") && m.contains("no SM100 form"), "{m}");
            }
            other => panic!("Fused on a B200: {other:?}"),
        }
    }
    // Eager has no FP8 form on any arch: the format's error, before the arch's.
    match fp8_on(&b200(), s, 64, Backend::Eager, None) {
        Err(Error::InvalidProblem(m)) => assert!(m.contains("Eager has no FP8 form"), "{m}"),
        other => panic!("Eager FP8 on a B200: {other:?}"),
    }
}

#[test]
fn on_an_h200_the_fp8_layer_keeps_the_sm90_plan_and_its_sizing() {
    let s = shape(64, 8, 1024, 512);
    for (t, backend, backends) in [
        (1usize, Backend::Auto, None),
        (4096, Backend::Auto, None),
        (64, Backend::Fused, None),
        (256, Backend::Masked, Some(Backends::FP8)),
    ] {
        let on = fp8_on(&h200(), s, t, backend, backends).unwrap();
        assert_eq!(on.gemm(), LayerGemm::Sm90Fp8Blockwise);
        // What the host-only constructor (SM90) sizes, byte for byte.
        let host = LayerSizing::new_fp8(s, t, backend, backends, None, false, 132).unwrap();
        assert_eq!(on, host, "T = {t} {backend}");
    }
    assert_eq!(fp8_on(&h200(), s, 4096, Backend::Auto, None).unwrap().backends(), Backends::FP8_AUTO);
    // SM90 and SM100 plans ask for different workspaces; each sizing holds its own arch's.
    let on_b = fp8_on(&b200(), s, 64, Backend::Grouped, None).unwrap().needs().workspace_bytes;
    assert_eq!(on_b, sm100_workspace(64, 1024, 1024, 512).max(sm100_workspace(64, 1024, 512, 512)));
    // Not the SM90 plans' at the B200's SM count: the SM100 plan's own query.
    let sm90_at_148 = LayerSizing::new_fp8(s, 64, Backend::Grouped, None, None, false, 148).unwrap();
    assert_ne!(on_b, sm90_at_148.needs().workspace_bytes);
}

#[test]
fn devices_without_the_kernels_are_refused_naming_the_backend() {
    let s = shape(64, 8, 1024, 512);
    // An A100 has no SASS of any family: refused at sizing, not at the first launch.
    match fp8_on(&DeviceInfo::described("NVIDIA A100", (8, 0), 108), s, 64, Backend::Grouped, None) {
        Err(e @ Error::UnsupportedArch { major: 8, .. }) => assert!(e.to_string().contains("grouped backend"), "{e}"),
        other => panic!("A100: {other:?}"),
    }
    // Dense bf16 layers run the SM100 bf16 GEMM under their layout backends on a B200; Fused (SM90 wgmma
    // gather/scatter GEMMs) is refused naming the backend and both arches; Auto runs Grouped.
    let dense = |b: Backend| {
        LayerSizing::for_device(&b200(), s, DType::BF16, WeightFormat::Dense, 64, b, None, None, None, false, None)
    };
    for b in [Backend::Grouped, Backend::Contiguous, Backend::Masked, Backend::Eager, Backend::Batched] {
        assert_eq!(dense(b).unwrap().gemm(), LayerGemm::Sm100Dense, "{b}");
    }
    assert_eq!(dense(Backend::Auto).unwrap().backends(), Backends::of(Backend::Grouped));
    match dense(Backend::Fused) {
        Err(e @ Error::UnsupportedArch { required: "sm_90a", .. }) => {
            assert!(e.to_string().contains("fused backend") && e.to_string().contains("10.0"), "{e}")
        }
        other => panic!("dense Fused on a B200: {other:?}"),
    }
    // f16: no SM100 f16 kernel is built, refused by name at sizing.
    let f16 = LayerSizing::for_device(
        &b200(),
        s,
        DType::F16,
        WeightFormat::Dense,
        64,
        Backend::Grouped,
        None,
        None,
        None,
        false,
        None,
    );
    match f16 {
        Err(e @ Error::KernelNotBuilt { .. }) => assert!(e.to_string().contains("grouped_gemm_sm100"), "{e}"),
        other => panic!("dense f16 Grouped on a B200: {other:?}"),
    }
}
