//! `moe-gemm compare`: two or more `moe-gemm bench --layer` tables side by side, per point, with the geomean of
//! the ratios to the first.
//!
//! Replaces the `compare.py`, `cmp_csv.py`, `cmp.py` and `lower.py` scripts that were copied into the results
//! folders (see the history of `benches/results/`): A/B runs alternate base and new binary on one machine
//! (A, B, A, B), each binary's runs are merged per point by their lower median (or, with `--merge mean`, the mean
//! of the medians), and every point both tables have is reported as new / base.

use std::collections::BTreeMap;
use std::path::Path;

use clap::{Args, ValueEnum};

#[derive(Args, Debug)]
pub struct CompareArgs {
    /// The tables, the base first: each a file written by `moe-gemm bench --layer --csv` or `--json`, or several
    /// runs of one binary joined by commas (`base-1.csv,base-2.csv`), merged per point.
    #[arg(required = true, num_args = 2..)]
    pub tables: Vec<String>,
    /// How the runs of one binary are merged per point: the lowest median, or the mean of the medians.
    #[arg(long, value_enum, default_value_t = Merge::Lower)]
    pub merge: Merge,
    /// Percent: a point whose ratio is further than this from 1 counts as faster or slower.
    #[arg(long, default_value_t = 2.0)]
    pub band: f64,
    /// List only the points outside the band.
    #[arg(long)]
    pub changed: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Merge {
    Lower,
    Mean,
}

/// A point of a layer bench: the row's identity across binaries (the backend Auto ran may differ between them).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub model: String,
    pub tokens: usize,
    pub routing: String,
    pub backend: String,
    pub dtype: String,
}

/// One timed row: its key, the backend that ran and the median in µs.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub key: Key,
    pub ran: String,
    pub median_us: f64,
}

/// The rows of one table, CSV or JSON by the first non-blank character; untimed rows ('not timed', skipped) are
/// left out. Tables written before the `dtype` column count as bf16.
pub fn parse(text: &str) -> Result<Vec<Row>, String> {
    if text.trim_start().starts_with('{') {
        parse_json(text)
    } else {
        parse_csv(text)
    }
}

fn parse_csv(text: &str) -> Result<Vec<Row>, String> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines.next().ok_or("empty table")?.split(',').map(str::trim).collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let need = |name: &str| col(name).ok_or_else(|| format!("no `{name}` column in the header"));
    let (model, tokens, routing, backend, ran, median) =
        (need("model")?, need("tokens")?, need("routing")?, need("backend")?, need("ran")?, need("median_us")?);
    let dtype = col("dtype");
    let mut rows = Vec::new();
    for (i, line) in lines.enumerate() {
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let cell = |c: usize| cells.get(c).copied().ok_or_else(|| format!("row {}: {} cells", i + 2, cells.len()));
        if cell(median)?.is_empty() {
            continue;
        }
        let number = |c: usize, what: &str| format!("row {}: {what} `{}` is not a number", i + 2, cells[c]);
        rows.push(Row {
            key: Key {
                model: cell(model)?.to_string(),
                tokens: cell(tokens)?.parse().map_err(|_| number(tokens, "tokens"))?,
                routing: cell(routing)?.to_string(),
                backend: cell(backend)?.to_string(),
                dtype: dtype.and_then(|d| cells.get(d)).filter(|d| !d.is_empty()).unwrap_or(&"bf16").to_string(),
            },
            ran: cell(ran)?.to_string(),
            median_us: cell(median)?.parse().map_err(|_| number(median, "median_us"))?,
        });
    }
    Ok(rows)
}

fn parse_json(text: &str) -> Result<Vec<Row>, String> {
    let doc: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let points = doc["points"].as_array().ok_or("no `points` array")?;
    let mut rows = Vec::new();
    for (i, p) in points.iter().enumerate() {
        let Some(median_us) = p["median_us"].as_f64() else { continue };
        let text = |name: &str| p[name].as_str().map(str::to_string).ok_or_else(|| format!("point {i}: no `{name}`"));
        rows.push(Row {
            key: Key {
                model: text("model")?,
                tokens: p["tokens"].as_u64().ok_or_else(|| format!("point {i}: no `tokens`"))? as usize,
                routing: text("routing")?,
                backend: text("backend")?,
                dtype: text("dtype").unwrap_or_else(|_| "bf16".into()),
            },
            ran: text("ran")?,
            median_us,
        });
    }
    Ok(rows)
}

/// Several runs of one binary merged per point: the lowest median (the `ran` of that run) or the mean of the
/// medians (the `ran` of the first run).
pub fn merge(runs: &[Vec<Row>], how: Merge) -> BTreeMap<Key, (String, f64)> {
    let mut all: BTreeMap<Key, (String, Vec<f64>)> = BTreeMap::new();
    for row in runs.iter().flatten() {
        let e = all.entry(row.key.clone()).or_insert_with(|| (row.ran.clone(), Vec::new()));
        if how == Merge::Lower && e.1.iter().all(|&m| row.median_us < m) {
            e.0 = row.ran.clone();
        }
        e.1.push(row.median_us);
    }
    all.into_iter()
        .map(|(k, (ran, ms))| {
            let v = match how {
                Merge::Lower => ms.iter().copied().fold(f64::INFINITY, f64::min),
                Merge::Mean => ms.iter().sum::<f64>() / ms.len() as f64,
            };
            (k, (ran, v))
        })
        .collect()
}

/// Geomean of `new / base` over the points both have, the number of such points, and how many are faster and
/// slower than `1 ∓ band`.
#[derive(Debug, PartialEq)]
pub struct Summary {
    pub geomean: f64,
    pub points: usize,
    pub faster: usize,
    pub slower: usize,
}

pub fn ratios(base: &BTreeMap<Key, (String, f64)>, new: &BTreeMap<Key, (String, f64)>) -> Vec<(Key, f64)> {
    base.iter().filter_map(|(k, (_, b))| new.get(k).map(|(_, n)| (k.clone(), n / b))).collect()
}

pub fn summarise(ratios: &[(Key, f64)], band: f64) -> Summary {
    let n = ratios.len();
    let geomean = if n == 0 { f64::NAN } else { (ratios.iter().map(|(_, r)| r.ln()).sum::<f64>() / n as f64).exp() };
    Summary {
        geomean,
        points: n,
        faster: ratios.iter().filter(|(_, r)| *r < 1.0 - band).count(),
        slower: ratios.iter().filter(|(_, r)| *r > 1.0 + band).count(),
    }
}

fn load(arg: &str) -> Result<Vec<Vec<Row>>, String> {
    arg.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let text = std::fs::read_to_string(Path::new(p)).map_err(|e| format!("cannot read {p}: {e}"))?;
            parse(&text).map_err(|e| format!("{p}: {e}"))
        })
        .collect()
}

pub fn run(args: &CompareArgs) -> Result<(), String> {
    if !(0.0..100.0).contains(&args.band) {
        return Err(format!("--band {} is not a percentage in [0, 100)", args.band));
    }
    let tables: Vec<_> =
        args.tables.iter().map(|t| load(t).map(|runs| merge(&runs, args.merge))).collect::<Result<_, _>>()?;
    let base = &tables[0];
    let per: Vec<Vec<(Key, f64)>> = tables[1..].iter().map(|t| ratios(base, t)).collect();
    for (i, t) in args.tables.iter().enumerate() {
        println!("{}: {t}", (b'A' + i as u8) as char);
    }
    let mut head =
        format!("{:<18} {:>6} {:<9} {:<13} {:>9} {:<10}", "model", "T", "routing", "backend", "A µs", "A ran");
    for i in 1..tables.len() {
        let name = (b'A' + i as u8) as char;
        head += &format!("  {:>9} {:<10} {:>6}", format!("{name} µs"), format!("{name} ran"), format!("{name}/A"));
    }
    println!("{head}");
    let band = args.band / 100.0;
    for (k, (ran, b)) in base {
        let cells: Vec<Option<(&String, f64, f64)>> =
            tables[1..].iter().map(|t| t.get(k).map(|(r, n)| (r, *n, n / b))).collect();
        if cells.iter().all(Option::is_none)
            || (args.changed && !cells.iter().flatten().any(|c| (c.2 - 1.0).abs() > band))
        {
            continue;
        }
        let dtype = if k.dtype == "bf16" { String::new() } else { format!(" {}", k.dtype) };
        let backend = format!("{}{dtype}", k.backend);
        let mut line = format!("{:<18} {:>6} {:<9} {backend:<13} {b:>9.1} {:<10}", k.model, k.tokens, k.routing, ran);
        for c in &cells {
            line += &match c {
                Some((r, n, q)) => format!("  {n:>9.1} {r:<10} {q:>6.3}"),
                None => format!("  {:>9} {:<10} {:>6}", "-", "", "-"),
            };
        }
        println!("{}", line.trim_end());
    }
    for (i, r) in per.iter().enumerate() {
        let s = summarise(r, band);
        let name = (b'B' + i as u8) as char;
        println!(
            "{name}/A: geomean {:.4} over {} points; {} faster and {} slower by more than {}%",
            s.geomean, s.points, s.faster, s.slower, args.band
        );
    }
    println!("runs per table merged by {}", if args.merge == Merge::Lower { "the lower median" } else { "the mean" });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // The bench's columns today (one pair per peer variant at the end); older tables name the headline `torch_us`
    // and stop at `x_bf16` or before `dtype`.
    const HEAD: &str = "model,tokens,routing,backend,ran,auto,median_us,p10_us,p90_us,floor_us,x_floor,peer_us,x_peer,\
                        dtype,bf16_auto_us,x_bf16,vllm_fp8_block_us,x_vllm_fp8_block";

    fn csv(rows: &[&str]) -> String {
        format!("{HEAD}\n{}\n", rows.join("\n"))
    }

    #[test]
    fn csv_rows_are_keyed_and_untimed_rows_skipped() {
        let t = csv(&[
            "mixtral-8x7b,1,uniform,Auto,Batched,Batched,191.30,190.18,193.15,157.98,1.21,150.00,1.275,bf16,191.30,1.000,180.00,1.063",
            "mixtral-8x7b,4096,uniform,Masked,Masked,Grouped,,,,157.98,,,,bf16,,,,",
            "gpt-oss-120b,1,uniform,Auto,Grouped,Grouped,231.12,1,2,3,4,,,mxfp4,77.04,3.000,,",
        ]);
        let rows = parse(&t).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].key.tokens, 1);
        assert_eq!((rows[0].ran.as_str(), rows[0].median_us), ("Batched", 191.30));
        assert_eq!(rows[1].key.dtype, "mxfp4");
    }

    #[test]
    fn tables_before_the_dtype_column_count_as_bf16() {
        let t = "model,tokens,routing,backend,ran,auto,median_us,p10_us,p90_us,floor_us,x_floor,torch_us,ratio_torch\n\
                 mixtral-8x7b,1,uniform,Batched,Batched,Batched,191.01,190.30,192.80,158.11,1.21,352.90,0.54\n";
        let rows = parse(t).unwrap();
        assert_eq!(rows[0].key.dtype, "bf16");
        assert!(parse("model,tokens\nx,1\n").unwrap_err().contains("routing"));
        assert!(parse(&csv(&["m,lots,uniform,Auto,Fused,Fused,1,1,1,1,1,,,bf16,1,1,,"]))
            .unwrap_err()
            .contains("tokens"));
    }

    #[test]
    fn json_reports_parse_like_their_csv() {
        let j = r#"{"device": "H200", "points": [
            {"model": "qwen3-30b-a3b", "tokens": 8, "routing": "zipf", "backend": "Auto", "ran": "Fused",
             "median_us": 97.8, "dtype": "bf16"},
            {"model": "qwen3-30b-a3b", "tokens": 8, "routing": "zipf", "backend": "Masked", "ran": "Masked",
             "median_us": null, "dtype": "bf16"}]}"#;
        let rows = parse(j).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].key.model, "qwen3-30b-a3b");
        assert_eq!(rows[0].median_us, 97.8);
    }

    fn row(model: &str, ran: &str, us: f64) -> Row {
        let key = Key {
            model: model.into(),
            tokens: 64,
            routing: "uniform".into(),
            backend: "Auto".into(),
            dtype: "bf16".into(),
        };
        Row { key, ran: ran.into(), median_us: us }
    }

    #[test]
    fn runs_merge_by_lower_median_or_mean() {
        let runs = vec![vec![row("a", "Fused", 10.0), row("b", "Grouped", 4.0)], vec![row("a", "Batched", 8.0)]];
        let lower = merge(&runs, Merge::Lower);
        assert_eq!(lower[&row("a", "", 0.0).key], ("Batched".to_string(), 8.0));
        assert_eq!(lower[&row("b", "", 0.0).key].1, 4.0);
        let mean = merge(&runs, Merge::Mean);
        assert_eq!(mean[&row("a", "", 0.0).key], ("Fused".to_string(), 9.0));
    }

    #[test]
    fn ratios_cover_common_points_and_the_geomean_is_geometric() {
        let base = merge(&[vec![row("a", "F", 100.0), row("b", "F", 100.0), row("c", "F", 50.0)]], Merge::Lower);
        let new = merge(&[vec![row("a", "F", 200.0), row("b", "F", 50.0), row("d", "F", 1.0)]], Merge::Lower);
        let r = ratios(&base, &new);
        assert_eq!(r.iter().map(|(_, q)| *q).collect::<Vec<_>>(), vec![2.0, 0.5]);
        let s = summarise(&r, 0.02);
        assert!((s.geomean - 1.0).abs() < 1e-12, "{s:?}");
        assert_eq!((s.points, s.faster, s.slower), (2, 1, 1));
        let s = summarise(&[(row("a", "", 0.0).key, 1.01)], 0.02);
        assert_eq!((s.faster, s.slower), (0, 0));
    }
}
