//! The SM100 grouped GEMM on the GPU. On an SM100 device (B200, compute capability 10.0) each case poisons D
//! with NaN, launches every configuration, and compares every row with the CPU reference and the poison past the
//! groups. On any other device (the H200 these tests usually run on) it checks instead that the plan refuses
//! with `UnsupportedArch`, and prints a SKIP line for the correctness part: **no SM100 kernel has run yet**.

use crate::common::*;
use half::bf16;
use moe_gemm::device::Arch;
use moe_gemm::kernels::grouped::GroupedGemmShape;
use moe_gemm::kernels::grouped_fp8::{Fp8TileConfig, GroupedGemmFp8, GroupedGemmFp8Shape};
use moe_gemm::kernels::grouped_fp8_sm100::{Fp8Sm100Config, GroupedGemmFp8Sm100};
use moe_gemm::kernels::grouped_sm100::{GroupedGemmSm100, GroupedGemmSm100Options, Sm100TileConfig};
use moe_gemm::layouts::offsets_from_sizes;
use moe_gemm::reference::{first_mismatch, grouped_gemm_rows, Tolerance};
use moe_gemm::status::bits as error_bits;
use moe_gemm::*;

const GUARD: usize = 4096;

/// `true` on an SM100 device; elsewhere checks the refusal, says SKIP and returns `false`.
fn on_sm100(stream: &std::sync::Arc<cudarc::driver::CudaStream>, test: &str) -> bool {
    let info = DeviceInfo::query(stream.context()).unwrap();
    if info.arch == Some(Arch::Sm100) {
        return true;
    }
    let shape = GroupedGemmShape::new(4, 256, 256, 64).unwrap();
    let err = GroupedGemmSm100::<bf16>::new(stream, shape, Default::default()).unwrap_err();
    assert!(matches!(err, Error::UnsupportedArch { required: "sm_100a", .. }), "{err:?}");
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIP {test}: device 0 ({}, {}.{}) is not SM100; checked only that the SM100 plan refuses it",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1
    );
    false
}

fn run_sizes(name: &str, sizes: &[usize], n: usize, k: usize, spare_rows: usize) {
    let (_ctx, stream) = gpu();
    if !on_sm100(&stream, name) {
        return;
    }
    let total: usize = sizes.iter().sum();
    let max_rows = total + spare_rows;
    let g = sizes.len();
    let a_host = random_vec::<bf16>(max_rows * k, 1, 1.0);
    let b_host = random_vec::<bf16>(g * n * k, 2, 1.0);
    let a = stream.clone_htod(&a_host).unwrap();
    let b = stream.clone_htod(&b_host).unwrap();
    let offsets = stream.clone_htod(&offsets_from_sizes(sizes).unwrap()).unwrap();
    let rows: Vec<usize> = (0..total).collect();
    let reference = grouped_gemm_rows(&a_host, &b_host, sizes, n, k, &rows);
    let tol = Tolerance::for_output::<bf16>(reference.iter().fold(0f32, |m, x| m.max(x.abs())));
    let shape = GroupedGemmShape::new(g, n, k, max_rows).unwrap();
    for config in Sm100TileConfig::ALL {
        let opts = GroupedGemmSm100Options { config: Some(config), ..Default::default() };
        let plan = GroupedGemmSm100::<bf16>::new(&stream, shape, opts).unwrap();
        let mut ws = plan.alloc_workspace(&stream).unwrap();
        let mut st = DeviceStatus::new(&stream).unwrap();
        let mut d = stream.clone_htod(&vec![bf16::NAN; max_rows * n + GUARD]).unwrap();
        let mut d_view = d.slice_mut(0..max_rows * n);
        plan.launch(&stream, &a, &b, &offsets, &mut d_view, &mut ws, &mut st).unwrap();
        st.check(&stream).unwrap();
        let d_host = stream.clone_dtoh(&d).unwrap();
        let got: Vec<f32> = d_host[..total * n].iter().map(|x| x.to_f32()).collect();
        if let Some((i, g, r)) = first_mismatch(&got, &reference, tol) {
            panic!("{name} [{config}]: row {} col {}: got {g}, reference {r} ({tol:?})", i / n, i % n);
        }
        assert!(d_host[total * n..].iter().all(|x| x.is_nan()), "{name} [{config}]: wrote past offsets[G]");
    }
}

#[test]
#[ignore = "needs a GPU: an SM100 one for the correctness check, any other checks the refusal"]
fn sm100_boundary_group_sizes_every_config() {
    run_sizes("sm100 sizes 0,1,7,63,64,65,127,128,129", &[0, 1, 7, 63, 64, 65, 127, 128, 129], 256, 512, 5);
}

#[test]
#[ignore = "needs a GPU: an SM100 one for the correctness check, any other checks the refusal"]
fn sm100_partial_k_and_n_tiles() {
    // K 264: four 64-wide K tiles and a partial one; N 392: a partial 256- and 128-wide N tile.
    run_sizes("sm100 K 264, N 392", &[3, 130, 0, 257], 392, 264, 0);
}

#[test]
#[ignore = "needs a GPU: an SM100 one for the correctness check, any other checks the refusal"]
fn sm100_invalid_offsets_are_reported_and_contained() {
    let (_ctx, stream) = gpu();
    if !on_sm100(&stream, "sm100_invalid_offsets_are_reported_and_contained") {
        return;
    }
    let (g, n, k, max_rows) = (3usize, 64usize, 64usize, 20usize);
    let shape = GroupedGemmShape::new(g, n, k, max_rows).unwrap();
    let plan = GroupedGemmSm100::<bf16>::new(&stream, shape, Default::default()).unwrap();
    let mut ws = plan.alloc_workspace(&stream).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let a = stream.clone_htod(&random_vec::<bf16>(max_rows * k, 5, 1.0)).unwrap();
    let b = stream.clone_htod(&random_vec::<bf16>(g * n * k, 6, 1.0)).unwrap();
    let offsets = stream.clone_htod(&[0i32, 10, 5, 4000]).unwrap();
    let mut d = stream.clone_htod(&vec![bf16::NAN; max_rows * n + GUARD]).unwrap();
    plan.launch(&stream, &a, &b, &offsets, &mut d.slice_mut(0..max_rows * n), &mut ws, &mut st).unwrap();
    let want = error_bits::OFFSETS_NOT_MONOTONE | error_bits::OFFSETS_OUT_OF_RANGE;
    match st.check(&stream) {
        Err(Error::DeviceCheck { word, .. }) => assert_eq!(word & want, want, "word {word:#x}"),
        other => panic!("expected a device check error, got {other:?}"),
    }
    let d_host = stream.clone_dtoh(&d).unwrap();
    assert!(d_host[max_rows * n..].iter().all(|x| x.is_nan()), "the guard past D was written");
}

/// The SM100 block-scaled grouped GEMMs (MXFP8 x MXFP8, MXFP8 x MXFP4, MXFP4 x MXFP4, NVFP4 x NVFP4): on this
/// (SM90) device every plan is refused with `UnsupportedArch` naming the device, before anything is allocated or
/// queued; on an SM100 device they would plan (the CPU tests plan them for a B200's `DeviceInfo`), which is as
/// far as this project can take them without Blackwell hardware. FP8 x NVFP4 is refused everywhere, naming the
/// CUTLASS builder.
#[test]
#[ignore = "needs an SM90 GPU"]
fn mx_gemm_plans_are_refused_off_sm100() {
    use moe_gemm::kernels::grouped_mx::{GroupedGemmMx, MxConfig, MxFormat};
    let (ctx, stream) = gpu();
    let info = DeviceInfo::query(&ctx).unwrap();
    for c in MxConfig::ALL {
        let (a, b) = c.formats();
        match GroupedGemmMx::new(&stream, a, b, 256, 4096, 7168, 4096) {
            Err(e @ Error::UnsupportedArch { required: "sm_100a", .. }) if info.compute_capability.0 != 10 => {
                assert!(e.to_string().contains(&info.name), "{e}");
                println!("{}: refused as expected on {}: {e}", c.name(), info.name);
            }
            Ok(_) if info.compute_capability.0 == 10 => println!("{}: planned on {} (SM100)", c.name(), info.name),
            other => panic!("{} on {}: {other:?}", c.name(), info.name),
        }
    }
    let e = GroupedGemmMx::new(&stream, MxFormat::Mxfp8, MxFormat::Nvfp4, 8, 256, 256, 64).unwrap_err();
    assert!(matches!(e, Error::KernelNotBuilt { .. }) && e.to_string().contains("CUTLASS 4.2 builder"), "{e}");
}

/// The block-scaled launch checks its operands on the host before anything reaches the device: a plan made for a
/// (described) B200 and launched here with activations of another format, with A or B of another shape, or with
/// a short D is refused with the constraint named. (A launch that passed these checks would reach the SM100
/// kernel, which cannot run here: no case below does.)
#[test]
#[ignore = "needs an SM90 GPU"]
fn mx_gemm_launch_refuses_mismatched_operands_on_the_host() {
    use moe_gemm::kernels::grouped_mx::{GroupedGemmMx, MxFormat, MxRows, MxWeights};
    use moe_gemm::quant::mx::Nvfp4;
    use moe_gemm::quant::{Mxfp4Rows, Nvfp4Rows, Nvfp4Weights};
    let (_ctx, stream) = gpu();
    let b200 = DeviceInfo::described("NVIDIA B200 (described)", (10, 0), 148);
    let (g, n, k, max_rows) = (2usize, 128usize, 256usize, 64usize);
    let plan = GroupedGemmMx::for_device(b200, MxFormat::Nvfp4, MxFormat::Nvfp4, g, n, k, max_rows).unwrap();
    let mut ws = plan.alloc_workspace(&stream).unwrap();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let experts: Vec<Nvfp4> =
        (0..g).map(|e| Nvfp4::quantize_bf16(&random_vec::<bf16>(n * k, 30 + e as u64, 1.0), n, k).unwrap()).collect();
    let w = Nvfp4Weights::from_host(&stream, &experts).unwrap();
    assert_eq!(w.bytes(), g * n * k / 2 + g * 512 * (k / 64) + 4 * g);
    let offsets = stream.clone_htod(&[0i32, 10, 20]).unwrap();
    let mut d = stream.alloc_zeros::<bf16>(max_rows * n).unwrap();
    let mx = Mxfp4Rows::alloc(&stream, max_rows, k, g).unwrap();
    let e = plan.launch(&stream, MxRows::Mxfp4(&mx), MxWeights::Nvfp4(&w), &offsets, &mut d, &mut ws, &mut st);
    let e = e.unwrap_err().to_string();
    assert!(e.contains("planned for Nvfp4 x Nvfp4, launched with Mxfp4 x Nvfp4"), "{e}");
    let other_k = Nvfp4Rows::alloc(&stream, max_rows, 2 * k, g).unwrap();
    let e = plan.launch(&stream, MxRows::Nvfp4(&other_k), MxWeights::Nvfp4(&w), &offsets, &mut d, &mut ws, &mut st);
    assert!(e.unwrap_err().to_string().contains("MX operands: A [64, 512]"));
    let a = Nvfp4Rows::alloc(&stream, max_rows, k, g).unwrap();
    let mut short = stream.alloc_zeros::<bf16>(max_rows * n - 1).unwrap();
    let e = plan.launch(&stream, MxRows::Nvfp4(&a), MxWeights::Nvfp4(&w), &offsets, &mut short, &mut ws, &mut st);
    assert!(matches!(e, Err(Error::Buffer { name: "d", .. })), "{e:?}");
    st.check(&stream).unwrap();
}

/// The SM100 FP8 blockwise plan off SM100: on the H200 (SM90) it is refused with `UnsupportedArch` naming the
/// device and `sm_100a`, before anything is allocated or queued, while the SM90 plan of the same shape (the same
/// operands) plans. On an SM100 device it would plan instead (the CPU tests plan it for a B200's `DeviceInfo`);
/// no SM100 kernel has run on hardware.
#[test]
#[ignore = "needs an SM90 GPU"]
fn fp8_blockwise_sm100_plan_is_refused_off_sm100() {
    let (ctx, stream) = gpu();
    let info = DeviceInfo::query(&ctx).unwrap();
    let shape = GroupedGemmFp8Shape::new(256, 4096, 7168, 4096).unwrap();
    match GroupedGemmFp8Sm100::new(&stream, shape) {
        Err(e @ Error::UnsupportedArch { required: "sm_100a", .. }) if info.arch != Some(Arch::Sm100) => {
            let m = e.to_string();
            assert!(m.contains(&info.name) && m.contains("grouped_gemm_sm100_fp8_blockwise"), "{m}");
            println!("refused as expected on {}: {m}", info.name);
        }
        Ok(plan) if info.arch == Some(Arch::Sm100) => println!("planned on {} (SM100): {:?}", info.name, plan.config()),
        other => panic!("SM100 FP8 blockwise plan on {}: {other:?}", info.name),
    }
    if info.arch == Some(Arch::Sm90) {
        // The CUTLASS tiles hold their per-group arrays in a workspace; the swap-AB decode kernel needs none.
        let plan = GroupedGemmFp8::new(&stream, shape, Default::default()).unwrap();
        assert_eq!(plan.workspace_bytes() == 0, plan.config() == Fp8TileConfig::SwapAb16);
    }
}

/// The 2-SM plans (block-scaled MXFP8, MXFP4 and NVFP4 pairs; FP8 blockwise) off SM100: a prefill shape (256 rows
/// per group, N in whole 256s), for which a B200 would take the 2-SM configurations (CPU tests), is refused on
/// this (SM90) device with `UnsupportedArch` naming the device and `sm_100a`, before anything is allocated or
/// queued. On an SM100 device the plans take the 2-SM configurations instead; no SM100 kernel has run on
/// hardware.
#[test]
#[ignore = "needs an SM90 GPU"]
fn two_sm_plans_are_refused_off_sm100() {
    use moe_gemm::kernels::grouped_mx::{GroupedGemmMx, MxConfig};
    let (ctx, stream) = gpu();
    let info = DeviceInfo::query(&ctx).unwrap();
    let sm100 = info.arch == Some(Arch::Sm100);
    let (g, n, k) = (8usize, 4096usize, 7168usize);
    for c in MxConfig::ALL.into_iter().filter(|c| c.sms_per_mma() == 2) {
        let (a, b) = c.formats();
        match GroupedGemmMx::new(&stream, a, b, g, n, k, 256 * g) {
            Err(e @ Error::UnsupportedArch { required: "sm_100a", .. }) if !sm100 => {
                assert!(e.to_string().contains(&info.name), "{e}");
                println!("{}: refused as expected on {}: {e}", c.name(), info.name);
            }
            Ok(plan) if sm100 => assert_eq!(plan.config(), c, "{}", info.name),
            other => panic!("{} on {}: {other:?}", c.name(), info.name),
        }
    }
    let shape = GroupedGemmFp8Shape::new(g, n, k, 256 * g).unwrap();
    match GroupedGemmFp8Sm100::new(&stream, shape) {
        Err(e @ Error::UnsupportedArch { required: "sm_100a", .. }) if !sm100 => {
            let m = e.to_string();
            assert!(m.contains(&info.name) && m.contains("grouped_gemm_sm100_fp8_blockwise"), "{m}");
            println!("fp8-sm100-2sm-256x128x128: refused as expected on {}: {m}", info.name);
        }
        Ok(plan) if sm100 => assert_eq!(plan.config(), Fp8Sm100Config::Blockwise2Sm256x128x128),
        other => panic!("SM100 FP8 blockwise 2-SM plan on {}: {other:?}", info.name),
    }
}
