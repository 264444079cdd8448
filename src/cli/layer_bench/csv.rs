//! The layer bench's `--csv`: one row per timed entry with the headline peer (`peer_us`, `x_peer`; the
//! `--json`'s `peer_headline` says what it is) and, appended, one `<variant>_us, x_<variant>` pair per peer
//! variant the peer script read back (`vllm_fp8_block`, `vllm_fused_moe_bf16`, `torch_grouped_mm`, …), so that
//! every ratio to a peer comes from the same run's file. Every cell is a name or a number: no quoting, and
//! `moe-gemm compare` splits rows on commas.

use moe_gemm::ceilings::Ceilings;

use super::super::peer::{Extras, Headline};
use super::{bf16_auto_us, Peer, Point, Timed};

/// The fixed columns: the point, the backend asked and run, Auto's pick, the times, the floor, the headline peer,
/// then the dtype of the row's experts, the bf16 layer's Auto median at the point and the row's median over it,
/// and (`--read-floor`) the point's measured read floor for the row's dtype and the row's median over it.
pub const BASE_COLUMNS: &str = "model,tokens,routing,backend,ran,auto,median_us,p10_us,p90_us,floor_us,x_floor,\
                                peer_us,x_peer,dtype,bf16_auto_us,x_bf16,read_us,x_read";

/// A peer variant's name as a column stem: ASCII letters, digits and `_`, the rest `_`.
fn stem(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}

/// The peer variants of `extras` over `points` (names in the bench's order), each once, in the order the points
/// first name them (the peer script's order within a point), after `headline` (the headline's identifier where
/// the script gives one: its numbers are the `peer_us` column's, under its own name too).
pub fn variants<'a>(headline: Option<&str>, extras: &Extras, points: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = headline.map(str::to_string).into_iter().collect();
    for p in points {
        for (name, _) in extras.get(p).into_iter().flatten() {
            if !out.contains(name) {
                out.push(name.clone());
            }
        }
    }
    out
}

/// The header line (no newline): [`BASE_COLUMNS`], then `<v>_us,x_<v>` per variant.
pub fn header(variants: &[String]) -> String {
    let mut h = BASE_COLUMNS.to_string();
    for v in variants {
        let s = stem(v);
        h += &format!(",{s}_us,x_{s}");
    }
    h
}

/// The variant cells of one row, each with its leading comma: the peer's µs and the row's median over it; empty
/// where the peer has no number at this point (its reason is in the `--json` rows' `peers`) or the row no time.
pub fn variant_cells(
    variants: &[String],
    measured: Option<&[(String, Result<f64, String>)]>,
    median: Option<f64>,
) -> String {
    let mut out = String::new();
    for v in variants {
        let us = measured.and_then(|m| m.iter().find(|(n, _)| n == v)).and_then(|(_, r)| r.as_ref().ok()).copied();
        let us_cell = us.map_or(String::new(), |u| format!("{u:.2}"));
        let ratio = median.zip(us).map_or(String::new(), |(m, u)| format!("{:.3}", m / u));
        out += &format!(",{us_cell},{ratio}");
    }
    out
}

/// The whole `--csv` text of a run: the header, then one line per timed entry.
pub(super) fn table(
    results: &[Timed],
    points: &[Point],
    ceil: &Ceilings,
    peer: &Peer,
    extras: &Extras,
    headline: &Headline,
) -> String {
    let names: Vec<String> = points.iter().map(Point::name).collect();
    // The headline under its own name too, where the script names it (its numbers then join the variants').
    let mut extras = extras.clone();
    if let (Ok(m), Some(id)) = (peer, &headline.id) {
        for (name, us) in m {
            extras.entry(name.clone()).or_default().insert(0, (id.clone(), us.clone()));
        }
    }
    let columns = variants(headline.id.as_deref(), &extras, names.iter().map(String::as_str));
    let mut text = format!("{}\n", header(&columns));
    for r in results {
        let (ran, times) = (&r.ran, &r.times);
        let p = &points[r.point];
        let floor = p.floor_for(r.dtype, ceil);
        let peer_us = peer.as_ref().ok().and_then(|m| m.get(&p.name())).and_then(|r| r.as_ref().ok()).copied();
        let (med, p10, p90) = times.map_or((None, None, None), |t| (Some(t.0), Some(t.1), Some(t.2)));
        let reference = bf16_auto_us(results, r.point, p);
        let read = p.read_for(r.dtype);
        let f = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.2}"));
        text += &format!(
            "{},{},{},{},{ran:?},{},{},{},{},{floor:.2},{},{},{},{},{},{},{},{}{}\n",
            p.model,
            p.tokens,
            p.routing,
            r.label(),
            p.auto_for(r.dtype).map_or(String::new(), |b| format!("{b:?}")),
            f(med),
            f(p10),
            f(p90),
            f(med.map(|m| m / floor)),
            f(peer_us),
            med.zip(peer_us).map_or(String::new(), |(m, t)| format!("{:.3}", m / t)),
            r.dtype.name(),
            f(reference),
            med.zip(reference).map_or(String::new(), |(m, b)| format!("{:.3}", m / b)),
            f(read),
            med.zip(read).map_or(String::new(), |(m, u)| format!("{:.3}", m / u)),
            variant_cells(&columns, extras.get(&p.name()).map(Vec::as_slice), med),
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::super::{LayerDtype, Timed};
    use super::*;
    use moe_gemm::Backend;

    fn extras() -> Extras {
        let mut e = Extras::new();
        e.insert(
            "p1".into(),
            vec![("vllm_fp8_block".into(), Ok(100.0)), ("vllm_fused_moe_bf16".into(), Err("skipped: K % 128".into()))],
        );
        e.insert(
            "p2".into(),
            vec![("torch_scaled_grouped_mm_fp8".into(), Ok(50.0)), ("vllm_fp8_block".into(), Ok(80.0))],
        );
        e
    }

    #[test]
    fn every_variant_of_every_point_gets_its_columns_once_in_first_seen_order() {
        let v = variants(None, &extras(), ["p1", "p2", "p3"]);
        assert_eq!(v, ["vllm_fp8_block", "vllm_fused_moe_bf16", "torch_scaled_grouped_mm_fp8"]);
        let named = variants(Some("torch_grouped_mm"), &extras(), ["p2"]);
        assert_eq!(named, ["torch_grouped_mm", "torch_scaled_grouped_mm_fp8", "vllm_fp8_block"]);
        assert_eq!(variants(Some("vllm_fp8_block"), &extras(), ["p1"]), ["vllm_fp8_block", "vllm_fused_moe_bf16"]);
        let h = header(&v);
        assert!(h.starts_with(BASE_COLUMNS));
        assert!(h.ends_with(
            ",vllm_fp8_block_us,x_vllm_fp8_block,vllm_fused_moe_bf16_us,x_vllm_fused_moe_bf16,\
             torch_scaled_grouped_mm_fp8_us,x_torch_scaled_grouped_mm_fp8"
        ));
        assert_eq!(header(&["a b".into()]), format!("{BASE_COLUMNS},a_b_us,x_a_b"));
    }

    #[test]
    fn cells_hold_the_peer_and_the_ratio_and_stay_empty_where_either_is_missing() {
        let e = extras();
        let v = variants(None, &e, ["p1", "p2"]);
        // p1: vllm_fp8_block 100 µs, bf16 peer skipped, no torch fp8 at this point; our median 90 µs.
        assert_eq!(variant_cells(&v, e.get("p1").map(Vec::as_slice), Some(90.0)), ",100.00,0.900,,,,");
        assert_eq!(variant_cells(&v, e.get("p2").map(Vec::as_slice), Some(40.0)), ",80.00,0.500,,,50.00,0.800");
        assert_eq!(variant_cells(&v, e.get("p2").map(Vec::as_slice), None), ",80.00,,,,50.00,");
        assert_eq!(variant_cells(&v, None, Some(1.0)), ",,,,,,");
        // Each row has as many cells as the header has columns.
        let cols = header(&v).split(',').count();
        let row =
            format!("{}{}", "x,".repeat(BASE_COLUMNS.split(',').count() - 1) + "x", variant_cells(&v, None, None));
        assert_eq!(row.split(',').count(), cols);
    }

    #[test]
    fn csv_rows_carry_the_read_floor_of_their_own_dtype() {
        let c = Ceilings { read_bytes_per_s: 4e12, bf16_flops: None, fp8_flops: None };
        let mut p = super::super::point::tests::point(vec![0, 1], 4, 2, 256, 128, 1);
        p.read_us = vec![(LayerDtype::Bf16, 20.0), (LayerDtype::Fp8, 10.0)];
        let row = |dtype, us| Timed {
            point: 0,
            asked: Backend::Grouped,
            ran: Backend::Grouped,
            times: Some((us, us, us)),
            dtype,
            tile: None,
        };
        let rows = [row(LayerDtype::Bf16, 30.0), row(LayerDtype::Fp8, 12.5), row(LayerDtype::Mxfp4, 9.0)];
        let headline = Headline { id: None, text: "none".into() };
        let text = table(&rows, &[p], &c, &Err("no peer".into()), &Default::default(), &headline);
        let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split(',').collect()).collect();
        let col = |name: &str| lines[0].iter().position(|h| *h == name).unwrap();
        let cells: Vec<(&str, &str)> = lines[1..].iter().map(|l| (l[col("read_us")], l[col("x_read")])).collect();
        // Each row against its own dtype's read; a dtype with no read timed gets empty cells, not another's.
        assert_eq!(cells, [("20.00", "1.500"), ("10.00", "1.250"), ("", "")]);
    }
}
