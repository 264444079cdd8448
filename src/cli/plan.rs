//! `moe-gemm plan`: the device memory a model's MoE layers take (one shared scratch, one small plan per layer,
//! the weights), computed on the host by the code the library allocates with; no GPU needed.

use clap::Args;

use moe_gemm::dtype::DType;
use moe_gemm::layer::sizing::mib;
use moe_gemm::layer::{LayerShape, ScratchNeeds, WeightFormat};
use moe_gemm::parallel::{EpSizing, Placement};
use moe_gemm::{Backend, Backends, DeviceInfo, Error, LayerSizing, Result};

use super::args::{Model, MODELS};
use moe_gemm::tuning::TunedBackends;

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Models (default: every suite model with its real MoE layer count).
    #[arg(long, value_delimiter = ',')]
    pub model: Vec<String>,
    /// Tokens per pass (larger batches run as several passes).
    #[arg(long, default_value_t = 4096)]
    pub max_tokens: usize,
    /// MoE layers sharing the scratch (default: the model's).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Backends to make room for (default: Auto's: batched, fused, grouped, each for the batches Auto runs).
    #[arg(long, value_delimiter = ',')]
    pub backends: Vec<String>,
    /// Element type: bf16 or f16; or fp8: block-FP8 expert weights (e4m3, one f32 scale per 128 x 128 block)
    /// with bf16 activations, quantised to e4m3 on the fly (Batched, Grouped, Contiguous and Masked); or mxfp4:
    /// e2m1 expert weights with UE8M0 scales per 32 (gpt-oss), bf16 activations quantised to MXFP8 per group
    /// (Grouped, Contiguous and Masked).
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// SMs of the target device (the GEMM workspaces depend on it; H100/H200: 132).
    #[arg(long, default_value_t = 132)]
    pub sm_count: usize,
    /// Expert parallelism over N ranks (contiguous placement, E / N experts each; `--max-tokens` per rank): adds
    /// each rank's worst-case receive rows, local layer scratch and the bytes one step moves.
    #[arg(long)]
    pub ep: Option<usize>,
    /// Size Auto as a layer on this GPU does (the name `cuDeviceGetName` reports, e.g. "NVIDIA H200"): with the
    /// tuned table this crate ships for the model's E and I on it, whose backends get room too. Default: the
    /// cost model alone.
    #[arg(long)]
    pub gpu_name: Option<String>,
    /// Plan for a device of this compute capability (e.g. 10.0 for a B200, with `--sm-count 148`) as
    /// `MoeLayer::new` would there: its arch picks the layout backends' GEMM, and backends without SASS for it
    /// are refused by name. Default: the SM90 kernels.
    #[arg(long, value_parser = parse_capability)]
    pub compute_capability: Option<(i32, i32)>,
}

fn parse_capability(s: &str) -> std::result::Result<(i32, i32), String> {
    let bad = || format!("{s}: expected MAJOR.MINOR, e.g. 9.0 or 10.0");
    let (major, minor) = s.split_once('.').ok_or_else(bad)?;
    Ok((major.parse().map_err(|_| bad())?, minor.parse().map_err(|_| bad())?))
}

/// The device `--compute-capability` describes (nothing is queried: no GPU is needed).
fn described_device(args: &PlanArgs, (major, minor): (i32, i32)) -> DeviceInfo {
    let name =
        args.gpu_name.clone().unwrap_or_else(|| format!("a described device of compute capability {major}.{minor}"));
    DeviceInfo::described(name, (major, minor), args.sm_count as i32)
}

pub fn run(args: &PlanArgs) -> Result<()> {
    let (dtype, format) = match args.dtype.as_str() {
        "bf16" => (DType::BF16, WeightFormat::Dense),
        "f16" => (DType::F16, WeightFormat::Dense),
        "fp8" => (DType::BF16, WeightFormat::Fp8Block),
        "mxfp4" => (DType::BF16, WeightFormat::Mxfp4),
        d => return Err(Error::InvalidProblem(format!("--dtype {d}: expected bf16, f16, fp8 or mxfp4"))),
    };
    let elements = match format {
        WeightFormat::Fp8Block | WeightFormat::Mxfp4 => format!("{format} weights, {dtype} activations"),
        _ => dtype.to_string(),
    };
    let backends: Option<Backends> = if args.backends.is_empty() {
        None
    } else {
        let mut set = Backends::NONE;
        for b in &args.backends {
            let b = Backend::from_name(b).ok_or_else(|| {
                Error::InvalidProblem(format!(
                    "--backends {b}: expected eager, batched, grouped, contiguous, masked, fused or auto"
                ))
            })?;
            set = set.union(Backends::of(b));
        }
        Some(set)
    };
    let models: Vec<&Model> = if args.model.is_empty() {
        MODELS.iter().collect()
    } else {
        args.model
            .iter()
            .map(|n| {
                MODELS.iter().find(|m| m.name == n).ok_or_else(|| {
                    let names: Vec<&str> = MODELS.iter().map(|m| m.name).collect();
                    Error::InvalidProblem(format!("--model {n}: expected one of {}", names.join(", ")))
                })
            })
            .collect::<Result<_>>()?
    };
    // The placement of every model first: an E that does not split over the ranks fails before any output.
    if let Some(world) = args.ep {
        for m in &models {
            Placement::contiguous(m.experts, world).map_err(|e| match e {
                Error::InvalidProblem(s) => Error::InvalidProblem(format!("{} with --ep {world}: {s}", m.name)),
                e => e,
            })?;
        }
    }
    for m in models {
        let layers = args.layers.unwrap_or(m.layers);
        if m.shared_inter % m.inter != 0 {
            return Err(Error::InvalidProblem(format!(
                "{}: shared expert I_s = {} is not a multiple of I = {}",
                m.name, m.shared_inter, m.inter
            )));
        }
        // The shared expert rides in the routed GEMMs as I_s / I more groups of the routed width.
        let shared_groups = m.shared_inter / m.inter;
        let shape = LayerShape {
            experts: m.experts,
            global_experts: m.experts,
            top_k: m.top_k,
            shared_groups,
            hidden: m.hidden,
            inter: m.inter,
            gated: true,
        };
        // What MoeLayer::new takes on that GPU (a chosen backend set keeps the table's buckets of its backends).
        let tuned = args
            .gpu_name
            .as_deref()
            .and_then(|g| TunedBackends::shipped(g, format, m.experts, m.inter))
            .and_then(|t| backends.map_or(Some(t), |set| t.restricted_to(set)));
        // Without --compute-capability: an SM90 device of --sm-count SMs (the kernels the default plans size for).
        let cc = args.compute_capability.unwrap_or((9, 0));
        let device = described_device(args, cc);
        let (max_t, auto) = (args.max_tokens, Backend::Auto);
        let sizing =
            LayerSizing::for_device(&device, shape, dtype, format, max_t, auto, backends, None, None, false, tuned)
                .map_err(|e| Error::InvalidProblem(format!("{} on {}: {e}", m.name, device.name)))?;
        if let Some((major, minor)) = args.compute_capability {
            let gemm = sizing.gemm();
            println!("{}: planned for compute capability {major}.{minor}: layout backends' GEMM {gemm}", m.name);
        }
        match (&args.gpu_name, tuned.and_then(|t| t.shipped_file())) {
            (Some(g), Some(file)) => println!("{}: Auto from the table shipped for {g}: {file}", m.name),
            (Some(g), None) => {
                println!("{}: no table shipped for {g} and {format} weights: Auto from the cost model", m.name)
            }
            (None, _) => {}
        }
        // Every layer of a model has the same shape: the shared scratch is one layer's need, whatever the count.
        let mut needs: ScratchNeeds = *sizing.needs();
        for _ in 1..layers {
            needs = needs.max(*sizing.needs())?;
        }
        let fp = needs.footprint();
        let plan = sizing.plan_bytes(false);
        // FP8: one byte per e4m3 element and an f32 per 128 x 128 block.
        let weights = shape.groups() * shape.weight_bytes(format, dtype);
        // The room of each backend, as a forced one (and the error refusing it) counts it.
        let passes: Vec<String> =
            sizing.backends().iter().map(|b| format!("{b} {}", sizing.tokens_per_pass(b))).collect();
        let shared = if shared_groups > 0 {
            format!(
                ", shared expert I_s {} ({shared_groups} group{})",
                m.shared_inter,
                if shared_groups > 1 { "s" } else { "" }
            )
        } else {
            String::new()
        };
        println!(
            "{} ({layers} MoE layers, E {}, k {}, H {}, I {}{shared}, {elements}, max_tokens {}, backends {{{}}})",
            m.name,
            m.experts,
            m.top_k,
            m.hidden,
            m.inter,
            args.max_tokens,
            sizing.backends()
        );
        println!("  tokens per pass: {}", passes.join(", "));
        println!("shared scratch (one for all {layers} layers):\n{fp}");
        println!(
            "per-layer plan: {} B on the device (expert map), {} B on the host; x {layers} = {}",
            plan.device,
            plan.host,
            mib((plan.device + plan.host) * layers)
        );
        println!("weights: {} per layer, {} for {layers} layers", mib(weights), mib(weights * layers));
        println!(
            "total device bytes: {} (scratch {} + plans {} + weights {})\n",
            mib(fp.total() + plan.device * layers + weights * layers),
            mib(fp.total()),
            mib(plan.device * layers),
            mib(weights * layers)
        );
        if let Some(world) = args.ep {
            print_ep(m, shape, dtype, format, world, layers, args)?;
        }
    }
    Ok(())
}

/// The `--ep N` section of one model: per rank, for a contiguous placement.
fn print_ep(
    m: &Model,
    shape: LayerShape,
    dtype: DType,
    format: WeightFormat,
    world: usize,
    layers: usize,
    args: &PlanArgs,
) -> Result<()> {
    let placement = Placement::contiguous(m.experts, world)?;
    let routed = LayerShape { shared_groups: 0, ..shape };
    let ep = EpSizing::new(routed, dtype, format, &placement, args.max_tokens, args.sm_count)?;
    let local = placement.max_local_experts();
    let rank = (0..world).max_by_key(|&r| ep.recv_rows[r]).unwrap_or(0);
    let sizing = &ep.local[rank];
    let fp = sizing.needs().footprint();
    let plan = sizing.plan_bytes(true);
    let weights = local * routed.weight_bytes(format, dtype);
    let recv = ep.recv_buffer_bytes(rank);
    let t = args.max_tokens;
    println!(
        "expert parallel over {world} ranks (contiguous, {local} experts per rank, max_tokens {t} per rank{}):",
        if shape.shared_groups > 0 { "; shared expert not placed, not counted" } else { "" }
    );
    println!(
        "  receive rows per rank: worst {} (world x T x min(k, {local})), uniform routing T x k = {}",
        ep.recv_rows[rank],
        ep.send_rows()
    );
    println!(
        "  per step per rank: dispatch {} ({} rows of {} B + int32 ids + {world} int32 counts), combine {}; x {layers} layers = {}",
        mib(ep.dispatch_bytes()),
        ep.send_rows(),
        ep.row_bytes(),
        mib(ep.combine_bytes()),
        mib((ep.dispatch_bytes() + ep.combine_bytes()) * layers)
    );
    let (xd, xc) = ep.exchange_bytes();
    println!(
        "  NCCL step (ExpertParallel, fixed blocks of {} rows per peer, padding included): dispatch {}, combine {} per step per rank",
        ep.block_rows(),
        mib(xd),
        mib(xc)
    );
    println!(
        "  receive buffers (rows in, ids, rows out): {}; local layer: {} top-1 tokens, tokens per pass: {}",
        mib(recv),
        ep.recv_rows[rank],
        sizing.backends().iter().map(|b| format!("{b} {}", sizing.tokens_per_pass(b))).collect::<Vec<_>>().join(", ")
    );
    println!("  local layer scratch, for the worst case (one for all {layers} layers):\n{fp}");
    println!(
        "  per rank: weights {} per layer; total device bytes {} (scratch {} + receive buffers {} + plans {} + weights {})\n",
        mib(weights),
        mib(fp.total() + recv + (plan.device + weights) * layers),
        mib(fp.total()),
        mib(recv),
        mib(plan.device * layers),
        mib(weights * layers)
    );
    Ok(())
}
