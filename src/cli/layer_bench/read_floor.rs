//! `bench --layer --read-floor`: the measured lower bound of a point, one streaming-read kernel over as many bytes
//! as the point's active experts hold, captured in a CUDA graph and timed over replays exactly as the layer is
//! (same flush, spin and repetitions), so that launch, flush and protocol costs sit in both numbers.

use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaSlice, CudaStream};
use moe_gemm::ceilings::ReadProbe;
use moe_gemm::{Error, Result};

use super::super::args::BenchArgs;

/// The median µs of one read of `bytes` through `probe`, timed as [`super::time_forward`] times a forward.
pub(super) fn time_read(
    stream: &Arc<CudaStream>,
    args: &BenchArgs,
    flush: &mut Option<CudaSlice<u8>>,
    probe: &mut ReadProbe,
    bytes: usize,
) -> Result<f64> {
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let queued = probe.queue(stream, bytes);
    let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
    queued?;
    let graph = graph.ok_or_else(|| Error::InvalidProblem("read floor: empty graph".into()))?;
    Ok(moe_gemm::timing::measure(stream, args.reps, 3, flush, || Ok(graph.launch()?))?.median_us)
}
