//! moe-gemm inside a candle program: an expert GEMM on candle tensors, on candle's stream.
//!
//! It compiles only while candle and moe-gemm share one cudarc: the stream, the slices and the views that candle
//! hands out are the types moe-gemm's launches take, with no conversion.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaStream, CudaView};
use candle_core::cuda_backend::{CudaDevice, CudaStorage};
use candle_core::op::BackpropOp;
use candle_core::{DType, Device, Storage, Tensor};
use half::bf16;
use moe_gemm::kernels::grouped::{GroupedGemm, GroupedGemmOptions, GroupedGemmShape};
use moe_gemm::DeviceStatus;

/// The error of this crate: candle's or moe-gemm's.
#[derive(Debug)]
pub enum Error {
    Candle(candle_core::Error),
    MoeGemm(moe_gemm::Error),
    Input(&'static str),
}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error::Candle(e)
    }
}

impl From<moe_gemm::Error> for Error {
    fn from(e: moe_gemm::Error) -> Self {
        Error::MoeGemm(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// candle's stream, as moe-gemm takes it: a type error here means two cudarcs in the build.
pub fn moe_gemm_stream(device: &CudaDevice) -> Arc<moe_gemm::cudarc::driver::CudaStream> {
    let stream: Arc<CudaStream> = device.cuda_stream();
    stream
}

/// The device memory under a contiguous CUDA tensor of `T`, from its first element on.
fn with_view<T, R>(t: &Tensor, f: impl FnOnce(CudaView<'_, T>) -> Result<R>) -> Result<R>
where
    T: candle_core::cuda_backend::CudaDType,
{
    let (storage, layout) = t.storage_and_layout();
    if !layout.is_contiguous() {
        return Err(Error::Input("tensor not contiguous"));
    }
    let Storage::Cuda(cuda) = &*storage else { return Err(Error::Input("tensor not on a CUDA device")) };
    let slice: &CudaSlice<T> = cuda.as_cuda_slice::<T>()?;
    f(slice.slice(layout.start_offset()..layout.start_offset() + layout.shape().elem_count()))
}

/// `D[offsets[g]..offsets[g + 1]] = A[offsets[g]..offsets[g + 1]] · B[g]ᵀ` for bf16 tensors A `[rows, K]`,
/// B `[G, N, K]` and i32 offsets `[G + 1]`, queued with moe-gemm's grouped GEMM on the tensors' (candle's) stream.
/// Returns D `[rows, N]` as a candle tensor; moe-gemm's device status is checked before returning.
pub fn grouped_gemm(a: &Tensor, b: &Tensor, offsets: &Tensor) -> Result<Tensor> {
    let Device::Cuda(device) = a.device() else { return Err(Error::Input("A is not on a CUDA device")) };
    let (rows, k) = a.dims2()?;
    let (groups, n, kb) = b.dims3()?;
    if kb != k || a.dtype() != DType::BF16 || b.dtype() != DType::BF16 || offsets.dims1()? != groups + 1 {
        return Err(Error::Input("A [rows, K] and B [G, N, K] bf16, offsets [G + 1] i32"));
    }
    let stream = moe_gemm_stream(device);
    let plan =
        GroupedGemm::<bf16>::new(&stream, GroupedGemmShape::new(groups, n, k, rows)?, GroupedGemmOptions::default())?;
    let mut workspace = plan.alloc_workspace(&stream)?;
    let mut status = DeviceStatus::new(&stream)?;
    let mut d: CudaSlice<bf16> = stream.alloc_zeros(rows * n).map_err(moe_gemm::Error::from)?;
    with_view::<bf16, _>(a, |a| {
        with_view::<bf16, _>(b, |b| {
            with_view::<i32, _>(offsets, |offsets| {
                Ok(plan.launch(&stream, &a, &b, offsets, &mut d, &mut workspace, &mut status)?)
            })
        })
    })?;
    status.check(&stream)?;
    let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(d, device.clone()));
    Ok(Tensor::from_storage(storage, (rows, n), BackpropOp::none(), false))
}

/// The router's probabilities with candle-nn and a GQA helper of candle-transformers, so that both crates are
/// built with CUDA in this program too.
pub fn router_probs(logits: &Tensor, kv: Tensor, n_rep: usize) -> Result<(Tensor, Tensor)> {
    let probs = candle_nn::ops::softmax_last_dim(logits)?;
    Ok((probs, candle_transformers::utils::repeat_kv(kv, n_rep)?))
}

/// The crate's own candle operation (`candle` feature): a bf16 MoE layer over candle tensors, `y` written in place
/// on candle's stream. Built here so that the feature compiles against the candle a server links.
pub fn moe_step(
    device: &CudaDevice,
    layer: moe_gemm::MoeLayer<bf16>,
    x: &Tensor,
    topk_ids: &Tensor,
    topk_weights: &Tensor,
) -> Result<Tensor> {
    let op = moe_gemm::candle::CandleMoe::new(device, layer)?;
    let y = Tensor::zeros(x.dims(), DType::BF16, x.device())?;
    op.forward_into(&y, x, topk_ids, topk_weights)?;
    Ok(y)
}
