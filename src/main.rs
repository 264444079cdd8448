//! `moe-gemm`: what was built and what the device can do (`info`), how fast it runs (`bench`), what memory a
//! model takes (`plan`), the measured backend per batch for `Auto` (`tune`), and how two benches' tables differ
//! (`compare`).

mod cli;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "moe-gemm", version, about = "CUTLASS-backed MoE grouped GEMMs for Hopper, from Rust")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per process
enum Command {
    /// Print the toolchain, the compiled architectures and kernel configurations, and the CUDA devices.
    Info,
    /// Time the grouped GEMM on real MoE model shapes (needs an SM90 GPU).
    Bench(cli::args::BenchArgs),
    /// Device memory of a model's MoE layers: the shared scratch, the per-layer plans, the weights (no GPU needed).
    Plan(cli::plan::PlanArgs),
    /// Measure every backend of a model's layer per token bucket on this GPU and write the fastest as a tuned
    /// file for `Auto` (`TunedBackends`, `MoeLayerOptions::tuned`).
    Tune(cli::tune::TuneArgs),
    /// Compare `bench --layer` tables (CSV or JSON) per point against the first: ratios and their geomean; runs
    /// of one binary joined by commas are merged by their lower median (no GPU needed).
    Compare(cli::compare::CompareArgs),
}

fn main() {
    moe_gemm::process::default_sigpipe();
    let args = Args::parse();
    let result = match args.command {
        Command::Info => cli::info::run(),
        Command::Bench(b) => cli::bench::run(b),
        Command::Plan(p) => cli::plan::run(&p),
        Command::Tune(t) => cli::tune::run(&t),
        Command::Compare(c) => {
            if let Err(e) = cli::compare::run(&c) {
                eprintln!("moe-gemm compare: {e}");
                std::process::exit(1);
            }
            Ok(())
        }
    };
    if let Err(e) = result {
        eprintln!("moe-gemm: {e}");
        std::process::exit(1);
    }
}
