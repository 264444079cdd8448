//! The device's ceilings, measured in the run that uses them: streaming HBM read bandwidth (a kernel of ours)
//! and the dense GEMM rates, bf16 (cuBLAS through cudarc) and fp8 e4m3 (cuBLASLt through cudarc), 8192³, random
//! data. A benchmark point's floor is `max(bytes / read bandwidth, FLOPs / dense rate of its dtype)`.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;

use crate::error::Result;
use crate::{device, ffi, random, timing};

/// Ceilings of one device, as measured.
#[derive(Clone, Copy, Debug)]
pub struct Ceilings {
    /// Bytes per second of a streaming read over 4 GiB (L2-cold).
    pub read_bytes_per_s: f64,
    /// Dense bf16 FLOP/s of cuBLAS on 8192 x 8192 x 8192, or `None` where libcublas cannot be loaded.
    pub bf16_flops: Option<f64>,
    /// Dense e4m3 x e4m3 -> bf16 FLOP/s of cuBLASLt on 8192³ (fp32 accumulation, unit scales), or `None`
    /// where libcublasLt cannot be loaded: the floor of fp8 points.
    pub fp8_flops: Option<f64>,
}

impl Ceilings {
    /// The floor, in µs, of moving `bytes` and computing `flops` (bf16); the rate term is dropped when
    /// there is no measured rate.
    pub fn floor_us(&self, bytes: f64, flops: f64) -> f64 {
        let mem = bytes / self.read_bytes_per_s;
        let math = self.bf16_flops.map_or(0.0, |r| flops / r);
        mem.max(math) * 1e6
    }

    /// The floor, in µs, of moving `bytes` and computing `flops` in e4m3 (the dense fp8 rate); as
    /// [`Self::floor_us`], the rate term is dropped when there is no measured fp8 rate.
    pub fn floor_fp8_us(&self, bytes: f64, flops: f64) -> f64 {
        let mem = bytes / self.read_bytes_per_s;
        let math = self.fp8_flops.map_or(0.0, |r| flops / r);
        mem.max(math) * 1e6
    }
}

/// Measures both ceilings on `stream`'s device (a few seconds, ~4.4 GiB of device memory).
pub fn measure(stream: &Arc<CudaStream>) -> Result<Ceilings> {
    let sm = device::DeviceInfo::query(stream.context())?.sm_count.max(1) as usize;
    let mut buf = stream.alloc_zeros::<bf16>(2 << 30)?; // 4 GiB
    random::fill_device(stream, &mut buf, 11, 1.0)?;
    let mut sink = stream.alloc_zeros::<u32>(sm * 4)?;
    let us = timing::measure(stream, 10, 1, &mut None, || {
        ffi::runtime::read_sweep(stream, &buf, buf.num_bytes(), &mut sink)
    })?
    .median_us;
    let read_bytes_per_s = buf.num_bytes() as f64 / (us * 1e-6);
    drop(buf);
    let bf16_flops = if ffi::cublas::cublas_present() {
        let n = 8192usize;
        let gemm = ffi::cublas::CublasBf16Gemm::new(stream, n)?;
        let mut a = stream.alloc_zeros::<bf16>(n * n)?;
        let mut b = stream.alloc_zeros::<bf16>(n * n)?;
        let mut c = stream.alloc_zeros::<bf16>(n * n)?;
        random::fill_device(stream, &mut a, 12, 1.0)?;
        random::fill_device(stream, &mut b, 13, 1.0)?;
        let us = timing::measure(stream, 10, 1, &mut None, || gemm.launch(&a, &b, &mut c))?.median_us;
        Some(2.0 * (n as f64).powi(3) / (us * 1e-6))
    } else {
        None
    };
    let fp8_flops = if ffi::cublas::cublaslt_present() {
        let n = 8192usize;
        let gemm = ffi::cublas::CublasLtFp8Gemm::new(stream, n)?;
        // Finite random e4m3 values (no NaN bit patterns), the same matrix for both operands.
        let mut rng = random::SplitMix64(14);
        let host: Vec<u8> = (0..n * n).map(|_| float8::F8E4M3::from_f32(rng.unit() * 2.0).to_bits()).collect();
        let a = stream.clone_htod(&host)?;
        let mut d = stream.alloc_zeros::<bf16>(n * n)?;
        let us = timing::measure(stream, 10, 1, &mut None, || gemm.launch(&a, &a, &mut d))?.median_us;
        Some(2.0 * (n as f64).powi(3) / (us * 1e-6))
    } else {
        None
    };
    Ok(Ceilings { read_bytes_per_s, bf16_flops, fp8_flops })
}

/// One streaming-read kernel (the one [`measure`] takes the read bandwidth with) over the first bytes of a buffer
/// of random data: timed by a benchmark under its points' own protocol over a point's active weight bytes, the
/// measured lower bound of any kernel chain that must read those bytes once (`bench --layer --read-floor`).
#[derive(Debug)]
pub struct ReadProbe {
    buf: CudaSlice<bf16>,
    sink: CudaSlice<u32>,
}

impl ReadProbe {
    /// Room for reads of up to `bytes` on `stream`'s device (`bytes` of device memory, allocated and filled now).
    pub fn new(stream: &Arc<CudaStream>, bytes: usize) -> Result<ReadProbe> {
        let sm = device::DeviceInfo::query(stream.context())?.sm_count.max(1) as usize;
        let mut buf = stream.alloc_zeros::<bf16>(bytes.div_ceil(16) * 8)?;
        random::fill_device(stream, &mut buf, 17, 1.0)?;
        Ok(ReadProbe { buf, sink: stream.alloc_zeros::<u32>(sm * 4)? })
    }

    /// The most bytes one read may take.
    pub fn capacity(&self) -> usize {
        self.buf.num_bytes()
    }

    /// Queues one read of the first `bytes` bytes (whole 16-byte vectors) on `stream`.
    ///
    /// # Errors
    /// `bytes` past [`Self::capacity`], or what the launch returns.
    pub fn queue(&mut self, stream: &Arc<CudaStream>, bytes: usize) -> Result<()> {
        ffi::runtime::read_sweep(stream, &self.buf, bytes, &mut self.sink)
    }
}

#[cfg(test)]
mod tests {
    use super::Ceilings;

    #[test]
    fn floors_take_the_larger_term_at_their_dtypes_rate() {
        let c = Ceilings { read_bytes_per_s: 4e12, bf16_flops: Some(800e12), fp8_flops: Some(1600e12) };
        // 4 MB at 4 TB/s = 1 µs; 1.6 GFLOP = 2 µs at bf16, 1 µs at fp8.
        assert!((c.floor_us(4e6, 1.6e9) - 2.0).abs() < 1e-9);
        assert!((c.floor_fp8_us(4e6, 1.6e9) - 1.0).abs() < 1e-9);
        assert!((c.floor_fp8_us(4e6, 6.4e9) - 4.0).abs() < 1e-9);
        let none = Ceilings { fp8_flops: None, ..c };
        assert!((none.floor_fp8_us(4e6, 6.4e9) - 1.0).abs() < 1e-9, "no fp8 rate: the bytes term alone");
    }
}
