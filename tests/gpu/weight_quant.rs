//! The 128 x 128 weight block quantiser on the GPU (`quant::quantize_weights`, `Fp8BlockWeights::quantize_device`)
//! against the host's `BlockFp8::quantize`, bit for bit: every kind of block (random, zero, -0, huge, wide,
//! subnormal, tiny, the smallest UE8M0, ties) on edge-block shapes, both scale formats, bf16 and f16, the scalar
//! path, non-finite weights, a graph replay, and whole experts against the host conversion.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::{bf16, f16};
use moe_gemm::checkpoint::{Fp8Config, PackedFp8Experts};
use moe_gemm::dtype::{DType, Element};
use moe_gemm::layer::GateUp;
use moe_gemm::quant::{quantize_weights, BlockFp8, BlockShape, Fp8BlockWeights, GroupQuant, ScaleFormat, F8E4M3};
use moe_gemm::status::bits;
use moe_gemm::*;

use crate::common::*;
use crate::quant::{f32s, status_word};

/// What fills one 128 x 128 block of a test weight (`corner`: the block's first element, where a kind pins its
/// amax).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Block {
    /// Uniform in ±3.
    Random,
    /// All +0: scale 1.
    Zero,
    /// All −0: scale 1, q 0x80.
    NegZero,
    /// Up to the dtype's largest finite value, which the corner holds.
    Huge,
    /// Magnitudes 2^-20 .. 2^20 (f16: .. 2^14, below its largest finite value; many e4m3 subnormals and zeros).
    Wide,
    /// The dtype's subnormals only, bits up to 0x40, which the corner holds: for bf16 amax = 2^-127, whose f32
    /// scale `amax / 448` is subnormal and rounds down, so the corner's `|w| / scale` is 448.01 and saturates.
    /// bf16 under UE8M0: the host refuses this block (its scale would be below 2^-127).
    Subnormal,
    /// bf16: below 2^-118 (corner 0.9 · 2^-118): a subnormal f32 scale in (2^-127, 2^-126), UE8M0 2^-126.
    TinyNormal,
    /// bf16: amax exactly 2^-119: f32 scale in (2^-128, 2^-127], UE8M0 2^-127, the smallest UE8M0.
    SmallestUe8m0,
    /// Integers in ±448, corner 448: scale 1 (both formats), so many quotients are e4m3 ties (17 → 16, 19 → 20).
    Ties,
}

const BLOCKS: [Block; 9] = [
    Block::Random,
    Block::Zero,
    Block::NegZero,
    Block::Huge,
    Block::Wide,
    Block::Subnormal,
    Block::TinyNormal,
    Block::SmallestUe8m0,
    Block::Ties,
];

fn block_value<T: Element>(kind: Block, rng: &mut Rng, corner: bool) -> T {
    let bf = T::DTYPE == DType::BF16;
    let u = rng.unit();
    let pin = |m: f32, at: f32| T::from_f32(if corner { at * m } else { u * m });
    match kind {
        Block::Random => T::from_f32(u * 3.0),
        Block::Zero => T::from_f32(0.0),
        Block::NegZero => T::from_bits(0x8000),
        Block::Huge => {
            let max = T::from_bits(if bf { 0x7F7F } else { 0x7BFF });
            if corner {
                max
            } else {
                T::from_f32(u * max.to_f32())
            }
        }
        // f16 tops out at 65504: its exponents stop at 2^14 (|u| < 3), bf16's at 2^20.
        Block::Wide => T::from_f32(u * 2f32.powi(rng.below(if bf { 41 } else { 35 }) as i32 - 20)),
        Block::Subnormal => {
            let bits = if corner { 0x40 } else { rng.below(0x41) as u16 };
            T::from_bits(bits | if u < 0.0 { 0x8000 } else { 0 })
        }
        Block::TinyNormal => pin(if bf { 2f32.powi(-118) } else { 2f32.powi(-14) }, 0.9),
        Block::SmallestUe8m0 => pin(if bf { 2f32.powi(-119) } else { 2f32.powi(-10) }, 1.0),
        Block::Ties => T::from_f32(if corner { 448.0 } else { (u * 448.0).round() }),
    }
}

/// Weights `[experts, n, k]`, block `b` (row-major over every expert's `[ceil(n/128), ceil(k/128)]` grid, expert
/// by expert) filled as `kind(b)` says.
fn block_weights<T: Element>(experts: usize, n: usize, k: usize, seed: u64, kind: impl Fn(usize) -> Block) -> Vec<T> {
    let (gn, gk) = (n.div_ceil(128), k.div_ceil(128));
    let mut rng = Rng(seed);
    (0..experts * n * k)
        .map(|i| {
            let (e, r, c) = (i / (n * k), i / k % n, i % k);
            block_value(kind((e * gn + r / 128) * gk + c / 128), &mut rng, r % 128 == 0 && c % 128 == 0)
        })
        .collect()
}

/// The host quantiser's bits of each expert of `w [experts, n, k]`: (e4m3 bytes, f32 scale bits; UE8M0 as its
/// f32 value, as `Fp8BlockWeights` holds it).
fn host_weight_bits<T: Element>(
    w: &[T],
    experts: usize,
    n: usize,
    k: usize,
    format: ScaleFormat,
) -> Result<(Vec<u8>, Vec<u32>)> {
    let (mut q, mut s) = (Vec::new(), Vec::new());
    for e in 0..experts {
        let m = BlockFp8::quantize(&f32s(&w[e * n * k..(e + 1) * n * k]), n, k, BlockShape::DEEPSEEK, format)?;
        q.extend(m.q().iter().map(|v| v.to_bits()));
        s.extend((0..m.scales().len()).map(|i| m.scales().get(i).expect("in the grid").to_bits()));
    }
    Ok((q, s))
}

fn device_weight_bits(stream: &Arc<CudaStream>, w: &Fp8BlockWeights) -> (Vec<u8>, Vec<u32>) {
    let q = stream.clone_dtoh(&w.q()).unwrap().iter().map(|v| v.to_bits()).collect();
    let s = stream.clone_dtoh(&w.scales()).unwrap().iter().map(|v| v.to_bits()).collect();
    (q, s)
}

/// Device bits against expected bits of `[experts, n, k]` weights: `Err` names the first differing scale (expert,
/// block) or element (expert, row, column), skipping the elements `skip` names.
fn same_weight_bits(
    got: &(Vec<u8>, Vec<u32>),
    want: &(Vec<u8>, Vec<u32>),
    (n, k): (usize, usize),
    skip: impl Fn(usize) -> bool,
) -> Result<(), String> {
    let (gn, gk) = (n.div_ceil(128), k.div_ceil(128));
    assert_eq!((got.0.len(), got.1.len()), (want.0.len(), want.1.len()), "lengths");
    if let Some(i) = (0..want.1.len()).find(|&i| got.1[i] != want.1[i]) {
        return Err(format!(
            "expert {} block [{}, {}]: scale {:e} ({:#010x}), expected {:e} ({:#010x})",
            i / (gn * gk),
            i / gk % gn,
            i % gk,
            f32::from_bits(got.1[i]),
            got.1[i],
            f32::from_bits(want.1[i]),
            want.1[i]
        ));
    }
    if let Some(i) = (0..want.0.len()).find(|&i| !skip(i) && got.0[i] != want.0[i]) {
        return Err(format!(
            "expert {} element [{}, {}]: e4m3 {:#04x}, expected {:#04x}",
            i / (n * k),
            i / k % n,
            i % k,
            got.0[i],
            want.0[i]
        ));
    }
    Ok(())
}

/// Bits of `w [experts, n, k]` quantised on the device in `format`, and the status word it left.
fn device_quantise<T: Element>(
    stream: &Arc<CudaStream>,
    w: &CudaSlice<T>,
    (experts, n, k): (usize, usize, usize),
    format: ScaleFormat,
) -> ((Vec<u8>, Vec<u32>), u32) {
    let mut st = DeviceStatus::new(stream).unwrap();
    let out = Fp8BlockWeights::quantize_device(stream, &w.as_view(), experts, n, k, format, &mut st).unwrap();
    assert_eq!((out.experts(), out.n(), out.k()), (experts, n, k));
    assert_eq!(out.scale_grid(), (n.div_ceil(128), k.div_ceil(128)));
    let word = status_word(st.check(stream));
    (device_weight_bits(stream, &out), word)
}

fn weights_match_host<T: Element>(stream: &Arc<CudaStream>) {
    // 2 experts of [200, 328]: 2 x 3 blocks each, the last row of blocks 72 rows, the last column 72 columns; every
    // kind lands on an edge block somewhere. (3, 130, 202): k % 8 != 0, the scalar path.
    for (experts, n, k) in [(2usize, 200usize, 328usize), (3, 130, 202), (1, 128, 128), (2, 1, 1)] {
        for format in [ScaleFormat::F32, ScaleFormat::Ue8m0] {
            let ctx = format!("{} [{experts}, {n}, {k}] {format:?}", T::DTYPE);
            // bf16's subnormal-only blocks have no UE8M0 scale on the host: take tiny normal ones instead (the
            // refused block has its own test below).
            let refused = T::DTYPE == DType::BF16 && format == ScaleFormat::Ue8m0;
            let kind = |b: usize| match BLOCKS[b % BLOCKS.len()] {
                Block::Subnormal if refused => Block::TinyNormal,
                kind => kind,
            };
            let w = block_weights::<T>(experts, n, k, (experts * n + k) as u64, kind);
            let want = host_weight_bits(&w, experts, n, k, format).unwrap_or_else(|e| panic!("{ctx}: host: {e}"));
            let w_dev = stream.clone_htod(&w).unwrap();
            let (got, word) = device_quantise(stream, &w_dev, (experts, n, k), format);
            assert_eq!(word, 0, "{ctx}: finite weights set no status bit");
            same_weight_bits(&got, &want, (n, k), |_| false).unwrap_or_else(|m| panic!("{ctx}: {m}"));
            if (experts, n, k) != (2, 200, 328) {
                continue;
            }
            // What the comparison covered: subnormal f32 scales (bf16), saturation, the all-zero blocks.
            let wf = f32s(&w);
            let (gn, gk) = (n.div_ceil(128), k.div_ceil(128));
            let scale_of = |i: usize| {
                let (e, r, c) = (i / (n * k), i / k % n, i % k);
                f32::from_bits(got.1[(e * gn + r / 128) * gk + c / 128])
            };
            let saturated = (0..wf.len())
                .filter(|&i| (wf[i] as f64 / scale_of(i) as f64).abs() > 448.0 && got.0[i] & 0x7F == 0x7E)
                .count();
            // Scales of at most 2^-126: subnormal f32 ones, and UE8M0's 2^-126 and 2^-127 (0x400000).
            let tiny_scales = got.1.iter().filter(|&&b| b <= 0x0080_0000).count();
            assert!(got.1.iter().filter(|&&b| b == 1f32.to_bits()).count() >= 3, "{ctx}: zero blocks have scale 1");
            assert!(got.0.contains(&0x80), "{ctx}: -0 stays -0");
            if T::DTYPE == DType::BF16 {
                assert!(tiny_scales >= 3, "{ctx}: {tiny_scales} scales of at most 2^-126");
                if format == ScaleFormat::F32 {
                    assert!(saturated >= 1, "{ctx}: a subnormal block's corner saturates");
                } else {
                    assert!(got.1.contains(&0x0040_0000), "{ctx}: the smallest UE8M0 scale, 2^-127");
                }
            }
        }
    }
}

/// The device quantiser gives the host quantiser's bits, e4m3 and scales, on every kind of block and shape.
#[test]
#[ignore = "needs an SM90 GPU"]
fn weight_block_quantisation_matches_the_host_quantiser_bit_for_bit() {
    let (_ctx, stream) = gpu();
    weights_match_host::<bf16>(&stream);
    weights_match_host::<f16>(&stream);
}

/// `w` with every bf16 subnormal replaced by 1/64, so that the host quantises it under UE8M0 too (a block of
/// subnormals only has no UE8M0 scale there: `ue8m0_blocks_below_the_smallest_scale_take_2_pow_minus_127`).
fn no_subnormals(mut w: Vec<bf16>) -> Vec<bf16> {
    for v in w.iter_mut().filter(|v| v.to_bits() & 0x7F80 == 0 && v.to_bits() & 0x7F != 0) {
        *v = bf16::from_f32(1.0 / 64.0);
    }
    w
}

/// The scalar path on misaligned views: a view starting one element into its buffer (k % 8 == 0 but w not 16-byte
/// aligned), quantised into weights whose buffers are whole allocations. Same bits as the host.
#[test]
#[ignore = "needs an SM90 GPU"]
fn misaligned_weight_views_take_the_scalar_path_with_the_same_bits() {
    let (_ctx, stream) = gpu();
    let (experts, n, k) = (2usize, 200usize, 328usize);
    let w = no_subnormals(block_weights::<bf16>(experts, n, k, 5, |b| BLOCKS[(b + 2) % BLOCKS.len()]));
    let padded = [vec![bf16::from_f32(9.0)], w.clone()].concat();
    let buf = stream.clone_htod(&padded).unwrap();
    for format in [ScaleFormat::F32, ScaleFormat::Ue8m0] {
        let mut st = DeviceStatus::new(&stream).unwrap();
        let mut out = Fp8BlockWeights::zeros(&stream, experts, n, k).unwrap();
        quantize_weights(&stream, &buf.slice(1..), format, &mut out, &mut st).unwrap();
        st.check(&stream).unwrap();
        let want = host_weight_bits(&w, experts, n, k, format).unwrap();
        same_weight_bits(&device_weight_bits(&stream, &out), &want, (n, k), |_| false)
            .unwrap_or_else(|m| panic!("{format:?}: {m}"));
    }
}

/// bf16 blocks of subnormals only under UE8M0: the host refuses them (no UE8M0 ceiling of a scale below 2^-128);
/// the device takes 2^-127, the smallest UE8M0, and `e4m3(w / 2^-127)`. Every other block is the host's.
#[test]
#[ignore = "needs an SM90 GPU"]
fn ue8m0_blocks_below_the_smallest_scale_take_2_pow_minus_127() {
    let (_ctx, stream) = gpu();
    let (experts, n, k) = (2usize, 200usize, 328usize);
    let (gn, gk) = (n.div_ceil(128), k.div_ceil(128));
    // Blocks 1, 5 and 9: an interior block and the corner block of expert 0, an edge-row block of expert 1.
    let sub = |b: usize| b % 4 == 1;
    let kind = |b: usize| match BLOCKS[b % BLOCKS.len()] {
        _ if sub(b) => Block::Subnormal,
        Block::Subnormal => Block::TinyNormal,
        kind => kind,
    };
    let w = block_weights::<bf16>(experts, n, k, 77, kind);
    let e = host_weight_bits(&w, experts, n, k, ScaleFormat::Ue8m0).unwrap_err().to_string();
    assert!(e.contains("outside 2^-127"), "the host refuses the block: {e}");
    let block_of = |i: usize| ((i / (n * k)) * gn + i / k % n / 128) * gk + i % k / 128;
    // The host's bits of every other block: the refused blocks zeroed, their expected bits put in by hand.
    let others: Vec<bf16> =
        w.iter().enumerate().map(|(i, &v)| if sub(block_of(i)) { bf16::from_f32(0.0) } else { v }).collect();
    let mut want = host_weight_bits(&others, experts, n, k, ScaleFormat::Ue8m0).unwrap();
    let smallest = 2f32.powi(-127);
    assert_eq!(smallest.to_bits(), 0x0040_0000);
    for (b, s) in want.1.iter_mut().enumerate().filter(|(b, _)| sub(*b)) {
        assert_eq!(*s, 1f32.to_bits(), "block {b} zeroed");
        *s = smallest.to_bits();
    }
    for (i, q) in want.0.iter_mut().enumerate().filter(|(i, _)| sub(block_of(*i))) {
        *q = F8E4M3::from_f32(w[i].to_f32() / smallest).to_bits();
    }
    let w_dev = stream.clone_htod(&w).unwrap();
    let (got, word) = device_quantise(&stream, &w_dev, (experts, n, k), ScaleFormat::Ue8m0);
    assert_eq!(word, 0, "a refused-on-the-host block is no device error");
    same_weight_bits(&got, &want, (n, k), |_| false).unwrap_or_else(|m| panic!("{m}"));
    // Nothing saturates at 2^-127: |w| <= 2^-127 gives quotients <= 1.
    assert!(got.0.iter().enumerate().filter(|(i, _)| sub(block_of(*i))).all(|(_, q)| q & 0x7F <= 0x38));
}

/// NaN and ±∞ weights, which the host refuses, set NONFINITE_INPUT; they become the e4m3 NaN with their sign,
/// the rest of their blocks is quantised by the scale of the finite elements (the host's bits of the same weights
/// with those elements zeroed), every other block as usual.
#[test]
#[ignore = "needs an SM90 GPU"]
fn non_finite_weights_are_flagged_and_become_e4m3_nan() {
    let (_ctx, stream) = gpu();
    let (experts, n, k) = (2usize, 200usize, 328usize);
    for format in [ScaleFormat::F32, ScaleFormat::Ue8m0] {
        let w = no_subnormals(block_weights(experts, n, k, 13, |b| BLOCKS[(b * 5) % BLOCKS.len()]));
        // (expert, row, col): a NaN and a −NaN in an interior block, +∞ and −∞ in an edge block, a NaN alone in
        // the corner block of expert 1 (whose other elements keep their scale).
        let bad = [
            ((0usize, 3usize, 7usize), bf16::NAN),
            ((0, 100, 120), -bf16::NAN),
            ((0, 150, 300), bf16::INFINITY),
            ((0, 199, 327), bf16::NEG_INFINITY),
            ((1, 199, 327), bf16::NAN),
        ];
        let index = |(e, r, c): (usize, usize, usize)| (e * n + r) * k + c;
        let mut poisoned = w.clone();
        for (at, v) in bad {
            poisoned[index(at)] = v;
        }
        let e = host_weight_bits(&poisoned, experts, n, k, format).unwrap_err().to_string();
        assert!(e.contains("not finite"), "the host refuses non-finite weights: {e}");
        let mut zeroed = w.clone();
        for (at, _) in bad {
            zeroed[index(at)] = bf16::from_f32(0.0);
        }
        let want = host_weight_bits(&zeroed, experts, n, k, format).unwrap();
        let w_dev = stream.clone_htod(&poisoned).unwrap();
        let (got, word) = device_quantise(&stream, &w_dev, (experts, n, k), format);
        assert_eq!(word, bits::NONFINITE_INPUT, "{format:?}: the status names the non-finite input");
        let bad_at: Vec<usize> = bad.iter().map(|(at, _)| index(*at)).collect();
        same_weight_bits(&got, &want, (n, k), |i| bad_at.contains(&i)).unwrap_or_else(|m| panic!("{format:?}: {m}"));
        for (at, v) in bad {
            let nan = if v.is_sign_negative() { 0xFF } else { 0x7F };
            assert_eq!(got.0[index(at)], nan, "{format:?}: {at:?} = {v} becomes the e4m3 NaN with its sign");
        }
    }
}

/// The weight quantisation is graph-safe: captured once into preallocated weights, replayed with new bf16 weights
/// in the same buffer, equal to the host each time.
#[test]
#[ignore = "needs an SM90 GPU"]
fn weight_quantisation_replays_in_a_graph() {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let (_ctx, stream) = gpu();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let (experts, n, k) = (3usize, 384usize, 256usize);
    let mut w_dev: CudaSlice<bf16> = stream.alloc_zeros(experts * n * k).unwrap();
    let mut out = Fp8BlockWeights::zeros(&stream, experts, n, k).unwrap();
    stream.synchronize().unwrap();
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    quantize_weights(&stream, &w_dev.as_view(), ScaleFormat::Ue8m0, &mut out, &mut st).unwrap();
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("captured graph");
    for replay in 0..4u64 {
        let w = block_weights::<bf16>(experts, n, k, 200 + replay, |b| {
            [Block::Random, Block::Wide, Block::Huge, Block::Ties][(b + replay as usize) % 4]
        });
        stream.memcpy_htod(&w, &mut w_dev).unwrap();
        graph.launch().unwrap();
        st.check(&stream).unwrap();
        let want = host_weight_bits(&w, experts, n, k, ScaleFormat::Ue8m0).unwrap();
        same_weight_bits(&device_weight_bits(&stream, &out), &want, (n, k), |_| false)
            .unwrap_or_else(|m| panic!("replay {replay}: {m}"));
    }
}

/// A bf16 checkpoint's experts converted on the device (w13 `[E, 2I, H]` and w2 `[E, H, I]`, each one call) give
/// the FP8 layer exactly the weights of the host conversion (`PackedFp8Experts::quantize`, gate and up quantised
/// apart, then `Fp8ExpertWeights::upload`), for both DeepSeek configurations.
#[test]
#[ignore = "needs an SM90 GPU"]
fn device_converted_experts_equal_the_host_conversion() {
    let (_ctx, stream) = gpu();
    let (e, h, i) = (3usize, 384usize, 256usize);
    let w13 = block_weights::<bf16>(e, 2 * i, h, 31, |b| [Block::Random, Block::Wide, Block::Ties][b % 3]);
    let w2 = block_weights::<bf16>(e, h, i, 32, |b| [Block::Wide, Block::Random][b % 2]);
    let dense = PackedExperts::new(e, h, i, ExpertFormat::SWIGLU, w13.clone(), w2.clone(), None, None).unwrap();
    let (w13_dev, w2_dev) = (stream.clone_htod(&w13).unwrap(), stream.clone_htod(&w2).unwrap());
    for config in [Fp8Config::DEEPSEEK_V3, Fp8Config::DEEPSEEK_V3_1] {
        let host = PackedFp8Experts::quantize(&dense, &config).unwrap();
        let format = host.scale_format();
        let uploaded = Fp8ExpertWeights::upload(&stream, &host, ExpertFormat::SWIGLU).unwrap();
        let mut st = DeviceStatus::new(&stream).unwrap();
        let q13 = Fp8BlockWeights::quantize_device(&stream, &w13_dev.as_view(), e, 2 * i, h, format, &mut st).unwrap();
        let q2 = Fp8BlockWeights::quantize_device(&stream, &w2_dev.as_view(), e, h, i, format, &mut st).unwrap();
        st.check(&stream).unwrap();
        let quant = if format == ScaleFormat::Ue8m0 { GroupQuant::DEEPSEEK_UE8M0 } else { GroupQuant::DEEPSEEK };
        let converted = Fp8ExpertWeights::from_device(Activation::SiluGated, GateUp::Concatenated, q13, q2, None, None)
            .unwrap()
            .with_activation_quant(quant);
        assert_eq!(converted.activation_quant(), uploaded.activation_quant(), "{format:?}");
        for (name, got, want) in [("w13", converted.w13(), uploaded.w13()), ("w2", converted.w2(), uploaded.w2())] {
            let (n, k) = (got.n(), got.k());
            same_weight_bits(&device_weight_bits(&stream, got), &device_weight_bits(&stream, want), (n, k), |_| false)
                .unwrap_or_else(|m| panic!("{format:?} {name}: {m}"));
        }
    }
}

/// Inputs that do not fit are refused before anything is queued (or allocated): a view of another length, zero
/// extents; the status word stays clear.
#[test]
#[ignore = "needs an SM90 GPU"]
fn mismatched_weight_inputs_are_refused_before_launch() {
    let (_ctx, stream) = gpu();
    let mut st = DeviceStatus::new(&stream).unwrap();
    let w = stream.clone_htod(&vec![bf16::NAN; 2 * 200 * 328]).unwrap();
    let e =
        Fp8BlockWeights::quantize_device(&stream, &w.slice(1..), 2, 200, 328, ScaleFormat::F32, &mut st).unwrap_err();
    assert!(matches!(&e, Error::Buffer { name: "w", detail } if detail.contains("[2, 200, 328]")), "{e}");
    let e =
        Fp8BlockWeights::quantize_device(&stream, &w.as_view(), 0, 200, 328, ScaleFormat::F32, &mut st).unwrap_err();
    assert!(e.to_string().contains("positive"), "{e}");
    let mut other = Fp8BlockWeights::zeros(&stream, 2, 200, 320).unwrap();
    let e = quantize_weights(&stream, &w.as_view(), ScaleFormat::Ue8m0, &mut other, &mut st).unwrap_err();
    assert!(matches!(&e, Error::Buffer { name: "w", .. }), "{e}");
    assert!(Fp8BlockWeights::zeros(&stream, 2, 0, 320).is_err());
    st.check(&stream).unwrap(); // the NaN weights were never read
}
