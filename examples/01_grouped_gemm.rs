//! One grouped GEMM on the GPU, checked against the CPU reference: `D[r] = A[r] · B[g]ᵀ` for the rows of each
//! group, the groups of very different sizes (empty ones, one row, one past a tile), the offsets on the device as
//! a router writes them. Exits non-zero when an element is outside the GPU tests' tolerance.
//!
//! `cargo run --release --example 01_grouped_gemm` (needs an SM90 GPU; says so otherwise).

use std::process::ExitCode;

use half::bf16;
use moe_gemm::kernels::grouped::{GroupedGemm, GroupedGemmShape};
use moe_gemm::random::random_vec;
use moe_gemm::reference::{first_mismatch, grouped_gemm_rows, Tolerance};
use moe_gemm::{device, DeviceStatus, Result};

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("01_grouped_gemm: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool> {
    if !device::driver_present() {
        println!("no CUDA device: this example needs an SM90 GPU");
        return Ok(true);
    }
    let ctx = device::open(0)?;
    let stream = ctx.new_stream()?;

    // Eight experts' weights [G, N, K]; the rows of A already grouped by expert.
    let (n, k) = (512usize, 1024usize);
    let sizes = [0usize, 1, 5, 129, 64, 0, 17, 40];
    let (groups, rows) = (sizes.len(), sizes.iter().sum::<usize>());
    let plan = GroupedGemm::<bf16>::new(&stream, GroupedGemmShape::new(groups, n, k, rows)?, Default::default())?;
    let mut ws = plan.alloc_workspace(&stream)?;
    let mut status = DeviceStatus::new(&stream)?;

    let (a_host, b_host) = (random_vec::<bf16>(rows * k, 1, 1.0), random_vec::<bf16>(groups * n * k, 2, 0.05));
    let offsets: Vec<i32> = std::iter::once(0)
        .chain(sizes.iter().scan(0i32, |s, &r| {
            *s += r as i32;
            Some(*s)
        }))
        .collect();
    let (a, b, offsets_d) = (stream.clone_htod(&a_host)?, stream.clone_htod(&b_host)?, stream.clone_htod(&offsets)?);
    let mut d = stream.alloc_zeros::<bf16>(rows * n)?;
    plan.launch(&stream, &a, &b, &offsets_d, &mut d, &mut ws, &mut status)?;
    status.check(&stream)?; // offsets that break the contract would be reported here

    let got: Vec<f32> = stream.clone_dtoh(&d)?.iter().map(|v| v.to_f32()).collect();
    let all_rows: Vec<usize> = (0..rows).collect();
    let want = grouped_gemm_rows(&a_host, &b_host, &sizes, n, k, &all_rows);
    let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let tol = Tolerance::for_output::<bf16>(max);
    println!("{rows} rows in {groups} groups ({sizes:?}), N = {n}, K = {k}: tile {:?}", plan.config());
    if let Some((i, g, r)) = first_mismatch(&got, &want, tol) {
        eprintln!("01_grouped_gemm: D[{}, {}] = {g}, reference {r}: outside {tol:?}", i / n, i % n);
        return Ok(false);
    }
    println!("every element within {tol:?} of the reference");
    Ok(true)
}
