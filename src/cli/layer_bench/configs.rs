//! Tuned files of `bench --layer`: written from a run's measurements (`--write-configs`, `moe-gemm tune`) and
//! read back for the bf16 and block-FP8 layers' Auto (`--tuned`).

use moe_gemm::kernels::fused::FusedTile;
use moe_gemm::layer::WeightFormat;
use moe_gemm::tuning::{ConfigFile, ConfigName, LayerChoice, TunedBackends};
use moe_gemm::{Backend, Backends, DeviceInfo, Error, MoeLayerOptions, Result};

use super::{bf16_auto_us, LayerDtype, Point, Timed};
use crate::cli::args::BenchArgs;

/// The tuned file's name of a layer over weights of `format` (16-bit dense or block FP8) of `experts` experts of
/// width `inter` on this device.
fn config_name(info: &DeviceInfo, format: WeightFormat, experts: usize, inter: usize) -> Result<ConfigName> {
    ConfigName::for_table(&info.name, format, experts, inter)
}

/// The weight format of the layer rows of `dtype` that tuned files are written for (bf16 and block FP8).
fn table_format(dtype: LayerDtype) -> Option<WeightFormat> {
    match dtype {
        LayerDtype::Bf16 => Some(WeightFormat::Dense),
        LayerDtype::Fp8 => Some(WeightFormat::Fp8Block),
        LayerDtype::Mxfp4 | LayerDtype::Fp8Channel => None,
    }
}

/// Per model, weight format and token bucket: the fastest backend measured (Auto's pick beside it), the tile
/// configuration of each GEMM, and the measured median of that backend, in vLLM's file format (`dtype=bf16`, or
/// `dtype=fp8_w8a8,block_shape=[128, 128]` for the block-FP8 layer of `--dtype fp8`; this device's name).
pub(super) fn write_configs(
    dir: &std::path::Path,
    info: &DeviceInfo,
    points: &[Point],
    results: &[Timed],
    fused_tile: Option<FusedTile>,
    merge: bool,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::InvalidProblem(format!("cannot create {}: {e}", dir.display())))?;
    let mut files: Vec<ConfigFile> = Vec::new();
    let mut dtypes: Vec<LayerDtype> = Vec::new();
    // A format gets a table where some backend other than Auto was timed (under --quant-only the bf16 layer
    // ran Auto alone, as the reference: no table of its own).
    for r in results {
        if table_format(r.dtype).is_some() && r.asked != Backend::Auto && !dtypes.contains(&r.dtype) {
            dtypes.push(r.dtype);
        }
    }
    let first = points.first().map(|p| p.routing);
    for (dtype, (pi, p)) in dtypes
        .iter()
        .flat_map(|&d| points.iter().enumerate().filter(move |(_, p)| Some(p.routing) == first).map(move |x| (d, x)))
    {
        let format = table_format(dtype).expect("dtypes with tables only");
        let name = config_name(info, format, p.experts, p.inter)?;
        // The same shape and batch under every routing of the run: the backend whose worst ratio to the
        // fastest (per routing) is the least, so a skewed batch does not pay for a uniform-only choice.
        let same: Vec<usize> = (0..points.len())
            .filter(|&j| {
                let q = &points[j];
                (q.model, q.experts, q.inter, q.tokens, q.ep) == (p.model, p.experts, p.inter, p.tokens, p.ep)
            })
            .collect();
        // A candidate: a backend, and for Fused each tile the run timed (`None`: its one tile or rule).
        let timed = |(b, tile): (Backend, Option<FusedTile>), j: usize| {
            results
                .iter()
                .find(|r| r.point == j && r.dtype == dtype && r.asked == b && r.ran == b && r.tile == tile)
                .and_then(|r| r.times.map(|t| t.0))
        };
        let mut keys: Vec<(Backend, Option<FusedTile>)> = Vec::new();
        for r in results.iter().filter(|r| r.point == pi && r.dtype == dtype && r.asked == r.ran) {
            if r.asked != Backend::Auto && !keys.contains(&(r.asked, r.tile)) {
                keys.push((r.asked, r.tile));
            }
        }
        let candidates: Vec<_> = keys.iter().map(|&c| (c, same.iter().map(|&j| timed(c, j)).collect())).collect();
        let (best, tile) = pick_bucket(&candidates);
        let auto = if dtype == LayerDtype::Bf16 { p.auto } else { p.auto_fp8.unwrap_or(p.auto) };
        let auto_us = || if dtype == LayerDtype::Bf16 { bf16_auto_us(results, pi, p) } else { timed((auto, None), pi) };
        let (backend, median) = best.map_or_else(|| (auto, auto_us()), |c| (c.0, timed(c, pi)));
        let tile = tile.or(fused_tile);
        let entry = LayerChoice {
            backend,
            auto,
            format,
            experts: p.experts,
            hidden: p.hidden,
            inter: p.inter,
            top_k: p.top_k,
            tokens: p.tokens,
            sm_count: info.sm_count as usize,
            fused_tile: tile,
            median_us: median,
        }
        .entry();
        match files.iter_mut().find(|f| f.name == name) {
            Some(f) => {
                f.buckets.insert(p.tokens, entry);
            }
            None => files.push(ConfigFile { name, buckets: [(p.tokens, entry)].into() }),
        }
    }
    for mut f in files {
        let old = dir.join(f.name.to_string());
        if merge && old.exists() {
            // The existing table's buckets this run did not measure are kept.
            let kept = ConfigFile::read(&old)?;
            let fresh: Vec<String> = f.buckets.keys().map(|t| t.to_string()).collect();
            println!("merging buckets {} into {}", fresh.join(","), old.display());
            for (t, entry) in kept.buckets {
                f.buckets.entry(t).or_insert(entry);
            }
        }
        println!("wrote {}", f.write(dir)?.display());
    }
    Ok(())
}

/// `opts` with Auto from `--tuned`'s file for the model's weights of `format` on this GPU (the cost model where
/// the folder has none, said so), else (as a layer takes by default) from the table this crate ships for them (none
/// under `--ep`: Auto runs Grouped there), with room for the table's backends beside `room`.
#[allow(clippy::too_many_arguments)]
pub(super) fn with_table(
    opts: MoeLayerOptions,
    room: Backends,
    args: &BenchArgs,
    info: &DeviceInfo,
    format: WeightFormat,
    model: &str,
    experts: usize,
    inter: usize,
) -> Result<MoeLayerOptions> {
    let room_for = |t: &TunedBackends| room.union(t.buckets().iter().map(|b| b.1).collect());
    if let Some(dir) = args.tuned.as_ref().filter(|_| args.ep == 1) {
        let path = dir.join(config_name(info, format, experts, inter)?.to_string());
        if !path.exists() {
            println!("{model} ({format}): no tuned file {} (Auto: cost model)", path.display());
            return Ok(opts.cost_model_only());
        }
        println!("{model} ({format}): Auto from {}", path.display());
        let t = TunedBackends::read(&path)?;
        return Ok(opts.backends(room_for(&t)).tuned(t));
    }
    let shipped = TunedBackends::shipped(&info.name, format, experts, inter).filter(|_| args.ep == 1);
    Ok(shipped.map_or(opts, |t| opts.backends(room_for(&t))))
}

/// A bucket's candidate: a backend, and the Fused tile where the run timed several.
type Candidate = (Backend, Option<FusedTile>);

/// A bucket's pick over its candidates: the one with the least worst ratio ([`robust_pick`]); and the Fused
/// tile the bucket names: the winner's where it is a tiled Fused row, else the best of the tiled Fused rows by
/// the same rule (so that a Fused pass there, forced or picked, takes the tile measured best), `None` where the
/// run timed no tiles.
fn pick_bucket(candidates: &[(Candidate, Vec<Option<f64>>)]) -> (Option<Candidate>, Option<FusedTile>) {
    let best = robust_pick(candidates);
    let fused: Vec<_> = candidates.iter().filter(|c| c.0 .0 == Backend::Fused && c.0 .1.is_some()).cloned().collect();
    let tile = best.and_then(|b| b.1).or_else(|| robust_pick(&fused).and_then(|c| c.1));
    (best, tile)
}

/// The backend with the least worst-case ratio to the fastest backend, over the routings (columns) measured;
/// a backend not timed under some routing is out. Ties go to the faster under the first routing.
fn robust_pick<K: Copy>(candidates: &[(K, Vec<Option<f64>>)]) -> Option<K> {
    let routings = candidates.first().map_or(0, |c| c.1.len());
    let fastest: Vec<f64> =
        (0..routings).map(|r| candidates.iter().filter_map(|c| c.1[r]).fold(f64::INFINITY, f64::min)).collect();
    candidates
        .iter()
        .filter_map(|(b, t)| {
            let ratios: Option<Vec<f64>> = t.iter().zip(&fastest).map(|(t, f)| t.map(|t| t / f)).collect();
            ratios.map(|r| (*b, r.iter().copied().fold(0.0, f64::max), t[0].unwrap_or(f64::INFINITY)))
        })
        .min_by(|a, b| a.1.total_cmp(&b.1).then(a.2.total_cmp(&b.2)))
        .map(|c| c.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Backend::{Batched, Fused, Grouped};

    #[test]
    fn buckets_name_the_winning_tile_or_the_best_fused_one() {
        use moe_gemm::kernels::fused::FusedTile::{Decode16, DecodeMerged};
        // (uniform, zipf). Against the fastest of all, Decode16's worst ratio is the least (100 / 95); among the
        // Fused rows alone the merged tile's would be (102 / 100 against 106 / 103): the bucket names the winner's.
        let c = [
            ((Grouped, None), vec![Some(95.0), Some(200.0)]),
            ((Fused, Some(Decode16)), vec![Some(100.0), Some(106.0)]),
            ((Fused, Some(DecodeMerged)), vec![Some(102.0), Some(103.0)]),
        ];
        assert_eq!(pick_bucket(&c), (Some((Fused, Some(Decode16))), Some(Decode16)));
        assert_eq!(robust_pick(&c[1..]), Some((Fused, Some(DecodeMerged))));
        // Grouped wins: the bucket still names the better Fused tile.
        let c = [
            ((Grouped, None), vec![Some(90.0), Some(100.0)]),
            ((Fused, Some(Decode16)), vec![Some(100.0), Some(130.0)]),
            ((Fused, Some(DecodeMerged)), vec![Some(104.0), Some(110.0)]),
        ];
        assert_eq!(pick_bucket(&c), (Some((Grouped, None)), Some(DecodeMerged)));
        // No tiles timed: no tile named.
        let c = [((Grouped, None), vec![Some(90.0)]), ((Fused, None), vec![Some(80.0)])];
        assert_eq!(pick_bucket(&c), (Some((Fused, None)), None));
    }

    /// A run that timed the bf16 layer only as the FP8 rows' reference (`--quant-only`: its Auto, no backend of
    /// its own) writes the FP8 table alone; with a bf16 backend timed, both. `--merge-configs` replaces the
    /// measured buckets of a table already there and keeps its others.
    #[test]
    fn a_format_timed_only_by_its_auto_gets_no_table_and_merging_keeps_other_buckets() {
        use super::super::point::tests::point;
        let info = DeviceInfo {
            ordinal: 0,
            name: "NVIDIA H200".into(),
            compute_capability: (9, 0),
            sm_count: 132,
            l2_bytes: 50 << 20,
            max_smem_per_block_optin: 232448,
            arch: None,
        };
        let points = [point(vec![0, 1], 8, 2, 256, 128, 1)];
        let row =
            |asked, dtype, us| Timed { point: 0, asked, ran: asked, times: Some((us, us, us)), dtype, tile: None };
        let mut results = vec![
            row(Backend::Auto, LayerDtype::Bf16, 50.0),
            row(Grouped, LayerDtype::Fp8, 40.0),
            row(Batched, LayerDtype::Fp8, 30.0),
        ];
        let files = |results: &[Timed], dir: &str| {
            let dir = std::env::temp_dir().join(dir);
            let _ = std::fs::remove_dir_all(&dir);
            write_configs(&dir, &info, &points, results, None, false).unwrap();
            let mut names: Vec<String> =
                std::fs::read_dir(&dir).unwrap().map(|f| f.unwrap().file_name().into_string().unwrap()).collect();
            names.sort();
            (dir, names)
        };
        let (dir, fp8_only) = files(&results, "moe-gemm-quant-only-table");
        assert_eq!(fp8_only, ["E=8,N=128,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"]);
        let file = dir.join(&fp8_only[0]);
        let t = TunedBackends::read(&file).unwrap();
        assert_eq!(t.pick(1), Batched);
        results.push(row(Grouped, LayerDtype::Bf16, 45.0));
        let (_, names) = files(&results, "moe-gemm-both-tables");
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names[0].ends_with("dtype=bf16.json"), "{names:?}");
        // Merged into a table of buckets 1 and 64: bucket 1 is replaced, 64 kept; written anew without merge.
        std::fs::write(&file, r#"{"1": {"backend": "Fused"}, "64": {"backend": "Fused"}}"#).unwrap();
        write_configs(&dir, &info, &points, &results[..3], None, true).unwrap();
        let t = TunedBackends::read(&file).unwrap();
        assert_eq!(t.buckets().iter().map(|b| (b.0, b.1)).collect::<Vec<_>>(), [(1, Batched), (64, Fused)]);
        write_configs(&dir, &info, &points, &results[..3], None, false).unwrap();
        assert_eq!(TunedBackends::read(&file).unwrap().buckets().len(), 1);
    }

    #[test]
    fn robust_pick_minimises_the_worst_ratio_over_routings() {
        // Uniform alone picks Batched (100 < 104); under zipf Batched is 1.3x the fastest, Fused 1.04x at most.
        let c = vec![(Batched, vec![Some(100.0), Some(100.0)]), (Fused, vec![Some(104.0), Some(77.0)])];
        assert_eq!(robust_pick(&c), Some(Fused));
        assert_eq!(robust_pick(&[(Batched, vec![Some(100.0)]), (Fused, vec![Some(104.0)])]), Some(Batched));
        // Not timed under one routing: out. Equal worst ratios: the faster under the first routing.
        let c = vec![(Grouped, vec![Some(90.0), None]), (Batched, vec![Some(100.0), Some(50.0)])];
        assert_eq!(robust_pick(&c), Some(Batched));
        let c = vec![(Grouped, vec![Some(100.0), Some(110.0)]), (Fused, vec![Some(110.0), Some(100.0)])];
        assert_eq!(robust_pick(&c), Some(Grouped));
        assert_eq!(robust_pick(&[(Grouped, vec![None])]), None);
    }
}
