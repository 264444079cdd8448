//! Tuned files of `bench --layer`: written from a run's measurements (`--write-configs`, `moe-gemm tune`) and
//! read back for the bf16 layer's Auto (`--tuned`).

use moe_gemm::kernels::fused::FusedTile;
use moe_gemm::tuning::{ConfigFile, ConfigName, LayerChoice, TunedBackends};
use moe_gemm::{Backend, Backends, DeviceInfo, Error, MoeLayerOptions, Result};

use super::{bf16_auto_us, LayerDtype, Point, Timed};

/// The tuned file's name of a bf16 layer of `experts` experts of width `inter` on this device.
fn config_name(info: &DeviceInfo, experts: usize, inter: usize) -> ConfigName {
    ConfigName {
        experts,
        n: inter,
        device_name: ConfigName::device(&info.name),
        dtype: Some("bf16".into()),
        block_shape: None,
    }
}

/// Per model and token bucket: the fastest backend measured (Auto's pick beside it), the tile configuration of
/// each GEMM, and the measured median of that backend, in vLLM's file format (dtype=bf16, this device's name).
pub(super) fn write_configs(
    dir: &std::path::Path,
    info: &DeviceInfo,
    points: &[Point],
    results: &[Timed],
    fused_tile: Option<FusedTile>,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::InvalidProblem(format!("cannot create {}: {e}", dir.display())))?;
    let mut files: Vec<ConfigFile> = Vec::new();
    for (pi, p) in points.iter().enumerate().filter(|(_, p)| p.routing == points[0].routing) {
        let name = config_name(info, p.experts, p.inter);
        // The fastest backend measured at this point (a tuned file's choice), else Auto's pick.
        let best = results
            .iter()
            .filter(|r| r.point == pi && r.dtype == LayerDtype::Bf16 && r.asked != Backend::Auto)
            .filter_map(|r| r.times.map(|t| (r.ran, t.0)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let (backend, median) = best.map_or((p.auto, bf16_auto_us(results, pi, p)), |(b, us)| (b, Some(us)));
        let entry = LayerChoice {
            backend,
            auto: p.auto,
            experts: p.experts,
            hidden: p.hidden,
            inter: p.inter,
            top_k: p.top_k,
            tokens: p.tokens,
            sm_count: info.sm_count as usize,
            fused_tile,
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
    for f in files {
        println!("wrote {}", f.write(dir)?.display());
    }
    Ok(())
}

/// `opts` with Auto from this GPU's tuned file of the model (`E`, `I`) in `dir`, and room for its backends
/// beside `room`; unchanged (and said so) where there is none.
pub(super) fn with_tuned_file(
    opts: MoeLayerOptions,
    room: Backends,
    dir: &std::path::Path,
    info: &DeviceInfo,
    model: &str,
    experts: usize,
    inter: usize,
) -> Result<MoeLayerOptions> {
    let path = dir.join(config_name(info, experts, inter).to_string());
    if !path.exists() {
        println!("{model}: no tuned file {} (Auto: cost model)", path.display());
        return Ok(opts);
    }
    let t = TunedBackends::read(&path)?;
    let tuned_room: Backends = t.buckets().iter().map(|b| b.1).collect();
    println!("{model}: Auto from {}", path.display());
    Ok(opts.backends(room.union(tuned_room)).tuned(t))
}
