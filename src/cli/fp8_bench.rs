//! `moe-gemm bench --dtype fp8`: the SM90 FP8 blockwise grouped GEMM (1 x 128 activation scales, 128 x 128
//! weight scales, bf16 out) and the rowwise one (per-token x per-channel scales; FastAccum and promoted) on
//! DeepGEMM's benchmark shapes, with TFLOP/s next to the dense FP8 rate measured in
//! the same run (cuBLASLt 8192³, `moe-gemm`'s ceilings) and, where python3 with torch is there, PyTorch's
//! `F.grouped_mm` (bf16) and `torch._scaled_grouped_mm` (e4m3, row-wise scales) on the same shapes
//! (benches/peers/grouped_mm_peer.py with its fp8 part on: `--fp8-peer` is implied).
//!
//! Shapes (the tables of DeepGEMM's README): N x K = 4096 x 7168 (DeepSeek-V3's w13) and
//! 7168 x 2048 (w2), over
//! * contiguous layouts of 4 x 8192 and 8 x 4096 rows (groups back to back, `GroupRows::Offsets`), and
//! * masked layouts of 1 x 1024, 2 x 512 and 4 x 256 rows (`GroupRows::Masked`, `max_m` = the rows per group,
//!   every group full: the rows DeepGEMM's table counts).
//!
//! Operands are random e4m3 bytes (no NaN codes) with constant scales: the kernel's time does not depend on the
//! scales' values. Timing as `moe-gemm bench`: CUDA events, L2 flushed before each repetition unless
//! `--no-flush`, a spin kernel ahead of the timed launch, median and p10/p90 of `--reps`.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use moe_gemm::kernels::grouped_fp8::{Fp8TileConfig, GroupedGemmFp8, GroupedGemmFp8Options, GroupedGemmFp8Shape};
use moe_gemm::kernels::grouped_fp8_rowwise::{
    Fp8Accumulation, Fp8RowwiseConfig, GroupedGemmFp8Rowwise, GroupedGemmFp8RowwiseOptions, GroupedGemmFp8RowwiseShape,
};
use moe_gemm::kernels::plan::Workspace;
use moe_gemm::layouts::GroupRows;
use moe_gemm::quant::{scale_blocks, Fp8BlockWeights, Fp8ChannelWeights, Fp8Rows, Fp8TokenRows, F8E4M3};
use moe_gemm::timing::{measure, Stats};
use moe_gemm::{ceilings::Ceilings, DeviceInfo, DeviceStatus, Error, Result};

use super::args::BenchArgs;
use super::layer_fp8::fill_e4m3;

/// How a point's groups lie in A and D.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Layout {
    /// Groups back to back (DeepGEMM `m_grouped_fp8_gemm_nt_contiguous`).
    Contiguous,
    /// `[G, max_m]` rows, group `g` at `g · max_m` (DeepGEMM `m_grouped_fp8_gemm_nt_masked`).
    Masked,
}

impl Fp8Layout {
    fn name(self) -> &'static str {
        match self {
            Fp8Layout::Contiguous => "contiguous",
            Fp8Layout::Masked => "masked",
        }
    }
}

/// One benchmark point: `groups` groups of `m` rows over weights `[groups, n, k]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Fp8Point {
    pub name: String,
    pub layout: Fp8Layout,
    pub groups: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// DeepGEMM's published H800 TFLOP/s for this point (README @55ab91f), for orientation: another GPU and
    /// another kernel, not measured here.
    pub deepgemm_h800_tflops: f64,
}

impl Fp8Point {
    pub fn rows(&self) -> usize {
        self.groups * self.m
    }
    pub fn flops(&self) -> f64 {
        2.0 * self.rows() as f64 * self.n as f64 * self.k as f64
    }
}

/// DeepGEMM's shapes: (layout, groups, rows per group, [H800 TFLOP/s at 4096 x 7168, at 7168 x 2048]).
const SHAPES: [(Fp8Layout, usize, usize, [f64; 2]); 5] = [
    (Fp8Layout::Contiguous, 4, 8192, [1346.0, 1214.0]),
    (Fp8Layout::Contiguous, 8, 4096, [1346.0, 1214.0]),
    (Fp8Layout::Masked, 1, 1024, [1233.0, 925.0]),
    (Fp8Layout::Masked, 2, 512, [1040.0, 916.0]),
    (Fp8Layout::Masked, 4, 256, [932.0, 815.0]),
];

/// Every point: each layout and group count at both N x K.
pub fn points() -> Vec<Fp8Point> {
    let mut out = Vec::new();
    for (layout, groups, m, h800) in SHAPES {
        for (j, (n, k)) in [(4096usize, 7168usize), (7168, 2048)].into_iter().enumerate() {
            out.push(Fp8Point {
                name: format!("{}/{groups}x{m}/N={n},K={k}", layout.name()),
                layout,
                groups,
                m,
                n,
                k,
                deepgemm_h800_tflops: h800[j],
            });
        }
    }
    out
}

/// `--config` in FP8 mode: `auto` (the plan's heuristic), `all`, or an FP8 configuration's name.
pub fn configs(arg: &str) -> Result<Option<Vec<Fp8TileConfig>>> {
    match arg {
        "auto" => Ok(None),
        "all" => Ok(Some(Fp8TileConfig::ALL.to_vec())),
        name => Fp8TileConfig::from_name(name).map(|c| Some(vec![c])).ok_or_else(|| {
            let names: Vec<&str> = Fp8TileConfig::ALL.iter().map(|c| c.name()).collect();
            Error::InvalidProblem(format!(
                "--dtype fp8 --config {name:?}: expected auto, all or an FP8 configuration ({})",
                names.join(", ")
            ))
        }),
    }
}

/// Checks the arguments of an FP8 run before any device is touched.
///
/// # Errors
/// [`Error::InvalidProblem`] for an unknown `--config` (GEMM mode), or `--layer`'s FP8 checks
/// ([`super::layer_bench::validate_fp8`]: backends).
pub fn validate(args: &BenchArgs) -> Result<()> {
    if args.layer {
        return super::layer_fp8::validate_quant(args, super::layer_fp8::LayerDtype::Fp8);
    }
    configs(&args.config).map(|_| ())
}

struct Row {
    point: usize,
    /// The configuration's name (blockwise `fp8-…`, rowwise `fp8-rowwise-…`).
    config: &'static str,
    stats: Stats,
}

/// Times the launches of one configuration, with its workspace `ws` and a status word of its own that is
/// checked after.
fn time_config(
    stream: &Arc<CudaStream>,
    args: &BenchArgs,
    flush: &mut Option<CudaSlice<u8>>,
    mut ws: Workspace,
    mut launch: impl FnMut(&mut Workspace, &mut DeviceStatus) -> Result<()>,
) -> Result<Stats> {
    let mut st = DeviceStatus::new(stream)?;
    let stats = measure(stream, args.reps, args.warmup, flush, || launch(&mut ws, &mut st))?;
    st.check(stream)?;
    Ok(stats)
}

/// Times every point (and configuration) on `stream`'s device.
pub fn run(args: &BenchArgs, stream: &Arc<CudaStream>, info: &DeviceInfo, ceil: &Ceilings) -> Result<()> {
    let forced = configs(&args.config)?;
    let pts = points();
    println!(
        "device 0: {} ({} SMs); FP8 blockwise grouped GEMM (e4m3, 1x128 / 128x128 f32 scales, bf16 out), DeepGEMM's shapes; {} reps, median [p10-p90]; L2 {}",
        info.name,
        info.sm_count,
        args.reps,
        args.l2()
    );
    let mut flush = args.flush_buffer(stream)?;
    let mut rows: Vec<Row> = Vec::new();
    for (j, p) in pts.iter().enumerate() {
        let (gn, gk) = (scale_blocks(p.n), scale_blocks(p.k));
        let mut bq = stream.alloc_zeros::<F8E4M3>(p.groups * p.n * p.k)?;
        fill_e4m3(stream, &mut bq, 2 + j as u64)?;
        let b =
            Fp8BlockWeights::new(bq, stream.clone_htod(&vec![1.0f32 / 64.0; p.groups * gn * gk])?, p.groups, p.n, p.k)?;
        let mut aq = stream.alloc_zeros::<F8E4M3>(p.rows() * p.k)?;
        fill_e4m3(stream, &mut aq, 1000 + j as u64)?;
        let a = Fp8Rows::new(aq, stream.clone_htod(&vec![1.0f32 / 64.0; p.rows() * gk])?, p.rows(), p.k)?;
        let mut d = stream.alloc_zeros::<bf16>(p.rows() * p.n)?;
        let groups: CudaSlice<i32> = match p.layout {
            Fp8Layout::Contiguous => {
                stream.clone_htod(&(0..=p.groups).map(|g| (g * p.m) as i32).collect::<Vec<_>>())?
            }
            Fp8Layout::Masked => stream.clone_htod(&vec![p.m as i32; p.groups])?,
        };
        let group_rows = || match p.layout {
            Fp8Layout::Contiguous => GroupRows::Offsets(groups.as_view()),
            Fp8Layout::Masked => GroupRows::Masked { masked_m: groups.as_view(), max_m: p.m },
        };
        let shape = GroupedGemmFp8Shape::new(p.groups, p.n, p.k, p.rows())?;
        let list = forced.clone().unwrap_or_else(|| vec![Fp8TileConfig::heuristic(p.groups, p.rows())]);
        for config in list {
            let opts = GroupedGemmFp8Options { config: Some(config), expected_rows: Some(p.rows()) };
            let plan = GroupedGemmFp8::new(stream, shape, opts)?;
            let stats = time_config(stream, args, &mut flush, plan.alloc_workspace(stream)?, |ws, st| {
                plan.launch(stream, &a, &b, group_rows(), &mut d, ws, st)
            })?;
            rows.push(Row { point: j, config: config.name(), stats });
        }
        // The rowwise family on the same shapes (per-token x per-channel scales: torch's recipe), both
        // accumulations; all its configurations with `--config all`.
        let ra = Fp8TokenRows::new(
            stream.clone_dtod(&a.q())?,
            stream.clone_htod(&vec![1.0f32 / 64.0; p.rows()])?,
            p.rows(),
            p.k,
        )?;
        let rb = Fp8ChannelWeights::new(
            stream.clone_dtod(&b.q())?,
            stream.clone_htod(&vec![1.0f32 / 64.0; p.groups * p.n])?,
            p.groups,
            p.n,
            p.k,
        )?;
        let rowwise: Vec<Fp8RowwiseConfig> = if forced.as_ref().is_some_and(|f| f.len() > 1) {
            Fp8RowwiseConfig::ALL.to_vec()
        } else {
            [Fp8Accumulation::Fast, Fp8Accumulation::Promoted]
                .map(|acc| Fp8RowwiseConfig::heuristic(acc, p.groups, p.rows()))
                .to_vec()
        };
        let rshape = GroupedGemmFp8RowwiseShape::new(p.groups, p.n, p.k, p.rows())?;
        for config in rowwise {
            let opts = GroupedGemmFp8RowwiseOptions { config: Some(config), ..Default::default() };
            let plan = GroupedGemmFp8Rowwise::new(stream, rshape, opts)?;
            let stats = time_config(stream, args, &mut flush, plan.alloc_workspace(stream)?, |ws, st| {
                plan.launch(stream, &ra, &rb, group_rows(), &mut d, ws, st)
            })?;
            rows.push(Row { point: j, config: config.name(), stats });
        }
    }
    drop(flush);
    let peer = run_peer(args, &pts);
    print_table(&pts, &rows, &peer, ceil);
    if let Some(path) = &args.csv {
        let mut csv = String::from(
            "point,layout,groups,m,n,k,config,median_us,p10_us,p90_us,tflops,of_fp8_dense,deepgemm_h800_tflops,torch_bf16_us,torch_fp8_us\n",
        );
        for r in &rows {
            let p = &pts[r.point];
            let tf = p.flops() / (r.stats.median_us * 1e-6) / 1e12;
            let (torch, torch8) = peer_us(&peer, p);
            csv += &format!(
                "{},{},{},{},{},{},{},{:.2},{:.2},{:.2},{tf:.1},{},{},{},{}\n",
                p.name,
                p.layout.name(),
                p.groups,
                p.m,
                p.n,
                p.k,
                r.config,
                r.stats.median_us,
                r.stats.p10_us,
                r.stats.p90_us,
                ceil.fp8_flops.map_or(String::new(), |c| format!("{:.3}", tf * 1e12 / c)),
                p.deepgemm_h800_tflops,
                torch.map_or(String::new(), |v| format!("{v:.2}")),
                torch8.map_or(String::new(), |v| format!("{v:.2}")),
            );
        }
        super::args::write_file(path, &csv)?;
    }
    if let Some(path) = &args.json {
        let points: Vec<_> = rows
            .iter()
            .map(|r| {
                let p = &pts[r.point];
                let (torch, torch8) = peer_us(&peer, p);
                serde_json::json!({
                    "point": p.name, "layout": p.layout.name(), "groups": p.groups, "m": p.m, "n": p.n, "k": p.k,
                    "config": r.config, "median_us": r.stats.median_us, "p10_us": r.stats.p10_us,
                    "p90_us": r.stats.p90_us, "tflops": p.flops() / (r.stats.median_us * 1e-6) / 1e12,
                    "deepgemm_h800_tflops": p.deepgemm_h800_tflops, "torch_bf16_us": torch, "torch_fp8_us": torch8,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "device": info.name, "sm_count": info.sm_count, "fp8_dense_flops": ceil.fp8_flops, "points": points,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap())
            .map_err(|e| Error::InvalidProblem(format!("cannot write {}: {e}", path.display())))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// The PyTorch peer on the same shapes, its fp8 part on: bf16 `F.grouped_mm` and `torch._scaled_grouped_mm`.
fn run_peer(args: &BenchArgs, pts: &[Fp8Point]) -> std::result::Result<super::peer::Report, String> {
    let spec = serde_json::json!({
        "reps": args.reps,
        "warmup": args.warmup,
        "fp8": true,
        "flush_bytes": args.flush_bytes(),
        "points": pts.iter().map(|p| serde_json::json!({
            "name": p.name, "dtype": "bf16", "groups": p.groups, "n": p.n, "k": p.k, "sizes": vec![p.m; p.groups],
        })).collect::<Vec<_>>(),
    });
    super::peer::run(&args.peer, "grouped_mm_peer.py", args.peer_script.as_deref(), &spec)
}

/// The peer's (bf16 grouped_mm, fp8 scaled_grouped_mm) medians of a point, where measured.
fn peer_us(peer: &std::result::Result<super::peer::Report, String>, p: &Fp8Point) -> (Option<f64>, Option<f64>) {
    let Ok(r) = peer else { return (None, None) };
    let bf16 = r.medians.get(&p.name).and_then(|v| v.as_ref().ok()).copied();
    let fp8 = r
        .extras
        .get(&p.name)
        .and_then(|v| v.iter().find(|(name, _)| name == "scaled_grouped_mm_fp8"))
        .and_then(|(_, v)| v.as_ref().ok())
        .copied();
    (bf16, fp8)
}

fn print_table(
    pts: &[Fp8Point],
    rows: &[Row],
    peer: &std::result::Result<super::peer::Report, String>,
    ceil: &Ceilings,
) {
    match ceil.fp8_flops {
        Some(c) => println!("dense fp8 e4m3 rate (cuBLASLt 8192^3, measured now): {:.0} TFLOP/s", c / 1e12),
        None => println!("dense fp8 e4m3 rate: not measured (--no-ceilings or no libcublasLt)"),
    }
    println!(
        "{:<34} {:>6} {:<38} {:>10} {:>17} {:>8} {:>8} {:>10} {:>11} {:>11} {:>10}",
        "point",
        "rows",
        "config",
        "median µs",
        "p10-p90 µs",
        "TFLOP/s",
        "of fp8",
        "DG H800",
        "torch bf16",
        "torch fp8",
        "t/torch8"
    );
    for r in rows {
        let p = &pts[r.point];
        let tf = p.flops() / (r.stats.median_us * 1e-6) / 1e12;
        let of = ceil.fp8_flops.map_or("-".to_string(), |c| format!("{:.2}", tf * 1e12 / c));
        let (torch, torch8) = peer_us(peer, p);
        let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        println!(
            "{:<34} {:>6} {:<38} {:>10.1} {:>17} {:>8.0} {:>8} {:>10.0} {:>11} {:>11} {:>10}",
            p.name,
            p.rows(),
            r.config,
            r.stats.median_us,
            format!("{:.1}-{:.1}", r.stats.p10_us, r.stats.p90_us),
            tf,
            of,
            p.deepgemm_h800_tflops,
            us(torch),
            us(torch8),
            torch8.map_or("-".to_string(), |t| format!("{:.3}", r.stats.median_us / t)),
        );
    }
    if let Err(why) = peer {
        println!("peer: {why}");
    }
    println!(
        "TFLOP/s = 2 x rows x N x K / median; of fp8 = that / the dense fp8 rate above; DG H800 = DeepGEMM's \
         published H800 TFLOP/s for the shape (README @55ab91f; another GPU and kernel, for orientation only); \
         torch fp8 = torch._scaled_grouped_mm with row-wise scales (the recipe of our fp8-rowwise rows, not of the \
         blockwise ones); t/torch8 = our median / it"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_points_are_deepgemms_shapes() {
        let p = points();
        assert_eq!(p.len(), 10);
        let contiguous: Vec<(usize, usize)> =
            p.iter().filter(|p| p.layout == Fp8Layout::Contiguous).map(|p| (p.groups, p.m)).collect();
        assert_eq!(contiguous, vec![(4, 8192), (4, 8192), (8, 4096), (8, 4096)]);
        let masked: Vec<(usize, usize)> =
            p.iter().filter(|p| p.layout == Fp8Layout::Masked).map(|p| (p.groups, p.m)).collect();
        assert_eq!(masked, vec![(1, 1024), (1, 1024), (2, 512), (2, 512), (4, 256), (4, 256)]);
        for x in &p {
            assert!([(4096, 7168), (7168, 2048)].contains(&(x.n, x.k)), "{x:?}");
            // Every shape is one the FP8 GEMM plans (N whole scale blocks, K a multiple of 16).
            GroupedGemmFp8Shape::new(x.groups, x.n, x.k, x.rows()).unwrap();
        }
        assert_eq!(p[0].name, "contiguous/4x8192/N=4096,K=7168");
        assert_eq!(p[0].flops(), 2.0 * 32768.0 * 4096.0 * 7168.0);
    }

    #[test]
    fn fp8_configs_parse_by_name() {
        assert_eq!(configs("auto").unwrap(), None);
        assert_eq!(configs("all").unwrap().unwrap().len(), Fp8TileConfig::ALL.len());
        assert_eq!(configs("fp8-coop-128x128x128").unwrap(), Some(vec![Fp8TileConfig::Cooperative128x128x128]));
        let e = configs("coop-128x128x64").unwrap_err().to_string();
        assert!(e.contains("fp8-pingpong-64x128x128") && e.contains("--dtype fp8"), "{e}");
    }
}
