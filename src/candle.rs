//! The MoE layer as an operation on candle tensors (`candle` feature): [`CandleMoe`] runs a [`MoeLayer`] over
//! bf16 hidden states `x [T, H]`, the router's `topk_ids [T, k]` (I32, or U32 as candle's arg-sort gives them) and
//! `topk_weights [T, k]` (F32), on candle's `CudaDevice` and its stream, writing `y [T, H]` (bf16).
//!
//! candle 0.11 and this crate share one cudarc (next to candle, build with `default-features = false, features =
//! ["candle", "cuda-dynamic-linking", "cuda-version-from-build-system"]`: docs/build.md), so candle's stream and
//! device slices are the types the layer takes: no copy of any activation. The op holds the layer (its weights
//! shared, uploaded once) and the scratch it runs in; [`CandleMoe::forward_into`] writes a caller's `y` through
//! candle's in-place op and allocates nothing, so a candle step that calls it can be captured in a CUDA graph;
//! [`CandleMoe::forward`] allocates `y` as candle ops do. Every tensor is checked before any launch: one that is
//! not on the op's CUDA device, not contiguous, of another dtype or shape is a `candle_core::Error` naming it.

use std::sync::{Arc, Mutex};

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::cuda_backend::cudarc;
use candle_core::cuda_backend::cudarc::driver::CudaStream;
use candle_core::cuda_backend::{CudaDevice, CudaStorage};
use candle_core::{CpuStorage, DType, Device, InplaceOp3, Layout, Storage, Tensor};
use half::bf16;

use crate::experts::{Activation, GateUp};
use crate::layer::{ExpertWeights, Fp8ExpertWeights, LayerWeights, MoeLayer, MoeLayerOptions, MoeScratch};
use crate::quant::{Fp8BlockWeights, GroupQuant, F8E4M3};
use crate::view::{MatrixView, MatrixViewMut};

fn err(m: String) -> candle_core::Error {
    candle_core::Error::msg(format!("moe-gemm: {m}"))
}

/// A [`MoeLayer`] over bf16 activations (bf16 or block-FP8 experts) on a candle `CudaDevice`, with its scratch.
pub struct CandleMoe<W: LayerWeights<bf16>> {
    layer: MoeLayer<bf16, W>,
    scratch: Mutex<MoeScratch<bf16>>,
    device: CudaDevice,
    stream: Arc<CudaStream>,
}

impl<W: LayerWeights<bf16>> std::fmt::Debug for CandleMoe<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shape = self.layer.sizing().shape();
        let (h, k) = (shape.hidden, shape.top_k);
        f.debug_struct("CandleMoe").field("hidden", &h).field("top_k", &k).finish_non_exhaustive()
    }
}

impl<W: LayerWeights<bf16>> CandleMoe<W> {
    /// The op for `layer`, planned on `device`'s stream (`MoeLayer::new(&device.cuda_stream(), ..)`), with a
    /// scratch of its own on that stream.
    ///
    /// # Errors
    /// A `candle_core::Error` with the crate's error: the layer's device is not `device`'s; the scratch's
    /// allocation.
    pub fn new(device: &CudaDevice, layer: MoeLayer<bf16, W>) -> candle_core::Result<Self> {
        let stream = device.cuda_stream();
        let scratch = MoeScratch::for_layers(&stream, [&layer]).map_err(|e| err(e.to_string()))?;
        Ok(CandleMoe { layer, scratch: Mutex::new(scratch), device: device.clone(), stream })
    }

    pub fn layer(&self) -> &MoeLayer<bf16, W> {
        &self.layer
    }

    /// `y = layer(x, topk_ids, topk_weights)`, `y` allocated on the device (one allocation, as candle's ops).
    ///
    /// # Errors
    /// As [`Self::forward_into`].
    pub fn forward(&self, x: &Tensor, topk_ids: &Tensor, topk_weights: &Tensor) -> candle_core::Result<Tensor> {
        let h = self.layer.sizing().shape().hidden;
        let t = self.check(x, "x", &[DType::BF16], None, h)?;
        let y = Tensor::zeros((t, h), DType::BF16, x.device())?;
        self.forward_into(&y, x, topk_ids, topk_weights)?;
        Ok(y)
    }

    /// Writes `layer(x, topk_ids, topk_weights)` into `y`, on candle's stream, allocating nothing.
    ///
    /// # Errors
    /// A `candle_core::Error` naming the tensor and the constraint, before any launch: a tensor not on this op's
    /// CUDA device, not contiguous, or of another dtype (x and y BF16, topk_ids I32 or U32, topk_weights F32) or shape
    /// (`x`, `y` `[T, H]` with the layer's H, `topk_ids`, `topk_weights` `[T, k]` with its k); `y` sharing
    /// memory with `x`; then the layer's own errors (a batch its plan cannot run, device-status reports).
    pub fn forward_into(
        &self,
        y: &Tensor,
        x: &Tensor,
        topk_ids: &Tensor,
        topk_weights: &Tensor,
    ) -> candle_core::Result<()> {
        let t = self.check_routed(y, x, topk_ids, topk_weights)?;
        // topk_weights (F32) cannot share candle storage with y (BF16): reading it inside the in-place op, whose
        // lock on y is held, cannot wait on that lock.
        y.inplace_op3(x, topk_ids, &Forward { moe: self, topk_weights, shared_weights: None, tokens: t })
    }

    /// As [`Self::forward`], for a layer whose shared expert has a weight per token (Qwen2-MoE:
    /// `shared_weights [T, 1]` F32 `= sigmoid(x · shared_expert_gate)`):
    /// `y = Σ_j w[t,j] · expert_j(x) + shared_weights[t] · shared(x)`.
    ///
    /// # Errors
    /// As [`Self::forward_with_shared_into`].
    pub fn forward_with_shared(
        &self,
        x: &Tensor,
        topk_ids: &Tensor,
        topk_weights: &Tensor,
        shared_weights: &Tensor,
    ) -> candle_core::Result<Tensor> {
        let h = self.layer.sizing().shape().hidden;
        let t = self.check(x, "x", &[DType::BF16], None, h)?;
        let y = Tensor::zeros((t, h), DType::BF16, x.device())?;
        self.forward_with_shared_into(&y, x, topk_ids, topk_weights, shared_weights)?;
        Ok(y)
    }

    /// As [`Self::forward_into`], with the shared expert's weight per token.
    ///
    /// # Errors
    /// As [`Self::forward_into`]; `shared_weights` not a contiguous F32 `[T, 1]` on the op's device; the layer's
    /// error for weights that hold no shared expert.
    pub fn forward_with_shared_into(
        &self,
        y: &Tensor,
        x: &Tensor,
        topk_ids: &Tensor,
        topk_weights: &Tensor,
        shared_weights: &Tensor,
    ) -> candle_core::Result<()> {
        let t = self.check_routed(y, x, topk_ids, topk_weights)?;
        self.check(shared_weights, "shared_weights", &[DType::F32], Some(t), 1)?;
        let op = Forward { moe: self, topk_weights, shared_weights: Some(shared_weights), tokens: t };
        y.inplace_op3(x, topk_ids, &op)
    }

    /// The batch `T` of `x`, after checking `x` and `y` (BF16 `[T, H]`), `topk_ids` (I32, or U32 as candle's
    /// arg-sort gives top-k ids) and `topk_weights` (F32), both `[T, k]`.
    fn check_routed(
        &self,
        y: &Tensor,
        x: &Tensor,
        topk_ids: &Tensor,
        topk_weights: &Tensor,
    ) -> candle_core::Result<usize> {
        let shape = self.layer.sizing().shape();
        let (h, k) = (shape.hidden, shape.top_k);
        let t = self.check(x, "x", &[DType::BF16], None, h)?;
        self.check(y, "y", &[DType::BF16], Some(t), h)?;
        self.check(topk_ids, "topk_ids", &[DType::I32, DType::U32], Some(t), k)?;
        self.check(topk_weights, "topk_weights", &[DType::F32], Some(t), k)?;
        Ok(t)
    }

    /// `t`'s rows (`rows` if given, else its own), after checking device, layout, dtype and columns.
    fn check(
        &self,
        t: &Tensor,
        name: &str,
        dtypes: &[DType],
        rows: Option<usize>,
        cols: usize,
    ) -> candle_core::Result<usize> {
        match t.device() {
            Device::Cuda(d) if d.same_device(&self.device) => {}
            d => {
                return Err(err(format!(
                    "{name} is on {:?}, the layer on CUDA device {:?}",
                    d.location(),
                    self.device.location()
                )))
            }
        }
        if !t.is_contiguous() {
            return Err(err(format!("{name} {:?} is not contiguous (strides {:?})", t.dims(), t.stride())));
        }
        if !dtypes.contains(&t.dtype()) {
            return Err(err(format!("{name} is {:?}, expected one of {dtypes:?}", t.dtype())));
        }
        let (r, c) = t.dims2().map_err(|_| err(format!("{name} has shape {:?}, expected 2 dimensions", t.dims())))?;
        if c != cols || rows.is_some_and(|want| want != r) {
            let want_rows = rows.map_or("T".to_string(), |r| r.to_string());
            return Err(err(format!("{name} is [{r}, {c}], expected [{want_rows}, {cols}]")));
        }
        Ok(r)
    }
}

impl CandleMoe<ExpertWeights<bf16>> {
    /// bf16 SwiGLU experts from candle tensors, `w13 [E, 2I, H]` (each expert's gate rows, then its up rows: how
    /// candle-transformers' `FusedMoe` packs `gate_proj` and `up_proj`) and `w2 [E, H, I]`, copied once on the
    /// device into the layer's weights, planned with `options` on `device`'s stream.
    ///
    /// # Errors
    /// A `candle_core::Error` naming the tensor: not on `device`, not contiguous, not BF16, or of shapes that do
    /// not chain (`w13` `[E, 2I, H]`, `w2` `[E, H, I]`); then the layer's planning errors.
    pub fn from_tensors(
        device: &CudaDevice,
        w13: &Tensor,
        w2: &Tensor,
        options: MoeLayerOptions,
    ) -> candle_core::Result<Self> {
        let (e, h, i) = routed_dims(device, w13, w2)?;
        let stream = device.cuda_stream();
        let copy = |t: &Tensor| copy_to::<bf16>(&stream, t);
        let weights = ExpertWeights::from_device(
            e,
            h,
            i,
            GateUp::Concatenated,
            Activation::SiluGated,
            copy(w13)?,
            copy(w2)?,
            None,
            None,
        )
        .map_err(|e| err(e.to_string()))?;
        Self::with_weights(device, weights, options)
    }

    /// As [`Self::from_tensors`], with a shared SwiGLU expert beside the routed ones (DeepSeek-V3's, Qwen2-MoE's):
    /// `shared_gate` and `shared_up` `[I_s, H]`, `shared_down` `[H, I_s]` (nn.Linear weights), `I_s` a multiple
    /// of the routed experts' `I`. The layer holds it as `I_s / I` more experts of the routed width (stacked
    /// here, once), which [`Self::forward`] adds with weight 1 (DeepSeek-V3) and [`Self::forward_with_shared`]
    /// with a weight per token (Qwen2-MoE's gate).
    ///
    /// # Errors
    /// As [`Self::from_tensors`]; a shared tensor not on `device`, not contiguous, not BF16, or of a shape that
    /// does not match (`[I_s, H]`, `[I_s, H]`, `[H, I_s]` with the routed `H`; `I_s` a positive multiple of `I`).
    pub fn from_tensors_with_shared(
        device: &CudaDevice,
        w13: &Tensor,
        w2: &Tensor,
        (shared_gate, shared_up, shared_down): (&Tensor, &Tensor, &Tensor),
        options: MoeLayerOptions,
    ) -> candle_core::Result<Self> {
        let (e, h, i) = routed_dims(device, w13, w2)?;
        for (t, name) in [(shared_gate, "shared_gate"), (shared_up, "shared_up"), (shared_down, "shared_down")] {
            bf16_on(device, t, name)?;
        }
        let is = shared_gate.dims2().map(|(r, _)| r).unwrap_or(0);
        for (t, name, want) in [
            (shared_gate, "shared_gate", (is, h)),
            (shared_up, "shared_up", (is, h)),
            (shared_down, "shared_down", (h, is)),
        ] {
            if t.dims2().ok() != Some(want) {
                return Err(err(format!(
                    "{name} has shape {:?}, expected {want:?} ([I_s, H] or [H, I_s], H = {h})",
                    t.dims()
                )));
            }
        }
        if is == 0 || is % i != 0 {
            return Err(err(format!(
                "the shared expert's I_s = {is} is not a positive multiple of the routed experts' I = {i}: its I_s / I \
                 groups must have the routed width"
            )));
        }
        let m = is / i;
        // Each group j is one more expert: w13 rows [gate rows jI..(j+1)I; up rows jI..(j+1)I], w2 the down
        // columns jI..(j+1)I.
        let (mut p13, mut p2) = (vec![w13.reshape((e * 2 * i, h))?], vec![w2.reshape((e * h, i))?]);
        for j in 0..m {
            p13.push(shared_gate.narrow(0, j * i, i)?);
            p13.push(shared_up.narrow(0, j * i, i)?);
            p2.push(shared_down.narrow(1, j * i, i)?.contiguous()?);
        }
        let (w13, w2) = (Tensor::cat(&p13, 0)?, Tensor::cat(&p2, 0)?);
        let stream = device.cuda_stream();
        let copy = |t: &Tensor| copy_to::<bf16>(&stream, t);
        let mut weights = ExpertWeights::from_device(
            e + m,
            h,
            i,
            GateUp::Concatenated,
            Activation::SiluGated,
            copy(&w13)?,
            copy(&w2)?,
            None,
            None,
        )
        .map_err(|e| err(e.to_string()))?;
        weights.dims.experts = e;
        weights.dims.shared_groups = m;
        Self::with_weights(device, weights, options)
    }

    fn with_weights(
        device: &CudaDevice,
        weights: ExpertWeights<bf16>,
        options: MoeLayerOptions,
    ) -> candle_core::Result<Self> {
        let layer = MoeLayer::new(&device.cuda_stream(), Arc::new(weights), options).map_err(|e| err(e.to_string()))?;
        CandleMoe::new(device, layer)
    }
}

/// `t` is a contiguous BF16 tensor on `device`.
fn bf16_on(device: &CudaDevice, t: &Tensor, name: &str) -> candle_core::Result<()> {
    match t.device() {
        Device::Cuda(d) if d.same_device(device) && t.is_contiguous() && t.dtype() == DType::BF16 => Ok(()),
        _ => Err(err(format!("{name} must be a contiguous BF16 tensor on the op's CUDA device"))),
    }
}

/// (E, H, I) of routed SwiGLU experts `w13 [E, 2I, H]`, `w2 [E, H, I]`, after checking device, layout and dtype.
fn routed_dims(device: &CudaDevice, w13: &Tensor, w2: &Tensor) -> candle_core::Result<(usize, usize, usize)> {
    bf16_on(device, w13, "w13")?;
    bf16_on(device, w2, "w2")?;
    let (e, i2, h) = w13.dims3().map_err(|_| err(format!("w13 has shape {:?}, expected [E, 2I, H]", w13.dims())))?;
    let dims2 = w2.dims3().map_err(|_| err(format!("w2 has shape {:?}, expected [E, H, I]", w2.dims())))?;
    if i2 % 2 != 0 || dims2 != (e, h, i2 / 2) {
        return Err(err(format!("w13 {:?} and w2 {:?}: expected [E, 2I, H] and [E, H, I]", w13.dims(), w2.dims())));
    }
    Ok((e, h, i2 / 2))
}

impl CandleMoe<Fp8ExpertWeights> {
    /// Block-FP8 SwiGLU experts from candle tensors: `w13` F8E4M3 `[E, 2I, H]` (gate rows, then up rows) and `w2`
    /// F8E4M3 `[E, H, I]`, each with its F32 dequantisation scales per 128 x 128 block (DeepSeek's
    /// `weight_scale_inv` stacked over experts: `[E, ceil(2I/128), ceil(H/128)]`, `[E, ceil(H/128),
    /// ceil(I/128)]`), copied once on the device; activations quantised by `quant` (the checkpoint family's:
    /// `checkpoint::Fp8Config::activation_quant`); planned with `options` on `device`'s stream.
    ///
    /// # Errors
    /// A `candle_core::Error` naming the tensor: not on `device`, not contiguous, of another dtype, or of shapes
    /// that do not chain; then the weights' constraints (`H`, `I` multiples of 128) and the layer's planning.
    pub fn from_fp8_tensors(
        device: &CudaDevice,
        (w13, w13_scales): (&Tensor, &Tensor),
        (w2, w2_scales): (&Tensor, &Tensor),
        quant: GroupQuant,
        options: MoeLayerOptions,
    ) -> candle_core::Result<Self> {
        let stream = device.cuda_stream();
        let to = |e: crate::Error| err(e.to_string());
        let block = |q: &Tensor, s: &Tensor, name: &str| -> candle_core::Result<Fp8BlockWeights> {
            for (t, dtype, what) in [(q, DType::F8E4M3, name.to_string()), (s, DType::F32, format!("{name}'s scales"))]
            {
                match t.device() {
                    Device::Cuda(d) if d.same_device(device) && t.is_contiguous() && t.dtype() == dtype => {}
                    _ => {
                        return Err(err(format!(
                            "{what} must be a contiguous {dtype:?} tensor on the op's CUDA device"
                        )))
                    }
                }
            }
            let (e, n, k) =
                q.dims3().map_err(|_| err(format!("{name} has shape {:?}, expected [E, N, K]", q.dims())))?;
            let q = copy_to::<F8E4M3>(&stream, q)?;
            let s = copy_to::<f32>(&stream, s)?;
            Fp8BlockWeights::new(q, s, e, n, k).map_err(|e| err(format!("{name}: {e}")))
        };
        let (w13, w2) = (block(w13, w13_scales, "w13")?, block(w2, w2_scales, "w2")?);
        let weights = Fp8ExpertWeights::from_device(Activation::SiluGated, GateUp::Concatenated, w13, w2, None, None)
            .map_err(to)?
            .with_activation_quant(quant);
        let layer = MoeLayer::new(&stream, Arc::new(weights), options).map_err(to)?;
        CandleMoe::new(device, layer)
    }
}

/// A device copy of contiguous CUDA tensor `t`'s elements (outside the launch path: weights, once).
fn copy_to<T: candle_core::cuda_backend::CudaDType + cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    t: &Tensor,
) -> candle_core::Result<cudarc::driver::CudaSlice<T>> {
    let (st, l) = t.storage_and_layout();
    let Storage::Cuda(c) = &*st else { return Err(err("not a CUDA tensor".into())) };
    let view = c.as_cuda_slice::<T>()?.slice(l.start_offset()..l.start_offset() + t.elem_count());
    stream.clone_dtod(&view).map_err(|e| err(e.to_string()))
}

/// The in-place op: `y` (dst) written from `x`, `topk_ids` (sources), `topk_weights` and the shared expert's
/// per-token weights, if given (read here).
struct Forward<'a, W: LayerWeights<bf16>> {
    moe: &'a CandleMoe<W>,
    topk_weights: &'a Tensor,
    shared_weights: Option<&'a Tensor>,
    tokens: usize,
}

impl<W: LayerWeights<bf16>> InplaceOp3 for Forward<'_, W> {
    fn name(&self) -> &'static str {
        "moe-gemm-layer"
    }

    fn cpu_fwd(
        &self,
        _: &mut CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<()> {
        Err(err("the MoE layer runs on CUDA tensors only".into()))
    }

    fn cuda_fwd(
        &self,
        y: &mut CudaStorage,
        yl: &Layout,
        x: &CudaStorage,
        xl: &Layout,
        ids: &CudaStorage,
        il: &Layout,
    ) -> candle_core::Result<()> {
        let moe = self.moe;
        let shape = moe.layer.sizing().shape();
        let (t, h, k) = (self.tokens, shape.hidden, shape.top_k);
        let (ws, wl) = self.topk_weights.storage_and_layout();
        let Storage::Cuda(ws) = &*ws else { return Err(err("topk_weights is not on a CUDA device".into())) };
        let range = |l: &Layout, n: usize| l.start_offset()..l.start_offset() + n;
        let xs = x.as_cuda_slice::<bf16>()?.slice(range(xl, t * h));
        let is = match ids.dtype() {
            DType::U32 => crate::ffi::runtime::u32_ids_as_i32(ids.as_cuda_slice::<u32>()?.slice(range(il, t * k))),
            _ => ids.as_cuda_slice::<i32>()?.slice(range(il, t * k)),
        };
        let wv = ws.as_cuda_slice::<f32>()?.slice(range(wl, t * k));
        let ys = y.as_cuda_slice_mut::<bf16>()?.slice_mut(range(yl, t * h));
        let to = |e: crate::Error| err(e.to_string());
        let xv = MatrixView::new("x", xs, t, h).map_err(to)?;
        let iv = MatrixView::new("topk_ids", is, t, k).map_err(to)?;
        let wv = MatrixView::new("topk_weights", wv, t, k).map_err(to)?;
        let mut yv = MatrixViewMut::new("y", ys, t, h).map_err(to)?;
        let mut scratch = moe.scratch.lock().map_err(|_| err("the op's scratch lock is poisoned".into()))?;
        let Some(sw) = self.shared_weights else {
            return moe.layer.forward(&moe.stream, &mut scratch, &xv, &iv, &wv, &mut yv).map_err(to);
        };
        let (ss, sl) = sw.storage_and_layout();
        let Storage::Cuda(ss) = &*ss else { return Err(err("shared_weights is not on a CUDA device".into())) };
        let sv =
            MatrixView::new("shared_weights", ss.as_cuda_slice::<f32>()?.slice(range(&sl, t)), t, 1).map_err(to)?;
        moe.layer.forward_with_shared_weights(&moe.stream, &mut scratch, &xv, &iv, &wv, &sv, &mut yv).map_err(to)
    }
}
