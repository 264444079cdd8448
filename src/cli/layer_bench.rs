//! `moe-gemm bench --layer`: the whole MoE expert layer (GEMM1 + activation + GEMM2 + combine, with the layout
//! work of each backend) on the model suite, per backend, captured in a CUDA graph and timed over replays with
//! L2 flushed, next to PyTorch's grouped_mm MLP (benches/peers/moe_layer_peer.py) on the same routing.

use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaStream;
use half::bf16;
use moe_gemm::kernels::fused::FusedTile;
use moe_gemm::random::{fill_device, SplitMix64};
use moe_gemm::{
    Activation, Backend, Backends, DeviceInfo, Error, ExpertWeights, GateUp, MatrixView, MatrixViewMut, MoeLayer,
    MoeLayerOptions, MoeScratch, Result,
};

use moe_gemm::ceilings::Ceilings;
use moe_gemm::tuning::{ConfigFile, ConfigName, LayerChoice};

use super::bench::{BenchArgs, Model, MODELS};

/// One timed entry: point index, backend asked, backend run, (median, p10, p90) µs or not timed.
type Timed = (usize, Backend, Backend, Option<(f64, f64, f64)>);

struct Point {
    model: &'static str,
    experts: usize,
    top_k: usize,
    hidden: usize,
    inter: usize,
    tokens: usize,
    ids: Vec<i32>,
    weights: Vec<f32>,
    /// The backend `Auto` picks here.
    auto: Backend,
    routing: &'static str,
    /// Expert-parallel degree: this GPU holds the experts `e` with `e % ep == 0` (1: all).
    ep: usize,
}

impl Point {
    fn name(&self) -> String {
        if self.routing == "uniform" {
            format!("{}/T={}", self.model, self.tokens)
        } else {
            format!("{}/T={}/{}", self.model, self.tokens, self.routing)
        }
    }
    /// max(active experts' weight bytes / read bandwidth, useful FLOPs / dense rate), as PERF_TARGETS.md
    /// defines it, with the ceilings measured in this run.
    fn floor_us(&self, c: &Ceilings) -> f64 {
        let mut active = vec![false; self.experts];
        let local = self.ids.iter().filter(|&&e| e as usize % self.ep == 0);
        local.clone().for_each(|&e| active[e as usize] = true);
        let n = active.iter().filter(|&&a| a).count() as f64;
        let bytes = n * 3.0 * (self.hidden * self.inter) as f64 * 2.0;
        let flops = 2.0 * 3.0 * (local.count() * self.hidden * self.inter) as f64;
        c.floor_us(bytes, flops)
    }
}

/// Routing of a benchmark point: each token picks k distinct experts (seeded) — uniformly, round-robin so
/// that every expert gets T·k/E rows (balanced), or with popularity ∝ 1/rank^1.2 (zipf, skewed); weights are a
/// softmax over the k of random logits.
fn routing(kind: &str, e: usize, k: usize, t: usize, seed: u64) -> Result<(Vec<i32>, Vec<f32>)> {
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

fn parse_backend(s: &str) -> Result<Backend> {
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
struct Shape {
    model: Model,
    tokens: Vec<usize>,
}

/// The suite models (at --layer-tokens), then the shapes of every --vllm-config file (at its token counts).
fn shapes(args: &BenchArgs) -> Result<Vec<Shape>> {
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
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// Per model and token bucket: the backend Auto picks, the tile configuration of each GEMM, and the measured
/// median of that backend, in vLLM's file format (dtype=bf16, this device's name).
fn write_configs(
    dir: &std::path::Path,
    info: &DeviceInfo,
    points: &[Point],
    results: &[Timed],
    fused_tile: Option<FusedTile>,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::InvalidProblem(format!("cannot create {}: {e}", dir.display())))?;
    let mut files: Vec<ConfigFile> = Vec::new();
    for (pi, p) in points.iter().enumerate().filter(|(_, p)| p.routing == points[0].routing) {
        let name = ConfigName {
            experts: p.experts,
            n: p.inter,
            device_name: ConfigName::device(&info.name),
            dtype: Some("bf16".into()),
            block_shape: None,
        };
        let median = results.iter().find(|r| r.0 == pi && r.2 == p.auto).and_then(|r| r.3).map(|t| t.0);
        let entry = LayerChoice {
            backend: p.auto,
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

/// `--fused-tile`: a tile name's size part (`64x128x64`), or none (the per-batch choice).
fn parse_fused_tile(name: Option<&str>) -> Result<Option<FusedTile>> {
    name.map(|n| {
        FusedTile::ALL
            .into_iter()
            .find(|t| t.name().ends_with(n))
            .ok_or_else(|| Error::InvalidProblem(format!("unknown fused tile {n:?}: expected 64x128x64 or 128x256x64")))
    })
    .transpose()
}

pub fn run(args: &BenchArgs, stream: &Arc<CudaStream>, info: &DeviceInfo, ceil: &Ceilings) -> Result<()> {
    let fused_tile = parse_fused_tile(args.fused_tile.as_deref())?;
    let backends: Vec<Backend> = args.backends.iter().map(|b| parse_backend(b)).collect::<Result<_>>()?;
    let mut flush = if args.no_flush { None } else { Some(stream.alloc_zeros::<u8>(512 << 20)?) };
    let mut points = Vec::new();
    let mut results: Vec<Timed> = Vec::new();
    let shapes = shapes(args)?;
    let routings: Vec<&'static str> = if args.suite {
        vec!["uniform", "balanced", "zipf"]
    } else {
        args.routing.iter().map(|r| leak(r.clone())).collect()
    };
    let bar = indicatif::ProgressBar::new(
        shapes.iter().map(|s| s.tokens.len() * routings.len() * backends.len()).sum::<usize>() as u64,
    );
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} points {msg} [{elapsed}]")
            .expect("static template"),
    );
    for shape in shapes {
        let m = &shape.model;
        bar.set_message(m.name);
        let (e, k, h, i) = (m.experts, m.top_k, m.hidden, m.inter);
        // Expert parallelism: this GPU holds every ep-th expert; routing still ranges over all of them.
        let ep = args.ep;
        let local_e = e / ep;
        let max_t = *shape.tokens.iter().max().unwrap_or(&1);
        let mut w13 = stream.alloc_zeros::<bf16>(local_e * 2 * i * h)?;
        let mut w2 = stream.alloc_zeros::<bf16>(local_e * h * i)?;
        fill_device(stream, &mut w13, 3, 0.02)?;
        fill_device(stream, &mut w2, 4, 0.02)?;
        let weights = ExpertWeights::from_device(
            local_e,
            h,
            i,
            GateUp::Concatenated,
            Activation::SiluGated,
            w13,
            w2,
            None,
            None,
        )?;
        let weights = Arc::new(weights);
        // Room for every backend measured (each at the largest T of the run) and for Auto's picks.
        let mut room: Backends = backends.iter().copied().filter(|&b| b != Backend::Auto).collect();
        room = room.union(if ep > 1 { Backends::of(Backend::Grouped) } else { Backends::AUTO });
        if ep > 1 {
            room = room.iter().filter(|&b| b != Backend::Batched).collect();
        }
        let opts = MoeLayerOptions::new(max_t, k).backends(room);
        let mut layer = if ep > 1 {
            let map: Vec<i32> = (0..e).map(|g| if g % ep == 0 { (g / ep) as i32 } else { -1 }).collect();
            MoeLayer::with_expert_map(stream, weights, opts, &map)?
        } else {
            MoeLayer::new(stream, weights, opts)?
        };
        layer.set_fused_tile(fused_tile);
        let mut scratch = MoeScratch::for_layers(stream, [&layer])?;
        let mut x = stream.alloc_zeros::<bf16>(max_t * h)?;
        fill_device(stream, &mut x, 5, 1.0)?;
        let mut y = stream.alloc_zeros::<bf16>(max_t * h)?;
        for (&t, kind) in shape.tokens.iter().flat_map(|t| routings.iter().map(move |r| (t, *r))) {
            let (ids, w) = routing(kind, e, k, t, 7 + t as u64)?;
            let ids_d = stream.clone_htod(&ids)?;
            let w_d = stream.clone_htod(&w)?;
            let xv = MatrixView::new("x", x.slice(..t * h), t, h)?;
            let idv = MatrixView::new("topk_ids", ids_d.as_view(), t, k)?;
            let wv = MatrixView::new("topk_weights", w_d.as_view(), t, k)?;
            layer.set_backend(Backend::Auto)?;
            let auto = layer.backend_for(t);
            points.push(Point {
                model: m.name,
                experts: e,
                top_k: k,
                hidden: h,
                inter: i,
                tokens: t,
                ids,
                weights: w,
                auto,
                routing: kind,
                ep,
            });
            let pi = points.len() - 1;
            for &b in &backends {
                let mut yv = MatrixViewMut::new("y", y.slice_mut(..t * h), t, h)?;
                // A backend this layer cannot run (Batched with an expert map) is reported, not timed.
                if layer.set_backend(b).is_err() {
                    results.push((pi, b, b, None));
                    bar.inc(1);
                    continue;
                }
                let ran = layer.backend_for(t);
                // Timed only where the batch runs in one pass (as a server would size its plan); a backend
                // whose pass is smaller (Masked past max_m, Batched past 4096 rows) is reported, not timed.
                if layer.passes(t)? > 1 {
                    results.push((pi, b, ran, None));
                    bar.inc(1);
                    continue;
                }
                let times = if ran == Backend::Eager {
                    None // synchronises: not capturable, not a serving path
                } else {
                    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
                    let queued = layer.forward(stream, &mut scratch, &xv, &idv, &wv, &mut yv);
                    let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
                    queued?;
                    let graph = graph.ok_or_else(|| Error::InvalidProblem("empty graph".into()))?;
                    {
                        let t = moe_gemm::timing::measure(stream, args.reps, 3, &mut flush, || Ok(graph.launch()?))?;
                        Some((t.median_us, t.p10_us, t.p90_us))
                    }
                };
                scratch.check(stream)?;
                results.push((pi, b, ran, times));
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    drop(flush);
    if let Some(dir) = &args.write_configs {
        write_configs(dir, info, &points, &results, fused_tile)?;
    }
    let (peer, extras) = run_peer(args, &points);
    println!(
        "MoE layer (bf16, SwiGLU, uniform top-k routing), {}: CUDA-graph replays, median of {}, L2 {}",
        info.name,
        args.reps,
        if args.no_flush { "not flushed" } else { "flushed" }
    );
    println!(
        "floor = max(active experts' weight bytes / read bandwidth, FLOPs / dense bf16 rate), ceilings measured above"
    );
    println!(
        "{:<34} {:<11} {:<11} {:>10} {:>17} {:>9} {:>8} {:>10} {:>8}",
        "point", "backend", "ran", "median µs", "p10-p90", "floor µs", "x floor", "torch µs", "t/torch"
    );
    for (pi, asked, ran, times) in &results {
        let p = &points[*pi];
        let floor = p.floor_us(ceil);
        let (peer_us, ratio) = match (&peer, times) {
            (Ok(m), Some((med, _, _))) => match m.get(&p.name()) {
                Some(Ok(us)) => (format!("{us:.1}"), format!("{:.3}", med / us)),
                _ => ("-".into(), "-".into()),
            },
            _ => ("-".into(), "-".into()),
        };
        match times {
            Some((med, p10, p90)) => println!(
                "{:<34} {:<11} {:<11} {:>10.1} {:>17} {:>9.1} {:>8.2} {:>10} {:>8}",
                p.name(),
                format!("{asked:?}"),
                format!("{ran:?}{}", if *ran == p.auto { "*" } else { "" }),
                med,
                format!("{p10:.1}-{p90:.1}"),
                floor,
                med / floor,
                peer_us,
                ratio
            ),
            None => {
                println!("{:<34} {:<11} {:<11} {:>10}", p.name(), format!("{asked:?}"), format!("{ran:?}"), "not timed")
            }
        }
    }
    if let Err(why) = &peer {
        println!("peer: {why}");
    }
    if !extras.is_empty() {
        println!("other PyTorch peers of the same points (µs; ratio = Auto's median / peer's):");
        for (pi, p) in points.iter().enumerate() {
            let Some(list) = extras.get(&p.name()) else { continue };
            let ours = results.iter().find(|r| r.0 == pi && r.2 == p.auto).and_then(|r| r.3).map(|t| t.0);
            let cells: Vec<String> = list
                .iter()
                .map(|(k, v)| match (v, ours) {
                    (Ok(us), Some(o)) => format!("{k} {us:.1} ({:.3})", o / us),
                    (Ok(us), None) => format!("{k} {us:.1}"),
                    (Err(why), _) => format!("{k}: {why}"),
                })
                .collect();
            println!("  {:<34} {}", p.name(), cells.join("  "));
        }
    }
    if let Some(dir) = &args.plots {
        plots(dir, ceil, &points, &results, &peer)?;
    }
    if let Some(path) = &args.json {
        let rows: Vec<serde_json::Value> = results
            .iter()
            .map(|(pi, asked, ran, times)| {
                let p = &points[*pi];
                let peers: serde_json::Map<String, serde_json::Value> = extras
                    .get(&p.name())
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| {
                        (k.clone(), v.as_ref().map_or_else(|e| serde_json::json!(e), |us| serde_json::json!(us)))
                    })
                    .collect();
                serde_json::json!({
                    "model": p.model, "tokens": p.tokens, "routing": p.routing, "experts": p.experts, "top_k": p.top_k,
                    "hidden": p.hidden, "inter": p.inter, "backend": format!("{asked:?}"), "ran": format!("{ran:?}"),
                    "auto": format!("{:?}", p.auto), "median_us": times.map(|t| t.0), "p10_us": times.map(|t| t.1),
                    "p90_us": times.map(|t| t.2), "floor_us": p.floor_us(ceil), "peers": peers,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "device": info.name, "sm_count": info.sm_count, "read_bytes_per_s": ceil.read_bytes_per_s,
            "bf16_flops": ceil.bf16_flops, "fp8_flops": ceil.fp8_flops, "reps": args.reps, "l2_flushed": !args.no_flush, "points": rows,
        });
        super::bench::write_file(path, &serde_json::to_string_pretty(&doc).expect("JSON values"))?;
    }
    if let Some(path) = &args.csv {
        let mut csv = String::from(
            "model,tokens,routing,backend,ran,auto,median_us,p10_us,p90_us,floor_us,x_floor,torch_us,ratio_torch\n",
        );
        for (pi, asked, ran, times) in &results {
            let p = &points[*pi];
            let floor = p.floor_us(ceil);
            let peer_us = peer.as_ref().ok().and_then(|m| m.get(&p.name())).and_then(|r| r.as_ref().ok()).copied();
            let (med, p10, p90) = times.map_or((None, None, None), |t| (Some(t.0), Some(t.1), Some(t.2)));
            let f = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.2}"));
            csv += &format!(
                "{},{},{},{asked:?},{ran:?},{:?},{},{},{},{floor:.2},{},{},{}\n",
                p.model,
                p.tokens,
                p.routing,
                p.auto,
                f(med),
                f(p10),
                f(p90),
                f(med.map(|m| m / floor)),
                f(peer_us),
                f(med.zip(peer_us).map(|(m, t)| m / t))
            );
        }
        super::bench::write_file(path, &csv)?;
    }
    println!("* = the backend Auto picks for this point");
    println!("t/torch = our median / PyTorch grouped_mm MLP median (< 1: faster); 'not timed': the batch needs more than one pass of the backend (masked past max_m, batched past 4096 rows) or the backend synchronises (eager)");
    Ok(())
}

type Peer = std::result::Result<super::peer::Medians, String>;
type Extras = super::peer::Extras;

fn run_peer(args: &BenchArgs, points: &[Point]) -> (Peer, Extras) {
    let spec = serde_json::json!({
        "reps": args.reps,
        "flush_bytes": if args.no_flush { 0 } else { 512usize << 20 },
        "points": points.iter().filter(|p| p.ep == 1).map(|p| serde_json::json!({
            "name": p.name(), "experts": p.experts, "top_k": p.top_k, "hidden": p.hidden, "inter": p.inter,
            "tokens": p.tokens, "ids": p.ids, "weights": p.weights,
        })).collect::<Vec<_>>(),
    });
    super::peer::run(&args.peer, "moe_layer_peer.py", None, &spec)
        .map(|r| (r.medians, r.extras))
        .map_or_else(|e| (Err(e), Extras::new()), |(m, x)| (Ok(m), x))
}

/// One SVG per model: Auto's backend, the best backend, the PyTorch peer and the floor against T.
fn plots(dir: &std::path::Path, ceil: &Ceilings, points: &[Point], results: &[Timed], peer: &Peer) -> Result<()> {
    use super::plot::{time_vs_tokens, Series};
    std::fs::create_dir_all(dir).map_err(|e| Error::InvalidProblem(format!("cannot create {}: {e}", dir.display())))?;
    let mut models: Vec<&str> = points.iter().map(|p| p.model).collect();
    models.dedup();
    // One plot per model for its uniform routing (the other routings are in the CSV and the table).
    for model in models {
        let mut auto = Series { label: "moe-gemm (Auto)".into(), points: vec![] };
        let mut best = Series { label: "moe-gemm (best backend)".into(), points: vec![] };
        let mut torch = Series { label: "PyTorch grouped_mm MLP".into(), points: vec![] };
        let mut floor = Series { label: "floor (measured ceilings)".into(), points: vec![] };
        for (pi, p) in points.iter().enumerate().filter(|(_, p)| p.model == model && p.routing == points[0].routing) {
            let t = p.tokens as f64;
            let times: Vec<(Backend, f64)> =
                results.iter().filter(|r| r.0 == pi).filter_map(|r| r.3.map(|x| (r.2, x.0))).collect();
            if let Some(&(_, us)) = times.iter().find(|(b, _)| *b == p.auto) {
                auto.points.push((t, us));
            }
            if let Some(us) = times.iter().map(|x| x.1).min_by(|a, b| a.total_cmp(b)) {
                best.points.push((t, us));
            }
            if let Ok(m) = peer {
                if let Some(Ok(us)) = m.get(&p.name()) {
                    torch.points.push((t, *us));
                }
            }
            floor.points.push((t, p.floor_us(ceil)));
        }
        let file = dir.join(format!("{}.svg", model.replace(['/', '[', ']', ',', '='], "_")));
        time_vs_tokens(&file, &format!("{model}: MoE layer, bf16, H200"), &[auto, best, torch, floor])?;
        println!("wrote {}", file.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::routing;

    fn counts(ids: &[i32], e: usize) -> Vec<usize> {
        let mut c = vec![0; e];
        ids.iter().for_each(|&x| c[x as usize] += 1);
        c
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
