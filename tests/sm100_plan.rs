//! CPU tests of the SM100 side: plans made for described devices (no GPU): the SM100 grouped GEMM plans on a
//! B200 and refuses every other device naming both arches, the SM90 families refuse a B200, the plain families
//! (routing, layouts, ...) accept both, and the compiled configurations are what their names say (facts read
//! from the CUTLASS types). Nothing here runs a kernel: no SM100 kernel has run on hardware.

use half::{bf16, f16};
use moe_gemm::device::Arch;
use moe_gemm::device::KernelFamily;
use moe_gemm::dtype::DType;
use moe_gemm::kernels::grouped::{GroupedGemm, GroupedGemmShape};
use moe_gemm::kernels::grouped_fp8::{Fp8TileConfig, GroupedGemmFp8, GroupedGemmFp8Shape};
use moe_gemm::kernels::grouped_fp8_sm100::{Fp8Sm100Config, GroupedGemmFp8Sm100};
use moe_gemm::kernels::grouped_sm100::{GroupedGemmSm100, GroupedGemmSm100Options, Sm100TileConfig};
use moe_gemm::*;

fn b200() -> DeviceInfo {
    DeviceInfo::described("NVIDIA B200", (10, 0), 148)
}

fn h200() -> DeviceInfo {
    DeviceInfo::described("NVIDIA H200", (9, 0), 132)
}

#[test]
fn compute_capability_10_0_is_sm100_and_other_blackwells_are_not() {
    assert_eq!(Arch::from_compute_capability(10, 0), Some(Arch::Sm100));
    assert_eq!(Arch::Sm100.target(), "sm_100a");
    // sm_100a SASS does not run on 10.3 (B300) or 12.0 (RTX Blackwell).
    assert_eq!(Arch::from_compute_capability(10, 3), None);
    assert_eq!(Arch::from_compute_capability(12, 0), None);
}

#[test]
fn every_config_is_built_for_bf16_and_plans_on_a_b200() {
    let shape = GroupedGemmShape::new(256, 4096, 7168, 32768).unwrap();
    for c in Sm100TileConfig::ALL {
        assert!(c.is_built(DType::BF16), "{c} was not compiled");
        assert!(!c.is_built(DType::F16), "{c}: f16 is not compiled for SM100 yet");
        let opts = GroupedGemmSm100Options { config: Some(c), ..Default::default() };
        let plan = GroupedGemmSm100::<bf16>::for_device(b200(), shape, opts).unwrap();
        assert_eq!(plan.config(), c);
        // Our 7 per-group arrays (256 groups) plus CUTLASS's per-SM TMA descriptors (A, B, D: 128 B each).
        assert!(plan.workspace_bytes() > 7 * 256 * 8 + 148 * 3 * 128, "{c}: {}", plan.workspace_bytes());
        assert_eq!(plan.flops(10), 2.0 * 10.0 * 4096.0 * 7168.0);
        assert_eq!(Sm100TileConfig::from_name(c.name()), Some(c));
    }
}

#[test]
fn compiled_configs_are_1sm_umma_ptr_array_kernels_of_their_tile() {
    for c in Sm100TileConfig::ALL {
        let f = c.facts(DType::BF16).unwrap();
        assert_eq!(f.tile, c.tile(), "{c}");
        assert_eq!(f.cluster, c.cluster(), "{c}");
        assert_eq!(f.sms_per_mma, 1, "{c}: a 1SM schedule");
        assert!(f.umma_array_mainloop && f.ptr_array_epilogue, "{c}: {f:?}");
        assert!(f.stages >= 2, "{c}: {} stages", f.stages);
    }
    assert!(matches!(
        Sm100TileConfig::Mma1Sm128x256x64.facts(DType::F16),
        Err(Error::KernelNotBuilt { dtype: Some(DType::F16), .. })
    ));
}

#[test]
fn f16_is_not_built_for_sm100() {
    let shape = GroupedGemmShape::new(8, 256, 256, 64).unwrap();
    let err = GroupedGemmSm100::<f16>::for_device(b200(), shape, Default::default()).unwrap_err();
    assert!(matches!(err, Error::KernelNotBuilt { op: "grouped_gemm_sm100", dtype: Some(DType::F16), .. }), "{err:?}");
}

#[test]
fn the_sm100_gemm_refuses_other_devices_naming_both() {
    let shape = GroupedGemmShape::new(8, 256, 256, 64).unwrap();
    for dev in
        [h200(), DeviceInfo::described("NVIDIA A100", (8, 0), 108), DeviceInfo::described("NVIDIA B300", (10, 3), 148)]
    {
        let (name, (major, minor)) = (dev.name.clone(), dev.compute_capability);
        let err = GroupedGemmSm100::<bf16>::for_device(dev, shape, Default::default()).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::UnsupportedArch { required: "sm_100a", .. }), "{err:?}");
        assert!(msg.contains("grouped_gemm_sm100") && msg.contains(&name), "{msg}");
        assert!(msg.contains(&format!("{major}.{minor}")), "{msg}");
    }
}

#[test]
fn the_sm90_families_refuse_a_b200_naming_both() {
    let shape = GroupedGemmShape::new(8, 256, 256, 64).unwrap();
    let msg = GroupedGemm::<bf16>::for_device(b200(), shape, Default::default()).unwrap_err().to_string();
    assert!(msg.contains("sm_90a") && msg.contains("B200") && msg.contains("10.0"), "{msg}");
    let fp8 = GroupedGemmFp8Shape::new(8, 256, 256, 64).unwrap();
    let msg = GroupedGemmFp8::for_device(b200(), fp8, Default::default()).unwrap_err().to_string();
    assert!(msg.contains("sm_90a") && msg.contains("B200"), "{msg}");
    for f in [KernelFamily::GroupedGemmSm90, KernelFamily::GroupedGemmSm90Fp8, KernelFamily::FusedMoeSm90] {
        assert!(b200().require("op", f).is_err(), "{f}");
        assert!(h200().require("op", f).is_ok(), "{f}");
    }
}

#[test]
fn the_plain_families_run_on_either_arch() {
    for f in [
        KernelFamily::GroupedGemmMxPortable,
        KernelFamily::Routing,
        KernelFamily::Layouts,
        KernelFamily::Activation,
        KernelFamily::Decode,
        KernelFamily::Quant,
        KernelFamily::Runtime,
    ] {
        assert!(h200().require("op", f).is_ok(), "{f} on SM90");
        assert!(b200().require("op", f).is_ok(), "{f} on SM100");
        let err = DeviceInfo::described("NVIDIA A100", (8, 0), 108).require("router", f).unwrap_err().to_string();
        assert!(err.contains("sm_90 or sm_100") && err.contains("8.0"), "{err}");
    }
    // The library says the same per family.
    let archs = build_info::CUDA_ARCHS;
    assert!(archs.contains("grouped_gemm_sm100: sm_100a;"), "{archs}");
    assert!(archs.contains("routing: sm_90, sm_100, compute_90 (PTX)"), "{archs}");
}

#[test]
fn the_heuristic_takes_narrow_tiles_only_when_the_sms_would_idle() {
    // Decode on DeepSeek-V3's w13 (N 4096): 8 active experts x 16 tiles of 256 columns = 128 CTAs, more than
    // half of 148 SMs: the wide tile.
    assert_eq!(Sm100TileConfig::heuristic(256, 4096, 8, 148), Sm100TileConfig::Mma1Sm128x256x64);
    // One token of Mixtral (k = 2) on w2 (N 4096): 2 x 2 x 16 = 64 <= 148: narrow tiles, twice the CTAs.
    assert_eq!(Sm100TileConfig::heuristic(8, 4096, 2, 148), Sm100TileConfig::Mma1Sm128x128x64);
    assert_eq!(Sm100TileConfig::heuristic(8, 4096, 65536, 148), Sm100TileConfig::Mma1Sm128x256x64);
}

/// The block-scaled SM100 plans: every compiled pair of formats plans on a B200 with the configuration that says
/// so, and is refused on the H200 naming both arches; FP8 x NVFP4 and the other pairs without a kernel are
/// refused on any device, saying why; K and N must be whole multiples of 128 (the 4-bit operand's rule named
/// where it is CUTLASS's). Checked before anything is allocated.
#[test]
fn the_block_scaled_plans_take_their_pairs_and_refuse_the_rest() {
    use moe_gemm::kernels::grouped_mx::{GroupedGemmMx, MxConfig, MxFormat};
    use MxFormat::*;
    // The 1-SM configurations (the 2-SM ones: the next test).
    for c in MxConfig::ALL.into_iter().filter(|c| c.sms_per_mma() == 1) {
        assert!(c.is_built(), "{} was not compiled", c.name());
        let (a, b) = c.formats();
        assert_eq!(MxConfig::for_formats(a, b).unwrap(), c);
        let plan = GroupedGemmMx::for_device(b200(), a, b, 256, 4096, 7168, 4096).unwrap();
        assert_eq!(plan.config(), c);
        // Our 11 per-group arrays (13 with NVFP4's alphas) plus CUTLASS's per-SM TMA descriptors.
        let arrays = if a == Nvfp4 { 13 } else { 11 };
        assert!(plan.workspace_bytes() > arrays * 256 * 8, "{}: {}", c.name(), plan.workspace_bytes());
        let e = GroupedGemmMx::for_device(h200(), a, b, 256, 4096, 7168, 4096).unwrap_err();
        assert!(matches!(e, Error::UnsupportedArch { required: "sm_100a", .. }), "{e:?}");
        assert!(e.to_string().contains("H200") && e.to_string().contains("9.0"), "{e}");
    }
    assert_eq!(MxConfig::Mxf4Mma1Sm128x128x256.tile(), (128, 128, 256));
    assert_eq!(MxConfig::Nvf4Mma1Sm128x128x256.formats(), (Nvfp4, Nvfp4));
    assert_eq!((Nvfp4.block(), Mxfp4.block(), Mxfp8.bits(), Nvfp4.bits()), (16, 32, 8, 4));
    // FP8 x NVFP4: the CUTLASS 4.2 builder has none; refused on a B200 and the H200 alike, before the arch.
    for dev in [b200(), h200()] {
        let e = GroupedGemmMx::for_device(dev, Mxfp8, Nvfp4, 8, 256, 256, 64).unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, Error::KernelNotBuilt { .. }), "{e:?}");
        assert!(m.contains("CUTLASS 4.2 builder refuses FP8 x NVFP4") && m.contains("kind::mxf8f6f4"), "{m}");
    }
    for (a, b) in [(Nvfp4, Mxfp4), (Mxfp4, Nvfp4), (Nvfp4, Mxfp8)] {
        let m = GroupedGemmMx::for_device(b200(), a, b, 8, 256, 256, 64).unwrap_err().to_string();
        assert!(m.contains("different scale types"), "{a:?} x {b:?}: {m}");
    }
    let m = GroupedGemmMx::for_device(b200(), Mxfp4, Mxfp8, 8, 256, 256, 64).unwrap_err().to_string();
    assert!(m.contains("not compiled"), "{m}");
    // Whole 128s of K and N, for every pair; the FP8 x FP4 message names CUTLASS's 4-bit rule.
    for c in MxConfig::ALL.into_iter().filter(|c| c.sms_per_mma() == 1) {
        let (a, b) = c.formats();
        for (n, k) in [(256, 2880), (256, 64), (192, 256), (0, 256), (256, 0)] {
            let e = GroupedGemmMx::for_device(b200(), a, b, 8, n, k, 64).unwrap_err().to_string();
            assert!(e.contains("is not a positive multiple of 128"), "{} [{n}, {k}]: {e}", c.name());
        }
    }
    let e = GroupedGemmMx::for_device(b200(), Mxfp8, Mxfp4, 128, 5760, 2880, 64).unwrap_err().to_string();
    assert!(e.contains("K = 2880") && e.contains("4-bit operand under kind::mxf8f6f4"), "{e}");
    let e = GroupedGemmMx::for_device(b200(), Nvfp4, Nvfp4, 8, 256, 80, 64).unwrap_err().to_string();
    assert!(e.contains("4 x 16 scale atoms"), "{e}");
}

/// The SM100 FP8 blockwise plan: the one compiled configuration plans on a B200 from the SM90 plan's shape type
/// (so with the same rules, checked before any launch) and is what its name says (facts read from the CUTLASS
/// types: K-major 1x128 / 128x128 scales, two-level accumulation promoted every 128 of K, no FastAccum); the
/// H200 and the other devices are refused naming both arches.
#[test]
fn the_sm100_fp8_blockwise_plan_takes_the_sm90_operands_on_a_b200_only() {
    let c = Fp8Sm100Config::Blockwise1Sm128x128x128;
    assert!(c.is_built(), "{c} was not compiled");
    assert_eq!(Fp8Sm100Config::from_name(c.name()), Some(c));
    let f = c.facts().unwrap();
    assert_eq!(f.schedule, "KernelPtrArrayTmaWarpSpecializedBlockwise1SmSm100");
    assert_eq!(f.tile, (128, 128, 128));
    assert_eq!((f.scale_block_a, f.scale_block_b, f.scales_k_major), ((1, 128), (128, 128), (true, true)));
    assert!(f.two_level_accumulation && !f.fast_accumulation && f.promotion_k == 128, "{f:?}");
    assert!(f.stages >= 2, "{f:?}");

    let shape = GroupedGemmFp8Shape::new(256, 4096, 7168, 4096).unwrap();
    let plan = GroupedGemmFp8Sm100::for_device(b200(), shape).unwrap();
    assert_eq!((plan.config(), plan.shape()), (c, &shape));
    // Our 11 per-group arrays (256 groups) plus CUTLASS's workspace.
    assert!(plan.workspace_bytes() > 11 * 256 * 8, "{}", plan.workspace_bytes());
    assert_eq!(plan.flops(10), 2.0 * 10.0 * 4096.0 * 7168.0);
    // The SM90 plan of the same shape refuses the B200: one shape, one plan type per arch.
    assert!(matches!(
        GroupedGemmFp8::for_device(b200(), shape, Default::default()),
        Err(Error::UnsupportedArch { required: "sm_90a", .. })
    ));

    for dev in
        [h200(), DeviceInfo::described("NVIDIA A100", (8, 0), 108), DeviceInfo::described("NVIDIA B300", (10, 3), 148)]
    {
        let (name, (major, minor)) = (dev.name.clone(), dev.compute_capability);
        let err = GroupedGemmFp8Sm100::for_device(dev, shape).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::UnsupportedArch { required: "sm_100a", .. }), "{err:?}");
        assert!(msg.contains("grouped_gemm_sm100_fp8_blockwise") && msg.contains(&name), "{msg}");
        assert!(msg.contains(&format!("{major}.{minor}")), "{msg}");
    }
    // The shape rules are the SM90 kernel's: N whole 128-blocks, K a multiple of 16.
    for (n, k) in [(192, 256), (256, 200)] {
        assert!(matches!(GroupedGemmFp8Shape::new(8, n, k, 64), Err(Error::InvalidProblem(_))), "[{n}, {k}]");
    }
}

/// The 2-SM block-scaled configuration (MXFP8 x MXFP8; none for MXFP8 x MXFP4 and for the 4-bit
/// pairs, which take their 1-SM kernel at every size): each
/// is compiled, is what its name says (256-row MMA tile over two SMs of a 2x1 cluster), is the plan's default on a
/// B200 exactly when N is whole 256s and the rows per group fill a 256-row tile, can be forced on or off with
/// `with_config`, and is refused where N is not a multiple of 256 or the formats differ, naming the rule. On the
/// H200 every pair is refused with `UnsupportedArch` before a configuration is chosen.
#[test]
fn the_2sm_block_scaled_configs_are_picked_for_prefill_and_refused_by_name() {
    use moe_gemm::kernels::grouped_mx::{GroupedGemmMx, MxConfig, MxFormat};
    use MxFormat::*;
    let two: Vec<MxConfig> = MxConfig::ALL.into_iter().filter(|c| c.sms_per_mma() == 2).collect();
    assert_eq!(two.len(), 1, "{two:?}");
    for (a, b) in [(Mxfp8, Mxfp4), (Mxfp4, Mxfp4), (Nvfp4, Nvfp4)] {
        assert_eq!(MxConfig::two_sm(a, b), None, "no 2-SM {a:?} x {b:?} is compiled");
        let big = GroupedGemmMx::for_device(b200(), a, b, 8, 4096, 7168, 4096 * 8).unwrap();
        assert_eq!(big.config(), MxConfig::for_formats(a, b).unwrap(), "{a:?} x {b:?}: the 1-SM kernel at prefill");
    }
    let (g, n, k) = (8, 4096, 7168);
    for c in two {
        let (a, b) = c.formats();
        assert!(c.is_built(), "{} was not compiled", c.name());
        assert_eq!((c.tile().0, c.tile().1, c.cluster()), (256, 256, (2, 1)), "{}", c.name());
        assert!(c.name().contains("-2sm-256x256x"), "{}", c.name());
        assert_eq!(MxConfig::from_name(c.name()), Some(c));
        assert_eq!(MxConfig::two_sm(a, b), Some(c));
        let one = MxConfig::for_formats(a, b).unwrap();
        assert_eq!((one.sms_per_mma(), one.cluster(), one.tile().0), (1, (1, 1), 128), "{}", one.name());
        // The default: 2-SM from 256 rows per group (max_rows / groups) with N in 256s, 1-SM below.
        let prefill = GroupedGemmMx::for_device(b200(), a, b, g, n, k, 256 * g).unwrap();
        assert_eq!(prefill.config(), c);
        assert!(prefill.workspace_bytes() > 11 * g * 8, "{}: {}", c.name(), prefill.workspace_bytes());
        let decode = GroupedGemmMx::for_device(b200(), a, b, g, n, k, 256 * g - 1).unwrap();
        assert_eq!(decode.config(), one);
        assert_eq!(GroupedGemmMx::for_device(b200(), a, b, g, 384, k, 4096 * g).unwrap().config(), one, "N = 384");
        // Forced either way.
        assert_eq!(decode.with_config(c).unwrap().config(), c);
        assert_eq!(prefill.with_config(one).unwrap().config(), one);
        // N = 384: whole 128s (the 1-SM tile) but not whole 256s: the 2-SM configuration refuses it by name.
        let narrow = GroupedGemmMx::for_device(b200(), a, b, g, 384, k, 4096 * g).unwrap();
        let e = narrow.with_config(c).unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, Error::InvalidProblem(_)), "{e:?}");
        assert!(m.contains("N = 384 is not a multiple of 256") && m.contains(c.name()) && m.contains("2 SMs"), "{m}");
        // The H200: refused naming both arches, whatever the shape.
        let e = GroupedGemmMx::for_device(h200(), a, b, g, n, k, 256 * g).unwrap_err();
        assert!(matches!(e, Error::UnsupportedArch { required: "sm_100a", .. }), "{e:?}");
        assert!(e.to_string().contains("H200"), "{e}");
    }
    // A configuration of other formats than the plan's.
    let plan = GroupedGemmMx::for_device(b200(), Mxfp8, Mxfp4, g, n, k, 256 * g).unwrap();
    assert_eq!(plan.config(), MxConfig::Mxf8f4Mma1Sm128x128x128, "MXFP8 x MXFP4 stays 1-SM");
    let m = plan.with_config(MxConfig::Mxf8Mma2Sm256x256x128).unwrap_err().to_string();
    assert!(m.contains("planned for Mxfp8 x Mxfp4") && m.contains("mxf8-2sm-256x256x128 takes Mxfp8 x Mxfp8"), "{m}");
}

/// The SM100 FP8 blockwise 2-SM configuration: compiled, its facts read from the CUTLASS types (the
/// Blockwise2SmSm100 schedule, a 256x128x128 MMA over two SMs of a 2x1 cluster, the 1-SM kernel's scale blocks,
/// promotion and accumulation), the default from 256 rows per group, forced either way with `with_config`, and
/// on the H200 refused with `UnsupportedArch` before a configuration is chosen.
#[test]
fn the_sm100_fp8_blockwise_2sm_config_is_picked_for_prefill() {
    let (one, two) = (Fp8Sm100Config::Blockwise1Sm128x128x128, Fp8Sm100Config::Blockwise2Sm256x128x128);
    assert!(two.is_built(), "{two} was not compiled");
    assert_eq!(Fp8Sm100Config::from_name("fp8-sm100-2sm-256x128x128"), Some(two));
    let f = two.facts().unwrap();
    assert_eq!(f.schedule, "KernelPtrArrayTmaWarpSpecializedBlockwise2SmSm100");
    assert_eq!((f.tile, f.cluster, f.sms_per_mma), ((256, 128, 128), (2, 1), 2), "{f:?}");
    assert_eq!((two.tile(), two.cluster(), two.sms_per_mma()), ((256, 128, 128), (2, 1), 2));
    assert_eq!((f.scale_block_a, f.scale_block_b, f.scales_k_major), ((1, 128), (128, 128), (true, true)));
    assert!(f.two_level_accumulation && !f.fast_accumulation && f.promotion_k == 128 && f.stages >= 2, "{f:?}");
    let f1 = one.facts().unwrap();
    assert_eq!((f1.tile, f1.cluster, f1.sms_per_mma), ((128, 128, 128), (1, 1), 1), "{f1:?}");
    // The SM90 configurations say one SM per MMA, cluster 1x1.
    for c in Fp8TileConfig::ALL {
        let f = c.facts().unwrap();
        assert_eq!((f.cluster, f.sms_per_mma), (c.cluster(), 1), "{c}");
    }

    let g = 8;
    let prefill = GroupedGemmFp8Shape::new(g, 4096, 7168, 256 * g).unwrap();
    let decode = GroupedGemmFp8Shape::new(g, 4096, 7168, 256 * g - 1).unwrap();
    assert_eq!((Fp8Sm100Config::default_for(&prefill), Fp8Sm100Config::default_for(&decode)), (two, one));
    let plan = GroupedGemmFp8Sm100::for_device(b200(), prefill).unwrap();
    assert_eq!(plan.config(), two);
    assert!(plan.workspace_bytes() > 11 * g * 8, "{}", plan.workspace_bytes());
    let plan = plan.with_config(one).unwrap();
    assert_eq!(plan.config(), one);
    let small = GroupedGemmFp8Shape::new(g, 128, 16, 8).unwrap();
    assert_eq!(GroupedGemmFp8Sm100::for_device(b200(), small).unwrap().with_config(two).unwrap().config(), two);

    let e = GroupedGemmFp8Sm100::for_device(h200(), prefill).unwrap_err();
    assert!(matches!(e, Error::UnsupportedArch { required: "sm_100a", .. }), "{e:?}");
    assert!(e.to_string().contains("H200") && e.to_string().contains("grouped_gemm_sm100_fp8_blockwise"), "{e}");
}
