//! DeepGEMM's packed UE8M0 scale form (four per int32 along K, MN-major, MN padded to 4) against an independent
//! transcription of DeepGEMM's own steps (pad the byte grid, view four K bytes as one int32, transpose), exact
//! round trips, and the loud failures.

use moe_gemm::quant::{PackedUe8m0, Ue8m0};

/// DeepGEMM's steps, literally: bytes padded to [g, mn4, k4·4], each run of four K bytes read as a
/// little-endian int32 ([g, mn4, k4]), then stored transposed ([g, k4, mn4]).
fn deepgemm_words(bytes: &[u8], g: usize, mn: usize, k: usize) -> Vec<u32> {
    let (mn4, k4) = (mn.div_ceil(4) * 4, k.div_ceil(4));
    let mut padded = vec![0u8; g * mn4 * k4 * 4];
    for b in 0..g {
        for m in 0..mn {
            for j in 0..k {
                padded[(b * mn4 + m) * k4 * 4 + j] = bytes[(b * mn + m) * k + j];
            }
        }
    }
    let ints: Vec<u32> = padded.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let mut out = vec![0u32; g * k4 * mn4];
    for b in 0..g {
        for m in 0..mn4 {
            for q in 0..k4 {
                out[(b * k4 + q) * mn4 + m] = ints[(b * mn4 + m) * k4 + q];
            }
        }
    }
    out
}

fn grid(g: usize, mn: usize, k: usize) -> Vec<u8> {
    (0..g * mn * k).map(|i| (97 + (i * 37) % 60) as u8).collect()
}

#[test]
fn packing_matches_deepgemms_steps_and_round_trips() {
    for (g, mn, k) in [(1, 1, 1), (2, 5, 6), (3, 8, 4), (1, 130, 56), (4, 7, 9), (2, 0, 3)] {
        let bytes = grid(g, mn, k);
        let scales: Vec<Ue8m0> = bytes.iter().map(|&b| Ue8m0(b)).collect();
        let p = PackedUe8m0::from_ue8m0(&scales, g, mn, k).unwrap();
        assert_eq!(p.words(), deepgemm_words(&bytes, g, mn, k).as_slice(), "[{g}, {mn}, {k}]");
        assert_eq!(p.to_ue8m0(), scales, "[{g}, {mn}, {k}] round trip");
        let f: Vec<f32> = scales.iter().map(|s| s.to_f32_exact()).collect();
        let pf = PackedUe8m0::from_f32(&f, g, mn, k).unwrap();
        assert_eq!(pf, p);
        assert_eq!(pf.to_f32(), f);
        let back = PackedUe8m0::from_words(p.words().to_vec(), g, mn, k).unwrap();
        assert_eq!(back, p);
        assert_eq!(p.bytes(), 4 * g * k.div_ceil(4) * mn.div_ceil(4) * 4);
    }
}

#[test]
fn a_scale_lands_where_the_index_formula_says() {
    // [2, 5, 6]: MN padded to 8, two words per row; (g 1, m 4, k 5) is word 1·2·8 + 1·8 + 4 = 28, byte 1.
    let mut scales = vec![Ue8m0(127); 2 * 5 * 6];
    scales[(5 + 4) * 6 + 5] = Ue8m0(130);
    scales[(5 + 4) * 6 + 4] = Ue8m0(120);
    let p = PackedUe8m0::from_ue8m0(&scales, 2, 5, 6).unwrap();
    assert_eq!(p.locate(1, 4, 5).unwrap(), (28, 1));
    assert_eq!(p.words()[28], 120 | (130 << 8), "bytes 2 and 3 are K padding: zero");
    assert_eq!(p.words()[8 + 5], 0, "row 5 of the 8 padded rows: zero");
    assert!(p.locate(2, 0, 0).is_err() && p.locate(0, 5, 0).is_err() && p.locate(0, 0, 6).is_err());
}

#[test]
fn scales_that_are_not_powers_of_two_and_wrong_shapes_are_refused() {
    let err = PackedUe8m0::from_f32(&[1.0, 0.75, 2.0, 4.0], 1, 1, 4).unwrap_err().to_string();
    assert!(err.contains("scale 1") && err.contains("not a power of two"), "{err}");
    assert!(PackedUe8m0::from_f32(&[1.0, -2.0], 1, 1, 2).is_err(), "negative");
    assert!(PackedUe8m0::from_f32(&[f32::NAN], 1, 1, 1).is_err(), "NaN");
    let err = PackedUe8m0::from_ue8m0(&[Ue8m0(127); 5], 1, 2, 3).unwrap_err().to_string();
    assert!(err.contains("expected groups x mn x k_sf"), "{err}");
    let err = PackedUe8m0::from_words(vec![0; 7], 1, 5, 6).unwrap_err().to_string();
    assert!(err.contains("1 x 2 x 8"), "{err}");
    // A [1, 5, 6] grid read from words with a byte in the K padding (k 6) or in a padded row (m 5).
    let mut w = vec![0x7f7f_7f7f_u32; 16];
    w[8..13].iter_mut().for_each(|x| *x = 0x7f7f);
    w[5..8].iter_mut().for_each(|x| *x = 0);
    w[13..16].iter_mut().for_each(|x| *x = 0);
    assert!(PackedUe8m0::from_words(w.clone(), 1, 5, 6).is_ok());
    let mut bad = w.clone();
    bad[9] |= 0x01 << 16;
    let err = PackedUe8m0::from_words(bad, 1, 5, 6).unwrap_err().to_string();
    assert!(err.contains("nonzero padding"), "{err}");
    let mut bad = w;
    bad[5] = 1;
    assert!(PackedUe8m0::from_words(bad, 1, 5, 6).is_err(), "padded row");
}
