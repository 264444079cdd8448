//! The inputs of the layer bench: the points' routings (uniform, balanced, zipf) and the model shapes to run
//! (the suite, or the buckets of vLLM tuned-config files), from the command line.

use moe_gemm::kernels::fused::FusedTile;
use moe_gemm::random::SplitMix64;
use moe_gemm::tuning::ConfigFile;
use moe_gemm::*;

use super::args::{BenchArgs, Model, MODELS};

/// Routing of a benchmark point: each token picks k distinct experts (seeded) — uniformly, round-robin so
/// that every expert gets T·k/E rows (balanced), or with popularity ∝ 1/rank^1.2 (zipf, skewed); weights are a
/// softmax over the k of random logits.
pub(super) fn routing(kind: &str, e: usize, k: usize, t: usize, seed: u64) -> Result<(Vec<i32>, Vec<f32>)> {
    let mut rng = SplitMix64(seed);
    let zipf_cdf: Vec<f64> = {
        let w: Vec<f64> = (1..=e).map(|r| 1.0 / (r as f64).powf(1.2)).collect();
        let total: f64 = w.iter().sum();
        w.iter()
            .scan(0.0, |acc, x| {
                *acc += x / total;
                Some(*acc)
            })
            .collect()
    };
    let mut ids = Vec::with_capacity(t * k);
    let mut w = Vec::with_capacity(t * k);
    for tok in 0..t {
        let start = ids.len();
        let mut j = 0;
        while ids.len() - start < k {
            let x = match kind {
                "uniform" => rng.below(e),
                "balanced" => (tok * k + j) % e,
                "zipf" => {
                    let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                    zipf_cdf.partition_point(|&c| c < u).min(e - 1)
                }
                other => {
                    return Err(Error::InvalidProblem(format!(
                        "unknown routing {other:?}: expected uniform, balanced or zipf"
                    )))
                }
            } as i32;
            j += 1;
            if !ids[start..].contains(&x) {
                ids.push(x);
            }
        }
        let l: Vec<f32> = (0..k).map(|_| rng.unit() * 2.0).collect();
        let m = l.iter().cloned().fold(f32::MIN, f32::max);
        let s: f32 = l.iter().map(|x| (x - m).exp()).sum();
        w.extend(l.iter().map(|x| (x - m).exp() / s));
    }
    Ok((ids, w))
}

pub(super) fn parse_backend(s: &str) -> Result<Backend> {
    Ok(match s {
        "eager" => Backend::Eager,
        "batched" => Backend::Batched,
        "grouped" => Backend::Grouped,
        "contiguous" => Backend::Contiguous,
        "masked" => Backend::Masked,
        "fused" => Backend::Fused,
        "auto" => Backend::Auto,
        other => {
            return Err(Error::InvalidProblem(format!(
                "unknown backend {other:?}: expected eager, batched, grouped, contiguous, masked, fused or auto"
            )))
        }
    })
}

/// A model shape and the token counts to run it at.
pub(super) struct Shape {
    pub(super) model: Model,
    pub(super) tokens: Vec<usize>,
}

/// The suite models (at --layer-tokens), then the shapes of every --vllm-config file (at its token counts).
pub(super) fn shapes(args: &BenchArgs) -> Result<Vec<Shape>> {
    let mut out = Vec::new();
    const SUITE_TOKENS: [usize; 15] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384];
    let tokens = if args.suite { SUITE_TOKENS.to_vec() } else { args.layer_tokens.clone() };
    if args.tp == 0 || args.ep == 0 {
        return Err(Error::InvalidProblem("--tp and --ep must be >= 1".into()));
    }
    for name in &args.models {
        let m = MODELS
            .iter()
            .find(|m| m.name == name)
            .ok_or_else(|| Error::InvalidProblem(format!("unknown model {name:?}")))?;
        let mut model = *m;
        if args.tp > 1 {
            // A tensor-parallel slice holds I / tp of every expert (vLLM's N).
            if m.inter % (8 * args.tp) != 0 {
                return Err(Error::InvalidProblem(format!(
                    "{}: I = {} / tp = {} is not a multiple of 8",
                    m.name, m.inter, args.tp
                )));
            }
            model.inter = m.inter / args.tp;
            model.name = leak(format!("{}/tp{}", m.name, args.tp));
        }
        if args.ep > 1 {
            if m.experts % args.ep != 0 {
                return Err(Error::InvalidProblem(format!(
                    "{}: E = {} is not a multiple of ep = {}",
                    m.name, m.experts, args.ep
                )));
            }
            model.name = leak(format!("{}/ep{}", model.name, args.ep));
        }
        out.push(Shape { model, tokens: tokens.clone() });
    }
    for path in &args.vllm_config {
        let f = ConfigFile::read(path)?;
        let known = MODELS.iter().find(|m| m.experts == f.name.experts && m.inter == f.name.n);
        let (hidden, top_k, name) = match (known, args.hidden, args.top_k) {
            (_, Some(h), Some(k)) => (h, k, "vllm-config"),
            (Some(m), _, _) => (m.hidden, m.top_k, m.name),
            _ => {
                return Err(Error::InvalidProblem(format!(
                    "{}: E = {}, N = {} match no suite model: pass --hidden and --top-k",
                    path.display(),
                    f.name.experts,
                    f.name.n
                )))
            }
        };
        let model = Model {
            name: leak(format!("{name}[{}]", f.name)),
            experts: f.name.experts,
            top_k,
            hidden,
            inter: f.name.n,
            layers: 1,
            shared_inter: 0,
        };
        out.push(Shape { model, tokens: f.buckets.keys().copied().collect() });
    }
    Ok(out)
}

/// Point names are `&'static str` like the suite's; a few config-file names per run are leaked on purpose.
pub(super) fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// `--fused-tile`: tile names, whole (`fused-decode-16`) or by their last part (`decode-16`, `64x128x64`; the
/// decode tiles' earlier names `swapab-16`, … too); none: the per-batch choice.
pub(super) fn parse_fused_tiles(names: &[String]) -> Result<Vec<FusedTile>> {
    let mut tiles: Vec<FusedTile> = Vec::with_capacity(names.len());
    for n in names {
        let t = FusedTile::by_name(&format!("fused-{}", n.trim_start_matches("fused-")));
        let t = t.ok_or_else(|| {
            let known: Vec<&str> = FusedTile::ALL.iter().map(|t| t.name().trim_start_matches("fused-")).collect();
            Error::InvalidProblem(format!("unknown fused tile {n:?}: expected one of {}", known.join(", ")))
        })?;
        if tiles.contains(&t) {
            return Err(Error::InvalidProblem(format!("--fused-tile: {n:?} given twice")));
        }
        tiles.push(t);
    }
    Ok(tiles)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(ids: &[i32], e: usize) -> Vec<usize> {
        let mut c = vec![0; e];
        ids.iter().for_each(|&x| c[x as usize] += 1);
        c
    }

    #[test]
    fn fused_tiles_parse_by_whole_or_short_name() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let t = parse_fused_tiles(&names(&["decode-16", "fused-decode-merged", "64x128x64"])).unwrap();
        assert_eq!(t, [FusedTile::Decode16, FusedTile::DecodeMerged, FusedTile::M64N128K64]);
        // The earlier names of the decode tiles still name them.
        let t = parse_fused_tiles(&names(&["swapab-32", "fused-swapab-merged"])).unwrap();
        assert_eq!(t, [FusedTile::Decode32, FusedTile::DecodeMerged]);
        assert!(parse_fused_tiles(&[]).unwrap().is_empty());
        let e = parse_fused_tiles(&names(&["decode-8"])).unwrap_err().to_string();
        assert!(e.contains("unknown fused tile \"decode-8\"") && e.contains("decode-merged, 64x128x64"), "{e}");
        let e = parse_fused_tiles(&names(&["16", "decode-16"])).unwrap_err().to_string();
        assert!(e.contains("unknown fused tile \"16\""), "a suffix alone names no tile: {e}");
        let e = parse_fused_tiles(&names(&["decode-16", "fused-swapab-16"])).unwrap_err().to_string();
        assert!(e.contains("given twice"), "{e}");
    }

    #[test]
    fn routings_pick_k_distinct_experts_with_normalised_weights() {
        for kind in ["uniform", "balanced", "zipf"] {
            let (ids, w) = routing(kind, 64, 8, 100, 1).unwrap();
            for t in 0..100 {
                let mut row = ids[t * 8..(t + 1) * 8].to_vec();
                row.sort();
                row.dedup();
                assert_eq!(row.len(), 8, "{kind}: token {t} repeats an expert");
                let s: f32 = w[t * 8..(t + 1) * 8].iter().sum();
                assert!((s - 1.0).abs() < 1e-5, "{kind}: weights sum to {s}");
            }
        }
    }

    #[test]
    fn balanced_is_exact_and_zipf_is_skewed() {
        let (ids, _) = routing("balanced", 16, 4, 64, 1).unwrap();
        assert!(counts(&ids, 16).iter().all(|&c| c == 16));
        let (ids, _) = routing("zipf", 64, 4, 2000, 1).unwrap();
        let c = counts(&ids, 64);
        assert!(c[0] > 4 * c[32].max(1), "zipf: the top expert ({}) should dwarf the median one ({})", c[0], c[32]);
        assert!(routing("pareto", 8, 2, 4, 1).is_err());
    }
}
