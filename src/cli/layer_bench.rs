//! `moe-gemm bench --layer`: the whole MoE expert layer (GEMM1 + activation + GEMM2 + combine, with the layout
//! work of each backend) on the model suite, per backend, captured in a CUDA graph and timed over replays with
//! L2 flushed, next to PyTorch's grouped_mm MLP (benches/peers/moe_layer_peer.py) on the same routing.
//!
//! With `--dtype fp8` (or `mxfp4`: `MoeLayer<bf16, Mxfp4ExpertWeights>`, Grouped, Contiguous, Masked) the same run
//! also times the layer over block-FP8 experts (`MoeLayer<bf16,
//! Fp8ExpertWeights>`: e4m3 weights, one f32 scale per 128 x 128 block) at every point, on the backends of
//! `--backends` that FP8 runs (Batched, Grouped, Contiguous, Masked; Auto picks Batched or Grouped), each with its own floor (e4m3 +
//! scale bytes of the active experts / read bandwidth, FLOPs / the dense fp8 rate, both measured in the run)
//! and its ratio to the bf16 layer's Auto at the same point (timed in the same run; added when `--backends`
//! does not run it). The FP8 weights are random e4m3 bytes (no NaN codes) and random positive scales, copied
//! from one host block: the kernels' time does not depend on the values. Models whose H or I is not a multiple
//! of 128 (gpt-oss: 2880) have no FP8 layer and are reported as skipped.

use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaStream;
use half::bf16;
use moe_gemm::layer::{Fp8ChannelExpertWeights, GateUp, LayerWeights, WeightFormat};
use moe_gemm::random::fill_device;
use moe_gemm::{
    Activation, Backend, Backends, DeviceInfo, Error, ExpertWeights, MatrixView, MatrixViewMut, MoeLayer,
    MoeLayerOptions, MoeScratch, Result,
};

use moe_gemm::ceilings::{Ceilings, ReadProbe};

use super::args::{BenchArgs, BenchDtype};
use super::layer_fp8::{
    channel_weights, floor_terms, fp8_weights, mx_weights, plan, quant_backends, quant_skip_reason, LayerDtype,
    QuantLayer,
};
use super::layer_inputs::{leak, parse_backend, parse_fused_tiles, routing, shapes};
use super::peer::Headline;
use moe_gemm::kernels::fused::FusedTile;

mod configs;
mod csv;
mod point;

use point::{bf16_auto_us, Point, Timed};

/// Captures what `queue` queues on `stream` in a CUDA graph and times its replays (the layer and the read floor
/// alike: same flush, spin and repetitions).
fn time_graph(
    stream: &Arc<CudaStream>,
    args: &BenchArgs,
    flush: &mut Option<cudarc::driver::CudaSlice<u8>>,
    queue: impl FnOnce() -> Result<()>,
) -> Result<(f64, f64, f64)> {
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let queued = queue();
    let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
    queued?;
    let graph = graph.ok_or_else(|| Error::InvalidProblem("empty graph".into()))?;
    let t = moe_gemm::timing::measure(stream, args.reps, 3, flush, || Ok(graph.launch()?))?;
    Ok((t.median_us, t.p10_us, t.p90_us))
}

/// Times one forward of `layer` ([`time_graph`]); checks the scratch's status after.
#[allow(clippy::too_many_arguments)]
fn time_forward<W: LayerWeights<bf16>>(
    stream: &Arc<CudaStream>,
    args: &BenchArgs,
    flush: &mut Option<cudarc::driver::CudaSlice<u8>>,
    layer: &MoeLayer<bf16, W>,
    scratch: &mut MoeScratch<bf16>,
    x: &MatrixView<'_, bf16>,
    ids: &MatrixView<'_, i32>,
    w: &MatrixView<'_, f32>,
    y: &mut MatrixViewMut<'_, bf16>,
) -> Result<(f64, f64, f64)> {
    let t = time_graph(stream, args, flush, || layer.forward(stream, scratch, x, ids, w, y))?;
    scratch.check(stream)?;
    Ok(t)
}

pub fn run(args: &BenchArgs, stream: &Arc<CudaStream>, info: &DeviceInfo, ceil: &Ceilings) -> Result<()> {
    // One tile: the Fused backend's tile at every point. Several: Fused timed once per tile (`moe-gemm tune`).
    let fused_tiles = parse_fused_tiles(&args.fused_tile)?;
    let fused_tile = match fused_tiles[..] {
        [one] => Some(one),
        _ => None,
    };
    let tile_variants: Vec<Option<FusedTile>> =
        if fused_tiles.len() > 1 { fused_tiles.iter().copied().map(Some).collect() } else { vec![None] };
    let backends: Vec<Backend> = args.backends.iter().map(|b| parse_backend(b)).collect::<Result<_>>()?;
    // The quantised layer timed beside the bf16 one, and its backends: those of --backends it runs.
    let quant = match args.dtype {
        BenchDtype::Fp8 => Some(LayerDtype::Fp8),
        BenchDtype::Mxfp4 => Some(LayerDtype::Mxfp4),
        BenchDtype::Fp8Channel => Some(LayerDtype::Fp8Channel),
        BenchDtype::Bf16 => None,
    };
    let fp8 = quant.is_some();
    let qd = quant.unwrap_or(LayerDtype::Fp8);
    if let Some(d) = quant {
        super::layer_fp8::validate_quant(args, d)?;
    }
    let backends8 = quant.map_or_else(Vec::new, |d| quant_backends(d, &backends));
    // --quant-only (bench::run checks it comes with a quantised --dtype): the bf16 layer runs only as the
    // reference, its Auto, added below where layer8 exists.
    let backends = if args.quant_only { Vec::new() } else { backends };
    let mut flush = if args.no_flush { None } else { Some(stream.alloc_zeros::<u8>(512 << 20)?) };
    let mut points = Vec::new();
    let mut results: Vec<Timed> = Vec::new();
    let mut skipped: Vec<(&'static str, String)> = Vec::new();
    let shapes = shapes(args)?;
    let routings: Vec<&'static str> = if args.suite {
        vec!["uniform", "balanced", "zipf"]
    } else {
        args.routing.iter().map(|r| leak(r.clone())).collect()
    };
    let bar = indicatif::ProgressBar::new(
        shapes
            .iter()
            .map(|s| {
                let fused = backends.iter().filter(|&&b| b == Backend::Fused).count() * (tile_variants.len() - 1);
                s.tokens.len() * routings.len() * (backends.len() + fused + backends8.len())
            })
            .sum::<usize>() as u64,
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
        let mut opts = MoeLayerOptions::new(max_t, k).backends(room);
        opts = configs::with_table(opts, room, args, info, WeightFormat::Dense, m.name, e, i)?;
        let map: Vec<i32> = (0..e).map(|g| if g % ep == 0 { (g / ep) as i32 } else { -1 }).collect();
        let mut layer = if ep > 1 {
            MoeLayer::with_expert_map(stream, weights, opts, &map)?
        } else {
            MoeLayer::new(stream, weights, opts)?
        };
        layer.set_fused_tile(fused_tile);
        println!("{} (bf16): {}", m.name, layer.auto_source());
        // The quantised layer over experts of the same shape, where H and I allow it.
        let skip8 = quant.and_then(|d| quant_skip_reason(d, h, i));
        if let Some(why) = &skip8 {
            skipped.push((m.name, why.clone()));
        }
        let mut layer8 = if fp8 && skip8.is_none() {
            // Per-channel Batched and Fused take H and I in whole 128s (the decode kernels' blocks, the fused
            // GEMMs' N tiles): elsewhere they are reported, not timed, and Auto runs Grouped.
            let decodes = qd != LayerDtype::Fp8Channel
                || Fp8ChannelExpertWeights::check_backend_shape(Backend::Batched, h, i).is_ok();
            let auto8 = match qd {
                LayerDtype::Mxfp4 => Backends::of(Backend::Grouped),
                LayerDtype::Fp8Channel if !decodes => Backends::of(Backend::Grouped),
                _ => Backends::FP8_AUTO,
            };
            let room8: Backends = backends8
                .iter()
                .copied()
                .filter(|&b| b != Backend::Auto && !(ep > 1 && b == Backend::Batched))
                .filter(|&b| decodes || !matches!(b, Backend::Batched | Backend::Fused))
                .collect::<Backends>()
                .union(if ep > 1 { Backends::of(Backend::Grouped) } else { auto8 });
            let mut opts8 = MoeLayerOptions::new(max_t, k).backends(room8);
            if qd == LayerDtype::Fp8 {
                opts8 = configs::with_table(opts8, room8, args, info, WeightFormat::Fp8Block, m.name, e, i)?;
            }
            let map = (ep > 1).then_some(&map[..]);
            Some(match qd {
                LayerDtype::Mxfp4 => {
                    QuantLayer::Mx(plan(stream, Arc::new(mx_weights(stream, local_e, h, i)?), opts8, map)?)
                }
                LayerDtype::Fp8Channel => {
                    QuantLayer::Channel(plan(stream, Arc::new(channel_weights(stream, local_e, h, i)?), opts8, map)?)
                }
                _ => QuantLayer::Fp8(plan(stream, Arc::new(fp8_weights(stream, local_e, h, i)?), opts8, map)?),
            })
        } else {
            None
        };
        if let Some(l8) = &layer8 {
            println!("{} ({}): {}", m.name, qd.name(), l8.auto_source());
        }
        let mut scratch = MoeScratch::for_layers(stream, [&layer])?;
        let mut scratch8 = layer8.as_ref().map(|l| l.scratch(stream)).transpose()?;
        let mut x = stream.alloc_zeros::<bf16>(max_t * h)?;
        fill_device(stream, &mut x, 5, 1.0)?;
        let mut y = stream.alloc_zeros::<bf16>(max_t * h)?;
        // Room to read every local expert's bf16 bytes, the most any point of this model reads.
        let probe_bytes = floor_terms(LayerDtype::Bf16, local_e, 0, h, i).0 as usize;
        let mut probe = args.read_floor.then(|| ReadProbe::new(stream, probe_bytes)).transpose()?;
        for (&t, kind) in shape.tokens.iter().flat_map(|t| routings.iter().map(move |r| (t, *r))) {
            let (ids, w) = routing(kind, e, k, t, 7 + t as u64)?;
            let ids_d = stream.clone_htod(&ids)?;
            let w_d = stream.clone_htod(&w)?;
            let xv = MatrixView::new("x", x.slice(..t * h), t, h)?;
            let idv = MatrixView::new("topk_ids", ids_d.as_view(), t, k)?;
            let wv = MatrixView::new("topk_weights", w_d.as_view(), t, k)?;
            layer.set_backend(Backend::Auto)?;
            let auto = layer.backend_for(t);
            let auto_fp8 = match layer8.as_mut() {
                Some(l8) => {
                    l8.set_backend(Backend::Auto)?;
                    Some(l8.backend_for(t))
                }
                None => None,
            };
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
                auto_fp8,
                routing: kind,
                ep,
                read_us: Vec::new(),
            });
            let pi = points.len() - 1;
            if let Some(probe) = probe.as_mut() {
                let dtypes = [LayerDtype::Bf16].into_iter().chain(quant.filter(|_| layer8.is_some()));
                for d in dtypes {
                    let bytes = points[pi].terms(d).0 as usize;
                    // One streaming read of the floor's bytes under the layer's protocol: a measured lower bound.
                    let us = time_graph(stream, args, &mut flush, || probe.queue(stream, bytes))?.0;
                    points[pi].read_us.push((d, us));
                }
            }
            let entry = |asked, ran, times, dtype| Timed { point: pi, asked, ran, times, dtype, tile: None };
            // The bf16 backends asked, then (with --dtype fp8) bf16 Auto where no backend asked ran it (the
            // FP8 rows' reference), then the FP8 backends.
            for (n, &b) in backends.iter().chain([Backend::Auto].iter().filter(|_| layer8.is_some())).enumerate() {
                let extra = n >= backends.len();
                if extra && bf16_auto_us(&results, pi, &points[pi]).is_some() {
                    continue;
                }
                // A backend this layer cannot run (Batched with an expert map) is reported, not timed.
                if layer.set_backend(b).is_err() {
                    results.push(entry(b, b, None, LayerDtype::Bf16));
                    bar.inc(u64::from(!extra));
                    continue;
                }
                let ran = layer.backend_for(t);
                let variants = if b == Backend::Fused { &tile_variants[..] } else { &[None][..] };
                for &tile in variants {
                    let mut yv = MatrixViewMut::new("y", y.slice_mut(..t * h), t, h)?;
                    if tile.is_some() {
                        layer.set_fused_tile(tile);
                    }
                    // Timed only where the batch runs in one pass (as a server would size its plan); a backend
                    // whose pass is smaller (Masked past max_m, Batched past 4096 rows) is reported, not timed.
                    let times = if layer.passes(t)? > 1 {
                        None
                    } else if ran == Backend::Eager {
                        scratch.check(stream)?;
                        None // synchronises: not capturable, not a serving path
                    } else {
                        Some(time_forward(stream, args, &mut flush, &layer, &mut scratch, &xv, &idv, &wv, &mut yv)?)
                    };
                    if tile.is_some() {
                        layer.set_fused_tile(None);
                    }
                    results.push(Timed { tile, ..entry(b, ran, times, LayerDtype::Bf16) });
                    bar.inc(u64::from(!extra));
                }
            }
            let (Some(l8), Some(s8)) = (layer8.as_mut(), scratch8.as_mut()) else { continue };
            for &b in &backends8 {
                let mut yv = MatrixViewMut::new("y", y.slice_mut(..t * h), t, h)?;
                // Batched under --ep (no expert map), Batched or Fused per channel at H or I not in 128s:
                // reported, not timed.
                if l8.set_backend(b).is_err() {
                    results.push(entry(b, b, None, qd));
                    bar.inc(1);
                    continue;
                }
                let ran = l8.backend_for(t);
                let times = if l8.passes(t)? > 1 {
                    None
                } else {
                    Some(match l8 {
                        QuantLayer::Fp8(l) => time_forward(stream, args, &mut flush, l, s8, &xv, &idv, &wv, &mut yv)?,
                        QuantLayer::Mx(l) => time_forward(stream, args, &mut flush, l, s8, &xv, &idv, &wv, &mut yv)?,
                        QuantLayer::Channel(l) => {
                            time_forward(stream, args, &mut flush, l, s8, &xv, &idv, &wv, &mut yv)?
                        }
                    })
                };
                results.push(entry(b, ran, times, qd));
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    drop(flush);
    // Freed device memory returns to the driver's pool asynchronously and leaves this process only at a
    // synchronisation: the peer, another process, may need it (with --read-floor on an 80 GB GPU, DeepSeek-V3's
    // peer returned no figure before this synchronisation and did after; the first failure's cause was not kept).
    stream.synchronize()?;
    if let Some(dir) = &args.write_configs {
        configs::write_configs(dir, info, &points, &results, fused_tile, args.merge_configs)?;
    }
    let (peer, extras, headline) = run_peer(args, &points);
    if fp8 {
        let what = match qd {
            LayerDtype::Mxfp4 => "MXFP4 experts: e2m1, UE8M0 per 32, activations quantised to MXFP8 per group",
            LayerDtype::Fp8Channel => "per-channel FP8 experts: e4m3, f32 scale per output row, activations per token",
            _ => "block-FP8 experts: e4m3, f32 scale per 128 x 128, bf16 activations",
        };
        println!(
            "MoE layer (SwiGLU; bf16 experts and {what}), {}: CUDA-graph replays, median of {}, L2 {}",
            info.name,
            args.reps,
            if args.no_flush { "not flushed" } else { "flushed" }
        );
        println!(
            "floor (bf16 rows) = max(active experts' weight bytes / read bandwidth, FLOPs / dense bf16 rate); floor ({} rows) = max(active experts' {} bytes / read bandwidth, FLOPs / dense fp8 rate{}); ceilings measured above",
            qd.name(),
            if qd == LayerDtype::Mxfp4 { "e2m1 + scale-atom (padded extents)" } else { "e4m3 + scale" },
            if ceil.fp8_flops.is_none() { ": not measured, bytes term only" } else { "" }
        );
    } else {
        println!(
            "MoE layer (bf16, SwiGLU, uniform top-k routing), {}: CUDA-graph replays, median of {}, L2 {}",
            info.name,
            args.reps,
            if args.no_flush { "not flushed" } else { "flushed" }
        );
        println!(
            "floor = max(active experts' weight bytes / read bandwidth, FLOPs / dense bf16 rate), ceilings measured above"
        );
    }
    let head = format!(
        "{:<34} {:<11} {:<11} {:>10} {:>17} {:>9} {:>8} {:>10} {:>8}",
        "point", "backend", "ran", "median µs", "p10-p90", "floor µs", "x floor", "peer µs", "x peer"
    );
    let read_head = if args.read_floor { format!(" {:>9} {:>7}", "read µs", "x read") } else { String::new() };
    if fp8 {
        println!("{head} {:<5} {:>10} {:>7}{read_head}", "dtype", "bf16 Auto", "x bf16");
    } else {
        println!("{head}{read_head}");
    }
    for r in &results {
        let (ran, times) = (&r.ran, &r.times);
        let p = &points[r.point];
        let floor = p.floor_for(r.dtype, ceil);
        let (peer_us, ratio) = match (&peer, times) {
            (Ok(m), Some((med, _, _))) => match m.get(&p.name()) {
                Some(Ok(us)) => (format!("{us:.1}"), format!("{:.3}", med / us)),
                _ => ("-".into(), "-".into()),
            },
            _ => ("-".into(), "-".into()),
        };
        let reference = bf16_auto_us(&results, r.point, p);
        let tail = if fp8 {
            format!(
                " {:<5} {:>10} {:>7}",
                r.dtype.name(),
                reference.map_or("-".into(), |v| format!("{v:.1}")),
                times.zip(reference).map_or("-".into(), |(t, b)| format!("{:.3}", t.0 / b))
            )
        } else {
            String::new()
        };
        let read = p.read_for(r.dtype);
        let tail = if args.read_floor {
            let x = times.zip(read).map_or("-".into(), |(t, u)| format!("{:.2}", t.0 / u));
            format!("{tail} {:>9} {x:>7}", read.map_or("-".into(), |u| format!("{u:.1}")))
        } else {
            tail
        };
        let star = if Some(*ran) == p.auto_for(r.dtype) { "*" } else { "" };
        match times {
            Some((med, p10, p90)) => println!(
                "{:<34} {:<11} {:<11} {:>10.1} {:>17} {:>9.1} {:>8.2} {:>10} {:>8}{tail}",
                p.name(),
                r.label(),
                format!("{ran:?}{star}"),
                med,
                format!("{p10:.1}-{p90:.1}"),
                floor,
                med / floor,
                peer_us,
                ratio
            ),
            None if fp8 => println!(
                "{:<34} {:<11} {:<11} {:>10} {:>17} {:>9.1} {:>8} {:>10} {:>8}{tail}",
                p.name(),
                r.label(),
                format!("{ran:?}"),
                "not timed",
                "-",
                floor,
                "-",
                "-",
                "-"
            ),
            None => {
                println!("{:<34} {:<11} {:<11} {:>10}", p.name(), r.label(), format!("{ran:?}"), "not timed")
            }
        }
    }
    for (model, why) in &skipped {
        println!("{} skipped: {model}: {why}", qd.name());
    }
    match &peer {
        Err(why) => println!("peer: {why}"),
        Ok(_) => {
            for (name, why) in peer_errors(&peer, &points) {
                println!("peer at {name}: {why}");
            }
        }
    }
    if !extras.is_empty() {
        println!("other PyTorch peers of the same points (µs; ratio = Auto's median / peer's):");
        for (pi, p) in points.iter().enumerate() {
            let Some(list) = extras.get(&p.name()) else { continue };
            let ours = bf16_auto_us(&results, pi, p);
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
        plots(dir, ceil, &points, &results, &peer, &headline.text)?;
    }
    if let Some(path) = &args.json {
        let rows: Vec<serde_json::Value> = results
            .iter()
            .map(|r| {
                let (ran, times) = (&r.ran, &r.times);
                let p = &points[r.point];
                let peers: serde_json::Map<String, serde_json::Value> = extras
                    .get(&p.name())
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| {
                        (k.clone(), v.as_ref().map_or_else(|e| serde_json::json!(e), |us| serde_json::json!(us)))
                    })
                    .collect();
                let reference = bf16_auto_us(&results, r.point, p);
                let peer_error = peer.as_ref().ok().and_then(|m| m.get(&p.name())).and_then(|r| r.as_ref().err());
                serde_json::json!({
                    "model": p.model, "tokens": p.tokens, "routing": p.routing, "experts": p.experts, "top_k": p.top_k,
                    "hidden": p.hidden, "inter": p.inter, "backend": r.label(), "ran": format!("{ran:?}"),
                    "auto": p.auto_for(r.dtype).map(|b| format!("{b:?}")), "median_us": times.map(|t| t.0),
                    "p10_us": times.map(|t| t.1), "p90_us": times.map(|t| t.2),
                    "floor_us": p.floor_for(r.dtype, ceil), "peers": peers, "peer_error": peer_error, "dtype": r.dtype.name(),
                    "bf16_auto_us": reference, "x_bf16": times.zip(reference).map(|(t, b)| t.0 / b),
                    "read_us": p.read_for(r.dtype), "x_read": times.zip(p.read_for(r.dtype)).map(|(t, u)| t.0 / u),
                })
            })
            .collect();
        let skipped: Vec<serde_json::Value> =
            skipped.iter().map(|(m, why)| serde_json::json!({"model": m, "dtype": qd.name(), "reason": why})).collect();
        let doc = serde_json::json!({
            "device": info.name, "sm_count": info.sm_count, "read_bytes_per_s": ceil.read_bytes_per_s,
            "bf16_flops": ceil.bf16_flops, "fp8_flops": ceil.fp8_flops, "reps": args.reps, "l2_flushed": !args.no_flush,
            "peer_headline": headline.text, "peer_headline_id": headline.id, "points": rows,
            "skipped": skipped,
        });
        super::args::write_file(path, &serde_json::to_string_pretty(&doc).expect("JSON values"))?;
    }
    if let Some(path) = &args.csv {
        super::args::write_file(path, &csv::table(&results, &points, ceil, &peer, &extras, &headline))?;
    }
    println!("* = the backend Auto picks for this point");
    println!("peer = {}; x peer = our median / the peer's median (< 1: faster); 'not timed': the batch needs more than one pass of the backend (masked past max_m, batched past 4096 rows) or the backend synchronises (eager)", headline.text);
    if fp8 {
        let auto = match qd {
            LayerDtype::Mxfp4 => "the MXFP4 layer (Auto: Grouped; the block-scaled GEMM of this GPU's arch)",
            LayerDtype::Fp8Channel => "the layer over per-channel FP8 experts (Auto: Grouped; the rowwise GEMM, SM90)",
            _ => "the layer over block-FP8 experts (Auto: Batched or Grouped, auto_backend_fp8)",
        };
        println!("{} rows: {auto}; bf16 Auto = the bf16 layer's Auto median at the same point, this run; x bf16 = the row's median / it (< 1: faster than bf16)", qd.name());
    }
    if args.read_floor {
        println!("read µs = one streaming-read kernel over the point's active weight bytes of the row's dtype (the floor's bytes), captured and replayed as the layer is, L2 flushed: a measured lower bound; x read = the row's median / it");
    }
    Ok(())
}

type Peer = std::result::Result<super::peer::Medians, String>;
type Extras = super::peer::Extras;

/// The points the peer ran but has no headline figure for, each with the peer's reason (its `error`), in order.
fn peer_errors(peer: &Peer, points: &[Point]) -> Vec<(String, String)> {
    let Ok(m) = peer else { return Vec::new() };
    points.iter().filter_map(|p| m.get(&p.name())?.as_ref().err().map(|why| (p.name(), why.clone()))).collect()
}

/// The headline peer's medians (or why none), the other peers, and the headline's name.
fn run_peer(args: &BenchArgs, points: &[Point]) -> (Peer, Extras, Headline) {
    let spec = serde_json::json!({
        "reps": args.reps,
        "flush_bytes": if args.no_flush { 0 } else { 512usize << 20 },
        "points": points.iter().filter(|p| p.ep == 1).map(|p| serde_json::json!({
            "name": p.name(), "experts": p.experts, "top_k": p.top_k, "hidden": p.hidden, "inter": p.inter,
            "tokens": p.tokens, "ids": p.ids, "weights": p.weights,
        })).collect::<Vec<_>>(),
    });
    match super::peer::run(&args.peer, "moe_layer_peer.py", None, &spec) {
        Ok(r) => (Ok(r.medians), r.extras, r.headline),
        Err(e) => (Err(e), Extras::new(), Headline::default()),
    }
}

/// One SVG per model: Auto's backend, the best backend, the headline peer and the floor against T.
fn plots(
    dir: &std::path::Path,
    ceil: &Ceilings,
    points: &[Point],
    results: &[Timed],
    peer: &Peer,
    headline: &str,
) -> Result<()> {
    use super::plot::{time_vs_tokens, Series};
    std::fs::create_dir_all(dir).map_err(|e| Error::InvalidProblem(format!("cannot create {}: {e}", dir.display())))?;
    let mut models: Vec<&str> = points.iter().map(|p| p.model).collect();
    models.dedup();
    // One plot per model for its uniform routing (the other routings are in the CSV and the table).
    for model in models {
        let mut auto = Series { label: "moe-gemm (Auto)".into(), points: vec![] };
        let mut best = Series { label: "moe-gemm (best backend)".into(), points: vec![] };
        let mut torch = Series { label: headline.to_string(), points: vec![] };
        let mut floor = Series { label: "floor (measured ceilings)".into(), points: vec![] };
        let qd = results.iter().map(|r| r.dtype).find(|&d| d != LayerDtype::Bf16).unwrap_or(LayerDtype::Fp8);
        let mut auto8 = Series { label: format!("moe-gemm {} experts (Auto)", qd.name()), points: vec![] };
        let mut floor8 = Series { label: format!("{} floor (measured ceilings)", qd.name()), points: vec![] };
        for (pi, p) in points.iter().enumerate().filter(|(_, p)| p.model == model && p.routing == points[0].routing) {
            let t = p.tokens as f64;
            let times: Vec<(Backend, f64)> = results
                .iter()
                .filter(|r| r.point == pi && r.dtype == LayerDtype::Bf16)
                .filter_map(|r| r.times.map(|x| (r.ran, x.0)))
                .collect();
            let fp8_auto = results
                .iter()
                .find(|r| r.point == pi && r.dtype != LayerDtype::Bf16 && Some(r.ran) == p.auto_fp8)
                .and_then(|r| r.times);
            if let Some(t8) = fp8_auto {
                auto8.points.push((t, t8.0));
            }
            if p.auto_fp8.is_some() {
                floor8.points.push((t, p.floor_for(qd, ceil)));
            }
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
        let mut series = vec![auto, best, torch, floor];
        if !floor8.points.is_empty() {
            series.extend([auto8, floor8]);
        }
        time_vs_tokens(&file, &format!("{model}: MoE layer, bf16, H200"), &series)?;
        println!("wrote {}", file.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_the_peer_failed_is_reported_with_its_reason() {
        let point =
            |t: usize| Point { model: "deepseek-v3", ..point::tests::point(vec![0; 8 * t], 256, 8, 7168, 2048, 1) };
        let points = [point(1), point(2), point(4)];
        let mut m = super::super::peer::Medians::new();
        m.insert(points[0].name(), Ok(147.1));
        m.insert(points[1].name(), Err("OutOfMemoryError: CUDA out of memory".into()));
        // T = 4 has no entry at all: nothing to report for it here (the table shows '-').
        let peer: Peer = Ok(m);
        assert_eq!(
            peer_errors(&peer, &points),
            [("deepseek-v3/T=2".to_string(), "OutOfMemoryError: CUDA out of memory".to_string())]
        );
        assert!(peer_errors(&Err("peer skipped (--peer none)".into()), &points).is_empty());
    }
}
