//! `moe-gemm bench --layer --ep W --nccl`: the NCCL expert-parallel step ([`ExpertParallel`]) over `W` GPUs of
//! this host, one communicator per device driven from one thread per rank, timed per phase (dispatch, the
//! local experts, combine) and whole, next to the all-reduce EP of `MoeLayer::with_expert_map` (every rank runs
//! all of its `T` tokens through its own experts, then an all-reduce of `y`) measured in the same run.
//!
//! Per point: `T` tokens per rank, uniform routing over all `E` experts (seeded per rank), contiguous placement
//! (`E / W` experts per rank, `E % W == 0`), bf16 weights of random values. Timing as the layer bench: CUDA
//! events, L2 flushed before each repetition unless `--no-flush`, a spin kernel ahead, median of `--reps`, per
//! rank; the table shows rank 0 and the slowest rank's step. Bytes on the links per step and rank are the
//! fixed-size NCCL blocks to the other ranks (`EpSizing::exchange_bytes` less the block a rank keeps); the link
//! bandwidth is NCCL's all-reduce bus bandwidth over 256 MiB measured in the same run (none with one rank).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nccl::{Comm, ReduceOp};
use half::bf16;
use moe_gemm::layer::GateUp;
use moe_gemm::parallel::{ExpertParallel, Placement, RankComm};
use moe_gemm::random::{fill_device, topk_ids};
use moe_gemm::timing::{measure, Stats};
use moe_gemm::{
    device, Activation, DeviceInfo, Error, ExpertWeights, MatrixView, MatrixViewMut, MoeLayer, MoeLayerOptions,
    MoeScratch, Result,
};

use super::args::{BenchArgs, Model, MODELS};

/// One rank's timings at one point.
struct RankTimes {
    dispatch: Stats,
    experts: Stats,
    combine: Stats,
    step: Stats,
    map_layer: Stats,
    all_reduce: Stats,
}

fn nccl_err(op: &'static str) -> impl Fn(cudarc::nccl::result::NcclError) -> Error {
    move |e| Error::Nccl { op, status: format!("{e:?}") }
}

/// Checks `--ep W --nccl` before any device work: `W` GPUs present, every model's `E` divisible by `W`.
///
/// # Errors
/// [`Error::InvalidProblem`] naming both numbers.
pub fn validate(args: &BenchArgs, devices: usize) -> Result<Vec<&'static Model>> {
    let w = args.ep;
    if w == 0 || w > devices {
        return Err(Error::InvalidProblem(format!("--ep {w} --nccl: needs {w} GPUs on this host, {devices} visible")));
    }
    let mut models = Vec::new();
    for name in &args.models {
        let m = MODELS
            .iter()
            .find(|m| m.name == name)
            .ok_or_else(|| Error::InvalidProblem(format!("--models {name}: not a suite model")))?;
        if m.experts % w != 0 {
            return Err(Error::InvalidProblem(format!(
                "--ep {w} --nccl: {} has E = {} experts, not divisible by the world size {w}",
                m.name, m.experts
            )));
        }
        models.push(m);
    }
    Ok(models)
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let devices = cudarc::driver::CudaContext::device_count()? as usize;
    let models = validate(args, devices)?;
    let w = args.ep;
    let ctxs: Vec<_> = (0..w).map(device::open).collect::<Result<_>>()?;
    let streams: Vec<Arc<CudaStream>> = ctxs.iter().map(|c| c.new_stream()).collect::<std::result::Result<_, _>>()?;
    let info = DeviceInfo::query(&ctxs[0])?;
    let comms = Comm::from_devices(streams).map_err(nccl_err("comm_init_all"))?;
    println!(
        "NCCL expert-parallel step over {w} x {} (one communicator per device, one thread per rank); {} reps, median; L2 {}",
        info.name,
        args.reps,
        args.l2()
    );
    let points: Vec<(&Model, usize)> =
        models.iter().flat_map(|&m| args.layer_tokens.iter().map(move |&t| (m, t))).collect();
    // One thread per rank owns its communicator for the whole run: the link bandwidth first, then every point
    // in the same order (each collective needs every rank).
    let per_rank: Vec<(Option<f64>, Vec<RankTimes>)> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(RankComm::new)
            .enumerate()
            .map(|(r, comm)| {
                let points = &points;
                s.spawn(move || -> Result<(Option<f64>, Vec<RankTimes>)> {
                    let mut comm = comm.into_inner();
                    let link = link_bandwidth(&comm, w, args)?;
                    let mut out = Vec::with_capacity(points.len());
                    for &(m, t) in points {
                        let placement = Placement::contiguous(m.experts, w)?;
                        let (times, back) = rank_point(comm, r, &placement, m, t, args)?;
                        comm = back;
                        out.push(times);
                    }
                    Ok((link, out))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect::<Result<Vec<_>>>()
    })?;
    let link = per_rank.iter().map(|r| r.0).fold(None, |a: Option<f64>, b| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    });
    match link {
        Some(bw) => println!("link: NCCL all-reduce bus bandwidth over 256 MiB, measured now: {:.0} GB/s", bw / 1e9),
        None => println!("link: one rank, nothing crosses a link (NCCL sends each block to the rank itself)"),
    }
    let per_rank: Vec<Vec<RankTimes>> = per_rank.into_iter().map(|r| r.1).collect();
    println!(
        "{:<28} {:>6} {:>11} {:>11} {:>11} {:>11} {:>11} {:>10} {:>10} {:>10} {:>8}",
        "point",
        "T/rank",
        "dispatch µs",
        "experts µs",
        "combine µs",
        "step µs",
        "slowest µs",
        "link MiB",
        "map µs",
        "allred µs",
        "step/AR"
    );
    for (j, &(m, t)) in points.iter().enumerate() {
        let placement = Placement::contiguous(m.experts, w)?;
        let shape = moe_gemm::layer::LayerShape {
            experts: m.experts,
            global_experts: m.experts,
            top_k: m.top_k,
            shared_groups: 0,
            hidden: m.hidden,
            inter: m.inter,
            gated: true,
        };
        let sizing = moe_gemm::parallel::EpSizing::new(
            shape,
            moe_gemm::dtype::DType::BF16,
            moe_gemm::layer::WeightFormat::Dense,
            &placement,
            t,
            info.sm_count as usize,
        )?;
        let (xd, xc) = sizing.exchange_bytes();
        // The block a rank sends to itself stays on the device.
        let on_links = (xd + xc) * (w - 1) / w;
        let r0 = &per_rank[0][j];
        let slowest = per_rank.iter().map(|x| x[j].step.median_us).fold(0f64, f64::max);
        let ar = r0.map_layer.median_us + r0.all_reduce.median_us;
        println!(
            "{:<28} {:>6} {:>11.1} {:>11.1} {:>11.1} {:>11.1} {:>11.1} {:>10.1} {:>10.1} {:>10.1} {:>8.2}",
            format!("{}/ep{w}", m.name),
            t,
            r0.dispatch.median_us,
            r0.experts.median_us,
            r0.combine.median_us,
            r0.step.median_us,
            slowest,
            on_links as f64 / (1 << 20) as f64,
            r0.map_layer.median_us,
            r0.all_reduce.median_us,
            r0.step.median_us / ar
        );
        if let Some(bw) = link {
            println!("{:<28} link time at the measured bandwidth: {:.1} µs", "", on_links as f64 / bw * 1e6);
        }
    }
    println!(
        "dispatch = layout by rank + row gather + NCCL exchange of rows and ids; experts = the local layer over \
         every received row; combine = NCCL exchange back + weighted sum over k; step = all three. map = the \
         all-reduce EP's local layer (MoeLayer::with_expert_map over all T tokens), allred = its NCCL all-reduce \
         of y; step/AR = step / (map + allred). link MiB = the fixed-size blocks to other ranks per step and rank \
         (padding included)."
    );
    Ok(())
}

/// NCCL's all-reduce bus bandwidth over 256 MiB of bf16 (`2 (W - 1) / W · bytes / time`) as this rank
/// measured it; `None` for one rank.
fn link_bandwidth(comm: &Comm, w: usize, args: &BenchArgs) -> Result<Option<f64>> {
    if w < 2 {
        return Ok(None);
    }
    let elems = (256usize << 20) / 2;
    let stream = comm.stream();
    let mut buf = stream.alloc_zeros::<bf16>(elems)?;
    let mut none = None;
    let st = measure(&stream, args.reps.min(10), 2, &mut none, || {
        comm.all_reduce_in_place(&mut buf, &ReduceOp::Sum).map(|_| ()).map_err(nccl_err("all_reduce"))
    })?;
    Ok(Some(2.0 * (w - 1) as f64 / w as f64 * (elems * 2) as f64 / (st.median_us * 1e-6)))
}

/// Rank `r`'s step and all-reduce EP at `t` tokens of `m`.
fn rank_point(
    comm: Comm,
    r: usize,
    placement: &Placement,
    m: &Model,
    t: usize,
    args: &BenchArgs,
) -> Result<(RankTimes, Comm)> {
    let stream = comm.stream();
    let (e, k, h, i) = (m.experts, m.top_k, m.hidden, m.inter);
    let local = placement.local_experts(r);
    let weights = |seed: u64| -> Result<Arc<ExpertWeights<bf16>>> {
        let mut w13 = stream.alloc_zeros::<bf16>(local * 2 * i * h)?;
        let mut w2 = stream.alloc_zeros::<bf16>(local * h * i)?;
        fill_device(&stream, &mut w13, seed, 0.02)?;
        fill_device(&stream, &mut w2, seed + 1, 0.02)?;
        let w =
            ExpertWeights::from_device(local, h, i, GateUp::Concatenated, Activation::SiluGated, w13, w2, None, None)?;
        Ok(Arc::new(w))
    };
    let weights = weights(10 + 2 * r as u64)?;
    let mut x = stream.alloc_zeros::<bf16>(t * h)?;
    fill_device(&stream, &mut x, 100 + r as u64, 1.0)?;
    let ids: CudaSlice<i32> = stream.clone_htod(&topk_ids(t, k, e, 200 + r as u64))?;
    let wts: CudaSlice<f32> = stream.clone_htod(&vec![1.0 / k as f32; t * k])?;
    let mut y = stream.alloc_zeros::<bf16>(t * h)?;
    let mut flush = args.flush_buffer(&stream)?;
    let (reps, warmup) = (args.reps, args.warmup);
    let xv = MatrixView::new("x", x.as_view(), t, h)?;
    let iv = MatrixView::new("topk_ids", ids.as_view(), t, k)?;
    let wv = MatrixView::new("topk_weights", wts.as_view(), t, k)?;
    let mut ep = ExpertParallel::new(comm, placement, weights.clone(), t, k)?;
    let mut yv = MatrixViewMut::new("y", y.as_view_mut(), t, h)?;
    let dispatch = measure(&stream, reps, warmup, &mut flush, || ep.dispatch(&xv, &iv))?;
    let experts = measure(&stream, reps, warmup, &mut flush, || ep.experts())?;
    let combine = measure(&stream, reps, warmup, &mut flush, || ep.combine(&wv, &mut yv))?;
    let step = measure(&stream, reps, warmup, &mut flush, || ep.forward(&xv, &iv, &wv, &mut yv))?;
    ep.check()?;
    let comm = ep.into_comm();
    // The all-reduce EP: every token through this rank's experts, then the sum over ranks.
    let map = placement.expert_map(r);
    let layer = MoeLayer::with_expert_map(&stream, weights, MoeLayerOptions::new(t, k), &map)?;
    let mut scratch = MoeScratch::for_layers(&stream, [&layer])?;
    let map_layer = measure(&stream, reps, warmup, &mut flush, || {
        let mut yv = MatrixViewMut::new("y", y.as_view_mut(), t, h)?;
        layer.forward(&stream, &mut scratch, &xv, &iv, &wv, &mut yv)
    })?;
    scratch.check(&stream)?;
    let all_reduce = measure(&stream, reps, warmup, &mut flush, || {
        comm.all_reduce_in_place(&mut y, &ReduceOp::Sum).map(|_| ()).map_err(nccl_err("all_reduce"))
    })?;
    Ok((RankTimes { dispatch, experts, combine, step, map_layer, all_reduce }, comm))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct A {
        #[command(flatten)]
        b: BenchArgs,
    }

    fn args(argv: &[&str]) -> BenchArgs {
        A::try_parse_from(["bench"].iter().chain(argv)).unwrap().b
    }

    #[test]
    fn the_world_must_fit_the_gpus_and_divide_every_models_experts() {
        let a = args(&["--layer", "--nccl", "--ep", "2", "--models", "deepseek-v3,mixtral-8x7b"]);
        assert_eq!(validate(&a, 2).unwrap().len(), 2);
        let e = validate(&a, 1).unwrap_err().to_string();
        assert!(e.contains("needs 2 GPUs") && e.contains("1 visible"), "{e}");
        let a = args(&["--layer", "--nccl", "--ep", "16", "--models", "mixtral-8x7b"]);
        let e = validate(&a, 16).unwrap_err().to_string();
        assert!(e.contains("E = 8") && e.contains("world size 16"), "{e}");
        let a = args(&["--layer", "--nccl", "--ep", "1", "--models", "nope"]);
        assert!(validate(&a, 1).unwrap_err().to_string().contains("not a suite model"));
    }
}
