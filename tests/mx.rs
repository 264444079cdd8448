//! MX and NVFP4 formats on the CPU: every element and scale code, rounding, quantise → dequantise bounds, loud
//! failures, and the SM100 128 × 4 scale-factor atom layout against an independent index formula and CUTLASS's
//! probe values.

mod common;

use common::*;
use half::bf16;
use moe_gemm::quant::*;

fn p2(e: i32) -> f32 {
    2f32.powi(e)
}

// ---- e2m1 ----

#[test]
fn all_sixteen_e2m1_codes() {
    let want: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
    for code in 0..16u8 {
        let v = E2m1::from_bits(code).to_f32();
        // An independent decode: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0; exponent 0 subnormal.
        let (s, e, m) = (code >> 3, (code >> 1) & 3, code & 1);
        let mag = if e == 0 { 0.5 * m as f32 } else { (1.0 + 0.5 * m as f32) * p2(e as i32 - 1) };
        let decoded = if s == 1 { -mag } else { mag };
        assert_eq!(v.to_bits(), decoded.to_bits(), "code {code:#x}");
        assert_eq!(v.to_bits(), want[code as usize].to_bits(), "code {code:#x}");
        assert_eq!(v.to_bits(), FP4_LUT[code as usize].to_bits());
        assert_eq!(E2m1::from_f32(v).to_bits(), code, "{v} encodes back to its code");
        assert_eq!(E2m1::from_bits(code | 0xF0).to_bits(), code, "the high nibble is ignored");
    }
    assert_eq!(E2M1_MAX, 6.0);
}

#[test]
fn e2m1_rounds_to_nearest_even_and_saturates() {
    // Midpoints go to the even code: 0.25 → 0, 0.75 → 1 (code 2), 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4.
    for (x, want) in [
        (0.25, 0.0),
        (0.26, 0.5),
        (0.75, 1.0),
        (1.25, 1.0),
        (1.75, 2.0),
        (2.5, 2.0),
        (2.51, 3.0),
        (3.5, 4.0),
        (5.0, 4.0),
        (5.01, 6.0),
        (6.0, 6.0),
        (7.0, 6.0),
        (1e30, 6.0),
        (f32::INFINITY, 6.0),
        (-5.0, -4.0),
        (-0.75, -1.0),
        (-f32::INFINITY, -6.0),
    ] {
        assert_eq!(E2m1::from_f32(x).to_f32(), want, "{x}");
    }
    assert_eq!(E2m1::from_f32(-0.1).to_bits(), 8, "tiny negatives keep their sign");
    assert_eq!(E2m1::from_f32(f32::NAN).to_bits(), 7, "NaN: +6 (satfinite)");
    // Against brute force: the nearest value, ties to the even code.
    let mut rng = Rng(5);
    for _ in 0..20_000 {
        let x = rng.unit() * 7.0;
        let got = E2m1::from_f32(x);
        let best = (0..16u8)
            .filter(|c| (c >> 3 == 1) == x.is_sign_negative())
            .min_by(|&a, &b| {
                let (da, db) = ((FP4_LUT[a as usize] - x).abs(), (FP4_LUT[b as usize] - x).abs());
                da.partial_cmp(&db).unwrap().then((a % 2).cmp(&(b % 2)))
            })
            .unwrap();
        assert_eq!(got.to_f32(), FP4_LUT[best as usize], "{x}");
    }
}

#[test]
fn e2m1_pairs_pack_with_the_even_element_in_the_low_nibble() {
    let codes: Vec<E2m1> = [1u8, 7, 0xA, 0].into_iter().map(E2m1::from_bits).collect();
    assert_eq!(pack_e2m1(&codes).unwrap(), vec![0x71, 0x0A]);
    assert_eq!(unpack_e2m1(&[0x71, 0x0A]), codes);
    assert!(pack_e2m1(&codes[..3]).is_err());
}

// ---- scales ----

#[test]
fn ue4m3_codes_and_edges() {
    for b in 0..=0x7Eu8 {
        let s = Ue4m3::from_bits(b).unwrap();
        // float8's E4M3FN decoder is independent of ours.
        assert_eq!(s.to_f32(), F8E4M3::from_bits(b).to_f32(), "{b:#x}");
        assert_eq!(Ue4m3::from_f32_ceil(s.to_f32()).unwrap(), s, "{b:#x}: values are their own ceiling");
        assert_eq!(Ue4m3::from_f32_nearest(s.to_f32()).unwrap(), s);
        assert_eq!(s.to_bits(), b);
    }
    for (b, v) in
        [(0x00, 0.0), (0x01, p2(-9)), (0x07, 7.0 * p2(-9)), (0x08, p2(-6)), (0x38, 1.0), (0x7D, 416.0), (0x7E, 448.0)]
    {
        assert_eq!(Ue4m3::from_bits(b).unwrap().to_f32(), v, "{b:#x}");
    }
    assert_eq!(Ue4m3::ONE.to_f32(), 1.0);
    assert_eq!(Ue4m3::MAX.to_f32(), 448.0);
    for b in [0x7Fu8, 0x80, 0xB8, 0xFF] {
        assert!(Ue4m3::from_bits(b).is_err(), "{b:#x}: NaN or signed");
    }
    let ceil = |x: f32| Ue4m3::from_f32_ceil(x).unwrap().to_f32();
    assert_eq!(ceil(1.01), 1.125);
    assert_eq!(ceil(0.0), 0.0);
    assert_eq!(ceil(1e-30), p2(-9), "the smallest subnormal");
    assert_eq!(ceil(p2(-9) * 1.5), 2.0 * p2(-9));
    assert_eq!(ceil(449.0), 448.0, "clamped at the largest value");
    let near = |x: f32| Ue4m3::from_f32_nearest(x).unwrap().to_f32();
    assert_eq!(near(1.0625), 1.0, "tie to the even mantissa");
    assert_eq!(near(1.1875), 1.25);
    assert_eq!(near(1e6), 448.0);
    assert_eq!(near(0.4 * p2(-9)), 0.0);
    for bad in [-1.0, f32::NAN, f32::INFINITY] {
        assert!(Ue4m3::from_f32_ceil(bad).is_err() && Ue4m3::from_f32_nearest(bad).is_err(), "{bad}");
    }
}

#[test]
fn ue8m0_exact_refuses_what_is_not_a_power_of_two() {
    assert_eq!(Ue8m0::from_f32_exact(1.0).unwrap(), Ue8m0(127));
    assert_eq!(Ue8m0::from_f32_exact(0.5).unwrap(), Ue8m0(126));
    assert_eq!(Ue8m0::from_f32_exact(p2(127)).unwrap(), Ue8m0(254));
    assert_eq!(Ue8m0::from_f32_exact(p2(-127)).unwrap(), Ue8m0(0));
    assert_eq!(Ue8m0(0).to_f32_exact(), p2(-127));
    for b in 0..=254u8 {
        assert_eq!(Ue8m0(b).to_f32_exact(), (b as f64 - 127.0).exp2() as f32, "{b}");
    }
    assert!(Ue8m0(0xFF).to_f32_exact().is_nan());
    for bad in [3.0, 0.3, 0.0, -1.0, f32::NAN, f32::INFINITY, p2(-128)] {
        let err = Ue8m0::from_f32_exact(bad).unwrap_err().to_string();
        assert!(err.contains("power of two"), "{bad}: {err}");
    }
}

// ---- quantisers ----

/// Rows of very different magnitudes, with a zero block and a block of subnormals.
fn weights(rows: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed);
    let mut w: Vec<f32> =
        (0..rows * k).map(|i| rng.unit() * [1e-3, 0.02, 3.0, 700.0][(i / k) % 4] * (1.0 + (i % 7) as f32)).collect();
    w[..32].iter_mut().for_each(|x| *x = 0.0);
    w[32..64].iter_mut().enumerate().for_each(|(j, x)| *x = f32::from_bits(j as u32 + 1));
    w
}

/// The smallest power of two `>= x`, by doubling (independent of the crate's ceiling).
fn pow2_ceil(x: f32) -> f32 {
    let mut s = p2(-127);
    while s < x {
        s *= 2.0;
    }
    s
}

/// Half the gap around `|q|` in e2m1: the largest rounding error of an element of that size.
fn e2m1_half_gap(q: f32) -> f32 {
    match q.abs() {
        a if a <= 2.0 => 0.25,
        a if a <= 4.0 => 0.5,
        _ => 1.0,
    }
}

#[test]
fn mxfp8_scales_round_up_and_errors_stay_within_half_an_e4m3_step() {
    let (rows, k) = (12, 96);
    let w = weights(rows, k, 1);
    let q = Mxfp8::quantize(&w, rows, k).unwrap();
    assert_eq!((q.rows(), q.k(), q.data().len(), q.scales().len()), (rows, k, rows * k, rows * 3));
    let d = q.dequantize();
    for (b, blk) in w.chunks_exact(32).enumerate() {
        let amax = blk.iter().fold(0f32, |m, x| m.max(x.abs()));
        let s = q.scales()[b].to_f32_exact();
        let want = if amax == 0.0 { 1.0 } else { pow2_ceil(amax / 448.0) };
        assert_eq!(s, want, "block {b}: the ceiling, bit for bit");
        for j in 0..32 {
            let i = b * 32 + j;
            assert!((w[i] / s).abs() <= 448.0, "block {b}: |x / s| <= 448");
            assert_eq!(d[i], q.data()[i].to_f32() * s, "exact dequantisation");
            let bound = (w[i].abs() * p2(-4)).max(p2(-10) * s);
            assert!((d[i] - w[i]).abs() <= bound, "element {i}: {} vs {}", d[i], w[i]);
        }
    }
    let wb: Vec<bf16> = w.iter().map(|&x| bf16::from_f32(x)).collect();
    let rb: Vec<f32> = wb.iter().map(|x| x.to_f32()).collect();
    assert_eq!(Mxfp8::quantize_bf16(&wb, rows, k).unwrap(), Mxfp8::quantize(&rb, rows, k).unwrap());
}

#[test]
fn mxfp4_scales_round_up_and_errors_stay_within_half_an_e2m1_step() {
    let (rows, k) = (16, 64);
    let w = weights(rows, k, 2);
    let q = Mxfp4::quantize(&w, rows, k).unwrap();
    assert_eq!((q.data().len(), q.scales().len()), (rows * k / 2, rows * 2));
    let codes = unpack_e2m1(q.data());
    let d = q.dequantize();
    for (b, blk) in w.chunks_exact(32).enumerate() {
        let amax = blk.iter().fold(0f32, |m, x| m.max(x.abs()));
        let s = q.scales()[b].to_f32_exact();
        assert_eq!(s, if amax == 0.0 { 1.0 } else { pow2_ceil(amax / 6.0) }, "block {b}");
        for j in 0..32 {
            let i = b * 32 + j;
            let r = w[i] / s;
            assert!(r.abs() <= 6.0, "block {b}: |x / s| = {r} > 6");
            assert_eq!(d[i], codes[i].to_f32() * s);
            assert!((d[i] - w[i]).abs() <= e2m1_half_gap(r) * s, "element {i}: {} vs {}", d[i], w[i]);
        }
    }
    // Values on the grid come back exactly.
    let exact: Vec<f32> = (0..64).map(|i| FP4_LUT[i % 16] * 0.125 * if i < 32 { 1.0 } else { 64.0 }).collect();
    let q = Mxfp4::quantize(&exact, 1, 64).unwrap();
    assert_eq!(q.dequantize(), exact);
    assert_eq!(q.scales(), &[Ue8m0(127 - 3), Ue8m0(127 + 3)], "0.75 / 6 = 2^-3 and 48 / 6 = 2^3");
    // Byte 0: element 0 (0, code 0) in the low nibble, element 1 (0.5 · 2^-3 / 2^-3 = 0.5, code 1) in the high.
    assert_eq!(q.data()[0], 0x10);
}

#[test]
fn nvfp4_block_and_tensor_scales_bound_every_element() {
    let (rows, k) = (8, 48);
    let w = weights(rows, k, 3);
    let q = Nvfp4::quantize(&w, rows, k).unwrap();
    let t = q.tensor_scale();
    let amax_t = w.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert_eq!(t, amax_t / (6.0 * 448.0));
    assert_eq!(q.scales().len(), rows * 3);
    let codes = unpack_e2m1(q.data());
    let d = q.dequantize();
    for (b, blk) in w.chunks_exact(16).enumerate() {
        let amax = blk.iter().fold(0f32, |m, x| m.max(x.abs()));
        let s = q.scales()[b].to_f32();
        if amax == 0.0 {
            assert_eq!(q.scales()[b], Ue4m3::ONE);
            continue;
        }
        assert!(s >= amax / 6.0 / t || s == 448.0, "block {b}: the scale rounds up");
        let st = s * t;
        for j in 0..16 {
            let i = b * 16 + j;
            let r = w[i] / st;
            assert!(r.abs() <= 6.0 * (1.0 + 1e-6), "block {b}: |x / s| = {r}");
            assert_eq!(d[i], codes[i].to_f32() * s * t);
            assert!((d[i] - w[i]).abs() <= e2m1_half_gap(r) * st * (1.0 + 1e-6) + 1e-38, "element {i}");
        }
    }
    let zero = Nvfp4::quantize(&[0.0; 32], 2, 16).unwrap();
    assert_eq!((zero.tensor_scale(), zero.dequantize()), (1.0, vec![0.0; 32]));
}

/// The tensor-scale rule the host and the device quantiser share, and quantisation under a caller's tensor scale:
/// the same bytes as the host's own choice when given that choice, and a loud refusal where a block would need a
/// UE4M3 scale past 448 (its largest elements would clip).
#[test]
fn nvfp4_tensor_scale_rule_and_a_given_tensor_scale() {
    assert_eq!(nvfp4_tensor_scale(0.0), 1.0);
    assert_eq!(nvfp4_tensor_scale(2688.0), 1.0);
    assert_eq!(nvfp4_tensor_scale(6.0), 6.0 / 2688.0);
    // Tiny tensors: never below the smallest subnormal, so every block scale stays finite.
    assert_eq!(nvfp4_tensor_scale(f32::from_bits(1)), f32::from_bits(1));
    let (rows, k) = (8, 64);
    let w = weights(rows, k, 5);
    let own = Nvfp4::quantize(&w, rows, k).unwrap();
    let amax_t = w.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert_eq!(own.tensor_scale(), nvfp4_tensor_scale(amax_t));
    let t2 = 2.0 * own.tensor_scale();
    let given = Nvfp4::quantize_with_tensor_scale(&w, rows, k, t2).unwrap();
    assert_eq!(given.tensor_scale(), t2);
    // Twice the tensor scale: where the block scale is a normal UE4M3 of exponent above the smallest, it halves
    // exactly, so s * t and the block's codes stay as they were.
    let (c1, c2) = (unpack_e2m1(own.data()), unpack_e2m1(given.data()));
    let mut compared = 0;
    for (b, (s1, s2)) in own.scales().iter().zip(given.scales()).enumerate() {
        let zero = w[b * 16..(b + 1) * 16].iter().all(|&x| x == 0.0);
        if !zero && s1.to_bits() >> 3 >= 2 && *s1 != Ue4m3::MAX {
            assert_eq!(s2.to_f32(), s1.to_f32() / 2.0, "block {b}: {s1:?} -> {s2:?}");
            assert_eq!(&c1[b * 16..(b + 1) * 16], &c2[b * 16..(b + 1) * 16], "block {b}");
            compared += 1;
        }
    }
    assert!(compared >= rows * k / 64, "{compared} blocks compared");
    // At scale 1, the ties of e2m1 go to the even code: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 5 -> 4.
    let mut ties = vec![0f32; 16];
    ties[..5].copy_from_slice(&[6.0, 0.25, 0.75, 1.25, 5.0]);
    let q = Nvfp4::quantize_with_tensor_scale(&ties, 1, 16, 1.0).unwrap();
    assert_eq!(q.scales()[0], Ue4m3::ONE);
    assert_eq!(&unpack_e2m1(q.data())[..5], &[7, 0, 2, 2, 6].map(E2m1::from_bits));
    let e = Nvfp4::quantize_with_tensor_scale(&w, rows, k, own.tensor_scale() / 4.0).unwrap_err().to_string();
    assert!(e.contains("above 448") && e.contains("too small"), "{e}");
    for t in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let e = Nvfp4::quantize_with_tensor_scale(&w, rows, k, t).unwrap_err().to_string();
        assert!(e.contains("finite and positive"), "{t}: {e}");
    }
}

#[test]
fn shapes_and_values_that_do_not_fit_fail_loudly() {
    let w = vec![1.0f32; 2 * 48];
    for err in [
        Mxfp8::quantize(&w, 2, 48).unwrap_err(),
        Mxfp4::quantize(&w, 2, 48).unwrap_err(),
        Nvfp4::quantize(&w[..2 * 24], 2, 24).unwrap_err(),
    ] {
        assert!(err.to_string().contains("multiple of the"), "{err}");
    }
    assert!(Mxfp4::quantize(&w, 4, 32).unwrap_err().to_string().contains("elements"));
    let mut nan = vec![0.5f32; 64];
    nan[37] = f32::NAN;
    let err = Mxfp4::quantize(&nan, 2, 32).unwrap_err().to_string();
    assert!(err.contains("[1, 5]") && err.contains("not finite"), "{err}");
    assert!(Nvfp4::quantize(&nan, 2, 32).is_err() && Mxfp8::quantize(&nan, 2, 32).is_err());
    // from_parts: lengths, NaN scale bytes, tensor scales.
    assert!(Mxfp4::from_parts(2, 32, vec![0; 31], vec![Ue8m0::ONE; 2]).is_err());
    assert!(Mxfp4::from_parts(2, 32, vec![0; 32], vec![Ue8m0::ONE; 3]).is_err());
    let err = Mxfp4::from_parts(2, 64, vec![0; 64], vec![Ue8m0::ONE, Ue8m0::ONE, Ue8m0::ONE, Ue8m0(0xFF)]).unwrap_err();
    assert!(err.to_string().contains("[1, 1]") && err.to_string().contains("NaN"), "{err}");
    assert!(Mxfp8::from_parts(1, 32, vec![F8E4M3::from_f32(0.0); 32], vec![Ue8m0(0xFF)]).is_err());
    assert!(Mxfp4::from_parts(1, 32, vec![0; 16], vec![Ue8m0::ONE]).is_ok());
    assert!(Nvfp4::from_parts(1, 16, vec![0; 8], vec![Ue4m3::ONE], 0.0).is_err());
    assert!(Nvfp4::from_parts(1, 16, vec![0; 8], vec![Ue4m3::ONE], f32::NAN).is_err());
    assert!(Nvfp4::from_parts(1, 16, vec![0; 8], vec![Ue4m3::ONE; 2], 1.0).is_err());
}

// ---- The SM100 scale-factor atom layout ----

/// An independent formula: the CuTe layout `((32,4),(Vec,4)):((16,4),(0,1))` tiled over `(ceil(M/128),
/// ceil(K/(4·Vec)))` atoms, K-fastest, evaluated on the *element* coordinate `(m, k)` by decomposing each index
/// into its modes (colexicographic, CuTe's order) and summing coordinate × stride.
fn cute_sf_offset(m: usize, k: usize, k_total: usize, vec: usize) -> usize {
    let atoms_k = k_total.div_ceil(4 * vec);
    let dot = |mut x: usize, shape: &[usize], stride: &[usize]| {
        let mut o = 0;
        for (s, d) in shape.iter().zip(stride) {
            o += (x % s) * d;
            x /= s;
        }
        o
    };
    let m_modes = dot(m, &[32, 4, usize::MAX], &[16, 4, 512 * atoms_k]);
    let k_modes = dot(k, &[vec, 4, usize::MAX], &[0, 1, 512]);
    m_modes + k_modes
}

#[test]
fn sf_offset_matches_cutlass_probe_values() {
    // FP8_NOTES B: M = 200, K = 512, Vec 32 → 16 K-blocks.
    assert_eq!(sf_offset(33, 32 / 32, 200, 16).unwrap(), 21);
    assert_eq!(sf_offset(128, 0, 200, 16).unwrap(), 2048);
    assert_eq!(sf_atom_bytes(200, 16), 4096);
    assert_eq!(cute_sf_offset(33, 32, 512, 32), 21);
    assert_eq!(cute_sf_offset(128, 0, 512, 32), 2048);
    assert!(sf_offset(200, 0, 200, 16).is_err() && sf_offset(0, 16, 200, 16).is_err());
}

#[test]
fn sf_offset_agrees_with_the_cute_formula_and_is_a_bijection_onto_the_unpadded_cells() {
    for (m_total, k_total, vec) in
        [(200, 512, 32), (1, 32, 32), (129, 96, 32), (257, 16, 16), (128, 1024, 16), (5, 80, 16)]
    {
        let kb = k_total / vec;
        let size = sf_atom_bytes(m_total, kb);
        assert_eq!(size, m_total.div_ceil(128) * 128 * kb.div_ceil(4) * 4);
        let mut seen = vec![false; size];
        for m in 0..m_total {
            for k in 0..k_total {
                let o = sf_offset(m, k / vec, m_total, kb).unwrap();
                assert_eq!(o, cute_sf_offset(m, k, k_total, vec), "M {m_total} K {k_total}: ({m}, {k})");
                if k % vec == 0 {
                    assert!(!seen[o], "offset {o} taken twice");
                    seen[o] = true;
                }
            }
        }
    }
}

#[test]
fn scale_grids_round_trip_through_the_atom_layout() {
    let mut rng = Rng(9);
    for (m, kb) in [(200, 16), (1, 1), (129, 3), (128, 4), (300, 7)] {
        let grid: Vec<u8> = (0..m * kb).map(|_| 1 + (rng.next_u64() % 254) as u8).collect();
        let atoms = to_sf_atoms(&grid, m, kb).unwrap();
        assert_eq!(atoms.len(), sf_atom_bytes(m, kb));
        assert_eq!(atoms.iter().filter(|&&b| b != 0).count(), m * kb, "padding is zero");
        for r in 0..m {
            for c in 0..kb {
                assert_eq!(atoms[sf_offset(r, c, m, kb).unwrap()], grid[r * kb + c]);
            }
        }
        assert_eq!(from_sf_atoms(&atoms, m, kb).unwrap(), grid);
        let scales: Vec<Ue8m0> = grid.iter().map(|&b| Ue8m0(b)).collect();
        let mx = Mxfp4::from_parts(m, 32 * kb, vec![0; m * 16 * kb], scales.clone()).unwrap();
        assert_eq!(mx.sf_atoms(), atoms, "Mxfp4::sf_atoms");
        let mx8 = Mxfp8::from_parts(m, 32 * kb, vec![F8E4M3::from_f32(0.0); m * 32 * kb], scales).unwrap();
        assert_eq!(mx8.sf_atoms(), atoms, "Mxfp8::sf_atoms");
        let nv: Vec<Ue4m3> = grid.iter().map(|&b| Ue4m3::from_bits(b % 0x7F).unwrap()).collect();
        let nvb: Vec<u8> = nv.iter().map(|s| s.to_bits()).collect();
        let nv = Nvfp4::from_parts(m, 16 * kb, vec![0; m * 8 * kb], nv, 1.0).unwrap();
        assert_eq!(nv.sf_atoms(), to_sf_atoms(&nvb, m, kb).unwrap(), "Nvfp4::sf_atoms");
        assert!(to_sf_atoms(&grid[1..], m, kb).is_err());
        assert!(from_sf_atoms(&atoms[1..], m, kb).is_err());
    }
}

#[test]
fn grouped_scale_grids_start_each_group_on_its_own_128_row_atoms() {
    let rows = [0usize, 1, 5, 129, 200, 0, 128];
    let kb = 6;
    let (bases, len) = sf_group_bases(&rows, kb);
    let mut at = 0;
    for (g, &m) in rows.iter().enumerate() {
        assert_eq!(bases[g], at);
        assert_eq!(bases[g] % 128, 0, "TMA needs 128-byte group bases");
        at += m.div_ceil(128) * 128 * 8;
    }
    assert_eq!(len, at);
    let total: usize = rows.iter().sum();
    let mut rng = Rng(11);
    let grid: Vec<u8> = (0..total * kb).map(|_| 1 + (rng.next_u64() % 254) as u8).collect();
    let atoms = to_sf_atoms_grouped(&grid, &rows, kb).unwrap();
    assert_eq!(atoms.len(), len);
    let mut row0 = 0;
    for (g, &m) in rows.iter().enumerate() {
        for r in 0..m {
            for c in 0..kb {
                assert_eq!(atoms[bases[g] + sf_offset(r, c, m, kb).unwrap()], grid[(row0 + r) * kb + c], "group {g}");
            }
        }
        row0 += m;
    }
    assert_eq!(from_sf_atoms_grouped(&atoms, &rows, kb).unwrap(), grid);
    assert!(to_sf_atoms_grouped(&grid[kb..], &rows, kb).is_err());
    assert!(from_sf_atoms_grouped(&atoms[..len - 1], &rows, kb).is_err());
}

/// gpt-oss's K = 2880 stored as 2944 for the SM100 GEMMs: the logical dequantisation is the unpadded one bit for
/// bit, the pad dequantises to 0 with zero nibbles and neutral scales, the scale atoms cover the padded grid,
/// and a pad that is short or off the 32-element block is refused by name.
#[test]
fn mxfp4_padded_to_a_multiple_of_128_is_the_unpadded_matrix_plus_zero_columns() {
    let (rows, k, kp) = (5usize, 2880usize, 2944usize);
    let w = weights(rows, k, 29);
    let plain = Mxfp4::quantize(&w, rows, k).unwrap();
    let padded = Mxfp4::quantize_padded(&w, rows, k, kp).unwrap();
    assert_eq!((padded.rows(), padded.k(), padded.k_padded()), (rows, k, kp));
    assert_eq!((plain.k(), plain.k_padded()), (k, k));
    assert_eq!(padded.dequantize(), plain.dequantize(), "logical columns");
    let full = padded.dequantize_padded();
    assert_eq!(full.len(), rows * kp);
    for r in 0..rows {
        assert_eq!(&full[r * kp..r * kp + k], &plain.dequantize()[r * k..(r + 1) * k], "row {r}");
        assert!(full[r * kp + k..(r + 1) * kp].iter().all(|&x| x == 0.0), "row {r}: pad");
        // Bytes: the row's codes, then zero nibbles; scales: the row's, then 2^0.
        assert_eq!(&padded.data()[r * kp / 2..r * kp / 2 + k / 2], &plain.data()[r * k / 2..(r + 1) * k / 2]);
        assert!(padded.data()[r * kp / 2 + k / 2..(r + 1) * kp / 2].iter().all(|&b| b == 0), "row {r}");
        let s = &padded.scales()[r * kp / 32..(r + 1) * kp / 32];
        assert_eq!(&s[..k / 32], &plain.scales()[r * k / 32..(r + 1) * k / 32]);
        assert!(s[k / 32..].iter().all(|&x| x == Ue8m0::ONE), "row {r}: pad scales");
    }
    // The bytes of quantising the zero-padded rows (what the device quantisers write for a padded K).
    let zero_padded: Vec<f32> = w.chunks_exact(k).flat_map(|r| r.iter().copied().chain([0.0; 64])).collect();
    let wide = Mxfp4::quantize(&zero_padded, rows, kp).unwrap();
    assert_eq!((padded.data(), padded.scales()), (wide.data(), wide.scales()));
    let grid: Vec<u8> = padded.scales().iter().map(|s| s.0).collect();
    assert_eq!(padded.sf_atoms(), to_sf_atoms(&grid, rows, kp / 32).unwrap());
    // The atoms pad K to 4 x 32 either way: the same bytes wide.
    assert_eq!(padded.sf_atoms().len(), plain.sf_atoms().len());
    // Re-padding starts from the logical K; padding to K itself is the plain matrix.
    assert_eq!(padded.clone().pad_k(k).unwrap(), plain);
    assert_eq!(plain.clone().pad_k(kp).unwrap(), padded);
    for bad in [2848usize, 2900] {
        let m = plain.clone().pad_k(bad).unwrap_err().to_string();
        assert!(m.contains(&format!("padded to K = {bad}")) && m.contains("at least K and a multiple of"), "{m}");
    }
}
