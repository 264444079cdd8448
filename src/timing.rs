//! Event timing of device work, the one way every benchmark here measures: behind an optional L2-flushing
//! memset and a 200 µs spin kernel (the host queues the work while the device is busy, so the events time
//! back-to-back execution, not the host's launch rate), after warm-ups, with the median and p10/p90.

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, CudaStream};

use crate::device;
use crate::error::Result;

/// Median and 10th/90th percentiles of the repetitions, in µs.
#[derive(Clone, Copy, Debug)]
pub struct Stats {
    pub median_us: f64,
    pub p10_us: f64,
    pub p90_us: f64,
}

/// Times `reps` runs of `work` (which must only queue work on `stream`) after `warmup` untimed ones; before
/// each timed run, `flush` (if any) is zeroed to evict L2.
///
/// # Errors
/// Whatever `work` or the driver returns.
pub fn measure(
    stream: &Arc<CudaStream>,
    reps: usize,
    warmup: usize,
    flush: &mut Option<CudaSlice<u8>>,
    mut work: impl FnMut() -> Result<()>,
) -> Result<Stats> {
    let ctx = stream.context();
    for _ in 0..warmup {
        work()?;
    }
    let mut times = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        if let Some(f) = flush.as_mut() {
            stream.memset_zeros(f)?;
        }
        let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        device::spin(stream, 200)?;
        start.record(stream)?;
        work()?;
        end.record(stream)?;
        times.push(start.elapsed_ms(&end)? as f64 * 1e3);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let n = times.len();
    let q = |p: f64| times[((p * n as f64) as usize).min(n - 1)];
    let median = if n % 2 == 1 { times[n / 2] } else { 0.5 * (times[n / 2 - 1] + times[n / 2]) };
    Ok(Stats { median_us: median, p10_us: q(0.1), p90_us: q(0.9) })
}
