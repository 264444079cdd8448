//! `moe-gemm bench`: the SM90 grouped GEMM on real MoE shapes, next to PyTorch's `F.grouped_mm` measured in the
//! same run (benches/peers/grouped_mm_peer.py, when python3 with torch is there).
//!
//! Each point: the two expert GEMMs of one MoE layer at T tokens, rows = T·k routed uniformly at random
//! (seeded; each token picks k distinct experts) or perfectly balanced. GEMM1 = w13 (N = 2·I, K = H),
//! GEMM2 = w2 (N = H, K = I). Timing: CUDA events around each launch, L2 flushed before each repetition
//! (weights cold, as in a layer stack), median and p10/p90 of `--reps`. Before each start event a 200 µs spin
//! kernel keeps the device busy while the host queues the timed launches, so events measure back-to-back
//! execution (as a CUDA graph replays it), not host launch latency; the peer does the same (torch.cuda._sleep).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use half::bf16;
use moe_gemm::kernels::grouped::{GroupedGemm, GroupedGemmOptions, GroupedGemmShape};
use moe_gemm::kernels::TileConfig;
use moe_gemm::random::{fill_device, SplitMix64};
use moe_gemm::timing::{measure, Stats};
use moe_gemm::{device, Error, Result};

use super::args::{write_file, BenchArgs, BenchDtype, MODELS};

struct Point {
    name: String,
    pub gemm: &'static str,
    pub tokens: usize,
    routing: &'static str,
    groups: usize,
    n: usize,
    k: usize,
    sizes: Vec<usize>,
}

struct Row {
    point_idx: usize,
    pub config: TileConfig,
    stats: Stats,
}

/// Group sizes when each of `tokens` tokens picks `k` distinct experts of `e` uniformly at random.
fn uniform_routing(e: usize, k: usize, tokens: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix64(seed);
    let mut sizes = vec![0; e];
    let mut picked = Vec::with_capacity(k);
    for _ in 0..tokens {
        picked.clear();
        while picked.len() < k {
            let x = rng.below(e);
            if !picked.contains(&x) {
                picked.push(x);
            }
        }
        for &x in &picked {
            sizes[x] += 1;
        }
    }
    sizes
}

fn balanced_routing(e: usize, k: usize, tokens: usize) -> Vec<usize> {
    let rows = tokens * k;
    (0..e).map(|g| rows / e + usize::from(g < rows % e)).collect()
}

fn points(args: &BenchArgs) -> Result<Vec<Point>> {
    let mut out = Vec::new();
    for name in &args.models {
        let m = MODELS.iter().find(|m| m.name == name).ok_or_else(|| {
            Error::InvalidProblem(format!(
                "unknown model {name:?}; known: {}",
                MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
            ))
        })?;
        let gemms: Vec<(&'static str, usize, usize)> = match args.gemm.as_str() {
            "w13" => vec![("w13", 2 * m.inter, m.hidden)],
            "w2" => vec![("w2", m.hidden, m.inter)],
            "both" => vec![("w13", 2 * m.inter, m.hidden), ("w2", m.hidden, m.inter)],
            g => return Err(Error::InvalidProblem(format!("--gemm {g:?}: expected w13, w2 or both"))),
        };
        for &t in &args.tokens {
            let mut routings = vec![("uniform", uniform_routing(m.experts, m.top_k, t, 42 + t as u64))];
            if args.balanced {
                routings.push(("balanced", balanced_routing(m.experts, m.top_k, t)));
            }
            for (routing, sizes) in routings {
                for &(gemm, n, k) in &gemms {
                    out.push(Point {
                        name: format!("{}/{gemm}/T={t}/{routing}", m.name),
                        gemm,
                        tokens: t,
                        routing,
                        groups: m.experts,
                        n,
                        k,
                        sizes: sizes.clone(),
                    });
                }
            }
        }
    }
    Ok(out)
}

fn configs(arg: &str) -> Result<Option<Vec<TileConfig>>> {
    match arg {
        "auto" => Ok(None),
        "all" => Ok(Some(TileConfig::ALL.to_vec())),
        name => TileConfig::from_name(name).map(|c| Some(vec![c])).ok_or_else(|| {
            Error::InvalidProblem(format!("unknown --config {name:?}; see `moe-gemm info` for the names"))
        }),
    }
}

pub fn run(args: BenchArgs) -> Result<()> {
    if args.dtype == BenchDtype::Fp8 {
        super::fp8_bench::validate(&args)?;
    }
    if args.dtype == BenchDtype::Mxfp4 {
        if !args.layer {
            return Err(moe_gemm::Error::InvalidProblem(
                "--dtype mxfp4 times the MoE layer: add --layer (the MX GEMMs have no GEMM-mode bench)".into(),
            ));
        }
        super::layer_fp8::validate_quant(&args, super::layer_fp8::LayerDtype::Mxfp4)?;
    }
    if args.dtype == BenchDtype::Fp8Channel {
        if !args.layer {
            return Err(moe_gemm::Error::InvalidProblem(
                "--dtype fp8-channel times the MoE layer: add --layer (the rowwise GEMM's GEMM-mode bench is \
                 --dtype fp8's)"
                    .into(),
            ));
        }
        super::layer_fp8::validate_quant(&args, super::layer_fp8::LayerDtype::Fp8Channel)?;
    }
    if args.merge_configs && args.write_configs.is_none() {
        return Err(moe_gemm::Error::InvalidProblem(
            "--merge-configs: merges the tables --write-configs writes into those already in its folder; it needs \
             --write-configs DIR"
                .into(),
        ));
    }
    if args.quant_only && (!args.layer || args.dtype == BenchDtype::Bf16) {
        return Err(moe_gemm::Error::InvalidProblem(
            "--quant-only: times the bf16 layer only as the reference of a quantised one; it needs --layer and \
             --dtype fp8, mxfp4 or fp8-channel"
                .into(),
        ));
    }
    if !device::driver_present() {
        println!("moe-gemm bench: no CUDA device (libcuda.so could not be loaded); nothing to measure.");
        return Ok(());
    }
    if args.layer && args.nccl {
        #[cfg(feature = "nccl")]
        return super::ep_bench::run(&args);
        #[cfg(not(feature = "nccl"))]
        return Err(moe_gemm::Error::InvalidProblem("--nccl: this build has no `nccl` feature".into()));
    }
    let ctx = device::open(0)?;
    let stream = ctx.per_thread_stream();
    let info = moe_gemm::DeviceInfo::query(&ctx)?;
    info.require("moe-gemm bench", moe_gemm::device::KernelFamily::GroupedGemmSm90)?;
    let clocks_before = clocks();
    let ceil = if args.no_ceilings {
        // Without measurement, the ceilings of shared/PERF_TARGETS.md (one H200, 2026-11-29), labelled as such.
        println!("ceilings: not measured (--no-ceilings); floors use PERF_TARGETS.md's 4.47 TB/s and 789 TFLOP/s");
        moe_gemm::ceilings::Ceilings { read_bytes_per_s: 4.47e12, bf16_flops: Some(789e12), fp8_flops: None }
    } else {
        let c = moe_gemm::ceilings::measure(&stream)?;
        println!(
            "ceilings measured now: streaming read {:.2} TB/s (4 GiB); dense bf16 {} (cuBLAS 8192^3); dense fp8 e4m3 {} (cuBLASLt 8192^3)",
            c.read_bytes_per_s / 1e12,
            c.bf16_flops
                .map_or("not measured: libcublas not found".to_string(), |f| format!("{:.0} TFLOP/s", f / 1e12)),
            c.fp8_flops
                .map_or("not measured: libcublasLt not found".to_string(), |f| format!("{:.0} TFLOP/s", f / 1e12))
        );
        c
    };
    println!("clocks before: {clocks_before}");
    if args.layer {
        let r = super::layer_bench::run(&args, &stream, &info, &ceil);
        println!("clocks after: {}", clocks());
        return r;
    }
    if args.dtype == BenchDtype::Fp8 {
        let r = super::fp8_bench::run(&args, &stream, &info, &ceil);
        println!("clocks after: {}", clocks());
        return r;
    }
    let forced = configs(&args.config)?;
    let pts = points(&args)?;
    println!(
        "device 0: {} ({} SMs); bf16, fp32 accumulation; {} reps, median [p10-p90]; L2 {}",
        info.name,
        info.sm_count,
        args.reps,
        args.l2()
    );
    let mut flush = args.flush_buffer(&stream)?;

    let mut rows: Vec<Row> = Vec::new();
    // Points sharing a weight shape reuse one B; A is sized for the largest row count of that shape.
    let mut shapes: Vec<(usize, usize, usize)> = Vec::new();
    for p in &pts {
        if !shapes.contains(&(p.groups, p.n, p.k)) {
            shapes.push((p.groups, p.n, p.k));
        }
    }
    for (g, n, k) in shapes {
        let same: Vec<usize> = (0..pts.len()).filter(|&j| (pts[j].groups, pts[j].n, pts[j].k) == (g, n, k)).collect();
        let max_rows = same.iter().map(|&j| pts[j].sizes.iter().sum::<usize>()).max().unwrap().max(1);
        let mut a = stream.alloc_zeros::<bf16>(max_rows * k)?;
        let mut b = stream.alloc_zeros::<bf16>(g * n * k)?;
        let mut d = stream.alloc_zeros::<bf16>(max_rows * n)?;
        fill_device(&stream, &mut a, 1, 1.0)?;
        fill_device(&stream, &mut b, 2, 0.02)?;
        let shape = GroupedGemmShape::new(g, n, k, max_rows)?;
        for j in same {
            let p = &pts[j];
            let offsets = stream.clone_htod(&moe_gemm::layouts::offsets_from_sizes(&p.sizes)?)?;
            let expected = p.sizes.iter().sum::<usize>();
            let list =
                forced.clone().unwrap_or_else(|| vec![TileConfig::heuristic(g, n, expected, info.sm_count as usize)]);
            for config in list {
                let plan = GroupedGemm::<bf16>::new(
                    &stream,
                    shape,
                    GroupedGemmOptions { config: Some(config), expected_rows: Some(expected) },
                )?;
                let mut ws = plan.alloc_workspace(&stream)?;
                let mut st = moe_gemm::DeviceStatus::new(&stream)?;
                let stats = measure(&stream, args.reps, args.warmup, &mut flush, || {
                    plan.launch(&stream, &a, &b, &offsets, &mut d, &mut ws, &mut st)
                })?;
                st.check(&stream)?;
                rows.push(Row { point_idx: j, config, stats });
            }
        }
    }
    drop(flush);

    let peer = run_peer(&args, &pts);
    print_table(&pts, &rows, &peer, &ceil);
    println!("clocks after: {}", clocks());
    if let Some(path) = &args.csv {
        let mut csv = String::from("point,gemm,tokens,routing,groups,n,k,rows,config,median_us,p10_us,p90_us,tflops,weight_gbs,floor_us,torch_us\n");
        for r in &rows {
            let p = &pts[r.point_idx];
            let (tf, gbs) = metrics(p, &r.stats);
            let torch = peer
                .as_ref()
                .ok()
                .and_then(|m| m.get(&p.name))
                .and_then(|x| x.as_ref().ok())
                .map_or(String::new(), |v| format!("{v:.2}"));
            csv += &format!(
                "{},{},{},{},{},{},{},{},{},{:.2},{:.2},{:.2},{tf:.2},{gbs:.1},{:.2},{torch}\n",
                p.name,
                p.gemm,
                p.tokens,
                p.routing,
                p.groups,
                p.n,
                p.k,
                p.sizes.iter().sum::<usize>(),
                r.config.name(),
                r.stats.median_us,
                r.stats.p10_us,
                r.stats.p90_us,
                floor_us(p, &ceil)
            );
        }
        write_file(path, &csv)?;
    }
    if !args.no_routing {
        bench_routing(&stream, &args, &pts, &rows)?;
    }
    if let Some(path) = &args.json {
        write_json(path, &info, &pts, &rows, &peer)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

type PeerResults = super::peer::Medians;

fn run_peer(args: &BenchArgs, pts: &[Point]) -> std::result::Result<PeerResults, String> {
    let spec = serde_json::json!({
        "reps": args.reps,
        "warmup": args.warmup,
        "fp8": args.fp8_peer,
        "flush_bytes": args.flush_bytes(),
        "points": pts.iter().map(|p| serde_json::json!({
            "name": p.name, "dtype": "bf16", "groups": p.groups, "n": p.n, "k": p.k, "sizes": p.sizes,
        })).collect::<Vec<_>>(),
    });
    let report = super::peer::run(&args.peer, "grouped_mm_peer.py", args.peer_script.as_deref(), &spec)?;
    if args.fp8_peer {
        match &report.doc["fp8_dense_tflops"] {
            serde_json::Value::Number(n) => println!(
                "fp8 dense rate (torch._scaled_mm, cuBLASLt, 8192^3): {:.0} TFLOP/s",
                n.as_f64().unwrap_or(0.0)
            ),
            other => println!("fp8 dense rate: not measured ({other})"),
        }
        for p in pts {
            for (peer, v) in report.extras.get(&p.name).into_iter().flatten() {
                match v {
                    Ok(us) => println!("  {:<36} {peer} {us:.1} µs", p.name),
                    Err(why) => println!("  {:<36} {peer}: {why}", p.name),
                }
            }
        }
    }
    Ok(report.medians)
}

fn metrics(p: &Point, s: &Stats) -> (f64, f64) {
    let rows: usize = p.sizes.iter().sum();
    let active = p.sizes.iter().filter(|&&s| s > 0).count();
    let tflops = 2.0 * rows as f64 * p.n as f64 * p.k as f64 / (s.median_us * 1e-6) / 1e12;
    let weight_gbs = (active * p.n * p.k * 2) as f64 / (s.median_us * 1e-6) / 1e9;
    (tflops, weight_gbs)
}

/// Clocks and power state read by nvidia-smi, or why not.
fn clocks() -> String {
    match Command::new("nvidia-smi")
        .args(["--query-gpu=clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu", "--format=csv,noheader"])
        .output()
    {
        Ok(o) if o.status.success() => {
            format!("SM, mem, max SM, power, temp = {}", String::from_utf8_lossy(&o.stdout).trim())
        }
        _ => "nvidia-smi not available".into(),
    }
}

/// The floor of a GEMM point: max(bytes / read bandwidth, FLOPs / dense rate), bytes = active experts'
/// weights + A rows + D rows.
fn floor_us(p: &Point, c: &moe_gemm::ceilings::Ceilings) -> f64 {
    let rows: usize = p.sizes.iter().sum();
    let active = p.sizes.iter().filter(|&&s| s > 0).count();
    let bytes = 2.0 * (active * p.n * p.k + rows * p.k + rows * p.n) as f64;
    c.floor_us(bytes, 2.0 * rows as f64 * p.n as f64 * p.k as f64)
}

fn print_table(
    pts: &[Point],
    rows: &[Row],
    peer: &std::result::Result<PeerResults, String>,
    ceil: &moe_gemm::ceilings::Ceilings,
) {
    println!(
        "{:<36} {:>6} {:>4} {:>6} {:>6} {:<20} {:>10} {:>19} {:>8} {:>8} {:>9} {:>7} {:>10} {:>9}",
        "point",
        "rows",
        "E*",
        "N",
        "K",
        "config",
        "median µs",
        "p10-p90 µs",
        "TFLOP/s",
        "wGB/s",
        "floor µs",
        "x floor",
        "torch µs",
        "t/torch"
    );
    for r in rows {
        let p = &pts[r.point_idx];
        let (tf, gbs) = metrics(p, &r.stats);
        let total: usize = p.sizes.iter().sum();
        let active = p.sizes.iter().filter(|&&s| s > 0).count();
        let (peer_us, ratio) = match peer.as_ref().map(|m| m.get(&p.name)) {
            Ok(Some(Ok(us))) => (format!("{us:.1}"), format!("{:.3}", r.stats.median_us / us)),
            Ok(Some(Err(_))) => ("error".into(), "-".into()),
            _ => ("-".into(), "-".into()),
        };
        let floor = floor_us(p, ceil);
        println!(
            "{:<36} {:>6} {:>4} {:>6} {:>6} {:<20} {:>10.1} {:>19} {:>8.1} {:>8.0} {:>9.1} {:>7.2} {:>10} {:>9}",
            p.name,
            total,
            active,
            p.n,
            p.k,
            r.config.name(),
            r.stats.median_us,
            format!("{:.1}-{:.1}", r.stats.p10_us, r.stats.p90_us),
            tf,
            gbs,
            floor,
            r.stats.median_us / floor,
            peer_us,
            ratio
        );
    }
    match peer {
        Err(why) => println!("peer: {why}"),
        Ok(m) => {
            for (name, r) in m {
                if let Err(e) = r {
                    println!("peer error at {name}: {e}");
                }
            }
        }
    }
    println!("E* = experts with rows; wGB/s = E* x N x K x 2 bytes / median; floor = max((E* x N x K + rows x (N + K)) x 2 bytes / read BW, 2 x rows x N x K / dense rate); t/torch = our median / torch's (< 1: faster)");
}

fn write_json(
    path: &Path,
    info: &moe_gemm::DeviceInfo,
    pts: &[Point],
    rows: &[Row],
    peer: &std::result::Result<PeerResults, String>,
) -> Result<()> {
    let points: Vec<_> = rows
        .iter()
        .map(|r| {
            let p = &pts[r.point_idx];
            let (tf, gbs) = metrics(p, &r.stats);
            let peer_us = peer.as_ref().ok().and_then(|m| m.get(&p.name)).and_then(|r| r.as_ref().ok()).copied();
            serde_json::json!({
                "point": p.name, "gemm": p.gemm, "tokens": p.tokens, "routing": p.routing,
                "groups": p.groups, "n": p.n, "k": p.k, "rows": p.sizes.iter().sum::<usize>(),
                "config": r.config.name(), "median_us": r.stats.median_us, "p10_us": r.stats.p10_us,
                "p90_us": r.stats.p90_us, "tflops": tf, "weight_gbs": gbs, "torch_median_us": peer_us,
            })
        })
        .collect();
    let doc = serde_json::json!({"device": info.name, "sm_count": info.sm_count, "points": points});
    std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap())
        .map_err(|e| Error::InvalidProblem(format!("cannot write {}: {e}", path.display())))
}

/// Route (DeepSeek-V3 grouped sigmoid, E 256, k 8) + layout build (grouped), event-timed, next to the
/// DeepSeek-V3 expert GEMMs (w13 + w2, uniform routing) measured above at the same T.
fn bench_routing(stream: &Arc<CudaStream>, args: &BenchArgs, pts: &[Point], rows: &[Row]) -> Result<()> {
    use moe_gemm::layouts::{ExpertLayout, LayoutDims, LayoutSpec};
    use moe_gemm::{DeviceStatus, MatrixView, MatrixViewMut, Router, RouterConfig};
    let config = RouterConfig::deepseek_v3();
    let (e, k) = (config.experts(), config.top_k());
    let router = Router::new(stream, config)?;
    let mut none = None;
    println!(
        "route + layout (DeepSeek-V3 router: E 256, k 8, 8 groups keep 4; grouped layout), median of {} reps:",
        args.reps
    );
    println!(
        "{:>6} {:>10} {:>10} {:>10} {:>16} {:>10}",
        "T", "route µs", "layout µs", "sum µs", "GEMMs w13+w2 µs", "sum/GEMMs"
    );
    for tokens in [1usize, 64, 4096] {
        let mut rng = SplitMix64(tokens as u64);
        let logits: Vec<f32> = (0..tokens * e).map(|_| rng.unit() * 3.0).collect();
        let bias: Vec<f32> = (0..e).map(|_| rng.unit() * 0.1).collect();
        let l = stream.clone_htod(&logits)?;
        let b = stream.clone_htod(&bias)?;
        let mut ids = stream.alloc_zeros::<i32>(tokens * k)?;
        let mut w = stream.alloc_zeros::<f32>(tokens * k)?;
        let mut st = DeviceStatus::new(stream)?;
        let mut layout = ExpertLayout::new(stream, LayoutDims::new(LayoutSpec::Grouped, tokens, k, e, e)?)?;
        // The views are made per call (host only), so the layout build can read the ids between routes.
        let route_into = |ids: &mut cudarc::driver::CudaSlice<i32>, w: &mut _, st: &mut DeviceStatus| {
            let (mut iv, mut wv) = (MatrixViewMut::of("topk_ids", ids, k)?, MatrixViewMut::of("topk_weights", w, k)?);
            router.launch(stream, &MatrixView::of("logits", &l, e)?, Some(&b.as_view()), &mut iv, &mut wv, st)
        };
        let route = measure(stream, args.reps, args.warmup, &mut none, || route_into(&mut ids, &mut w, &mut st))?;
        let lay =
            measure(stream, args.reps, args.warmup, &mut none, || layout.build(stream, tokens, &ids, None, &mut st))?;
        let both = measure(stream, args.reps, args.warmup, &mut none, || {
            route_into(&mut ids, &mut w, &mut st)?;
            layout.build(stream, tokens, &ids, None, &mut st)
        })?;
        st.check(stream)?;
        // The best configuration of each DeepSeek-V3 GEMM at this T (one per point unless --config all).
        let gemm_us: f64 = (0..pts.len())
            .filter(|&j| {
                pts[j].name.starts_with("deepseek-v3/") && pts[j].tokens == tokens && pts[j].routing == "uniform"
            })
            .filter_map(|j| {
                rows.iter().filter(|r| r.point_idx == j).map(|r| r.stats.median_us).min_by(|a, b| a.total_cmp(b))
            })
            .sum();
        let (g, ratio) = if gemm_us > 0.0 {
            (format!("{gemm_us:.1}"), format!("{:.4}", both.median_us / gemm_us))
        } else {
            ("-".to_string(), "-".to_string())
        };
        println!(
            "{tokens:>6} {:>10.1} {:>10.1} {:>10.1} {g:>16} {ratio:>10}",
            route.median_us, lay.median_us, both.median_us
        );
    }
    Ok(())
}
