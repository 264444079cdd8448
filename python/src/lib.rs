//! `moe_gemm_torch._native`: moe-gemm's MoE layer on PyTorch's memory and current stream.
//!
//! The Python package (`moe_gemm_torch`) checks each tensor (dtype, device, shape, contiguity) and passes its
//! address; this module checks the extents again against the plan, wraps the memory without owning it
//! (`borrowed`) and queues the layer on PyTorch's stream: no copy, no allocation, no host synchronisation per
//! call, so a call can be captured by `torch.cuda.graph`.

mod borrowed;

use std::sync::Arc;

use half::bf16;
use moe_gemm::cudarc::driver::CudaStream;
use moe_gemm::quant::{Fp8BlockWeights, GroupQuant, ScaleRounding, F8E4M3, VLLM_EPS};
use moe_gemm::{
    Activation, DeviceStatus, Error, ExpertWeights, Fp8ExpertWeights, GateUp, MatrixView, MatrixViewMut, MoeLayer,
    MoeLayerOptions, MoeScratch, RouterConfig, RouterKind,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use borrowed::Borrowed;

/// A constraint the caller broke is a `ValueError`; the rest (driver, launch, device check) a `RuntimeError`.
fn py_err(e: Error) -> PyErr {
    match e {
        Error::InvalidProblem(_) | Error::Buffer { .. } => PyValueError::new_err(e.to_string()),
        e => PyRuntimeError::new_err(e.to_string()),
    }
}

fn value_err(msg: String) -> PyErr {
    PyValueError::new_err(msg)
}

/// `a · b · c` elements, or a `ValueError` naming the tensor whose element count overflows.
fn count(name: &str, dims: &[usize]) -> PyResult<usize> {
    dims.iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| value_err(format!("{name}: {dims:?} elements overflow usize")))
}

/// The weights a plan reads, by kind; the layer shares them through an `Arc`.
enum Plan {
    Dense(MoeLayer<bf16>),
    Fp8(MoeLayer<bf16, Fp8ExpertWeights>),
}

/// One MoE layer's plan over expert weights that PyTorch owns: `w1 [E, 2I, H]` (gate rows, then up rows, as
/// vLLM stores them) and `w2 [E, H, I]`, bf16 or e4m3 with f32 scales per 128 × 128 block.
#[pyclass(module = "moe_gemm_torch._native")]
struct Layer {
    plan: Option<Plan>,
    device: usize,
    hidden: usize,
    top_k: usize,
    max_tokens: usize,
}

#[pymethods]
impl Layer {
    /// `kind`: "bf16" or "fp8" (block FP8, `w1_scale [E, 2I/128, H/128]` and `w2_scale [E, H/128, I/128]` f32,
    /// activations quantised per token and 128 columns with vLLM's eps). `stream`: the CUstream the plan's
    /// small tables are written on.
    #[new]
    #[pyo3(signature = (device, stream, kind, experts, hidden, inter, top_k, max_tokens, w1, w2, w1_scale=0, w2_scale=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        device: usize,
        stream: u64,
        kind: &str,
        experts: usize,
        hidden: usize,
        inter: usize,
        top_k: usize,
        max_tokens: usize,
        w1: u64,
        w2: u64,
        w1_scale: u64,
        w2_scale: u64,
    ) -> PyResult<Self> {
        if kind != "bf16" && kind != "fp8" {
            return Err(value_err(format!("kind = {kind:?}: one of \"bf16\", \"fp8\"")));
        }
        // The constructors below take the buffers by value and drop them on an error, which would free PyTorch's
        // memory: every constraint they check is checked here first, by name.
        let align = if kind == "fp8" { 128 } else { 8 };
        for (name, v) in [("hidden size H", hidden), ("intermediate size I", inter)] {
            if v == 0 || v % align != 0 {
                return Err(value_err(format!(
                    "{name} = {v} must be a positive multiple of {align} for {kind} experts"
                )));
            }
        }
        if experts == 0 || top_k == 0 || top_k > experts || max_tokens == 0 {
            return Err(value_err(format!(
                "experts = {experts}, top_k = {top_k}, max_tokens = {max_tokens}: need 1 <= top_k <= experts and max_tokens >= 1"
            )));
        }
        let (n13, n2) = (count("w1", &[experts, 2 * inter, hidden])?, count("w2", &[experts, hidden, inter])?);
        let options = MoeLayerOptions::new(max_tokens, top_k);
        let ctx = borrowed::context(device).map_err(py_err)?;
        let s = borrowed::stream(&ctx, stream);
        let plan = match kind {
            "bf16" => {
                // SAFETY: the Python side checked w1 and w2: bf16, contiguous, on `device`, of these shapes.
                let (a, b) = unsafe { (Borrowed::<bf16>::new(&s, w1, n13), Borrowed::<bf16>::new(&s, w2, n2)) };
                let w = ExpertWeights::from_device(
                    experts,
                    hidden,
                    inter,
                    GateUp::Concatenated,
                    Activation::SiluGated,
                    a.into_slice(),
                    b.into_slice(),
                    None,
                    None,
                )
                .map_err(py_err)?;
                let w = Arc::new(w);
                match MoeLayer::new(&s, w.clone(), options) {
                    Ok(l) => Plan::Dense(l),
                    Err(e) => {
                        release_dense(w);
                        return Err(py_err(e));
                    }
                }
            }
            "fp8" => {
                if w1_scale == 0 || w2_scale == 0 {
                    return Err(value_err("fp8 experts need w1_scale and w2_scale".into()));
                }
                let (s13, s2) = (
                    count("w1_scale", &[experts, 2 * inter / 128, hidden / 128])?,
                    count("w2_scale", &[experts, hidden / 128, inter / 128])?,
                );
                // SAFETY: the Python side checked w1, w2 (float8_e4m3fn) and their scales (float32): contiguous,
                // on `device`, of these shapes.
                let (a, b, sa, sb) = unsafe {
                    (
                        Borrowed::<F8E4M3>::new(&s, w1, n13),
                        Borrowed::<F8E4M3>::new(&s, w2, n2),
                        Borrowed::<f32>::new(&s, w1_scale, s13),
                        Borrowed::<f32>::new(&s, w2_scale, s2),
                    )
                };
                let w13 = Fp8BlockWeights::new(a.into_slice(), sa.into_slice(), experts, 2 * inter, hidden);
                let w2 = Fp8BlockWeights::new(b.into_slice(), sb.into_slice(), experts, hidden, inter);
                let (w13, w2) = match (w13, w2) {
                    (Ok(w13), Ok(w2)) => (w13, w2),
                    // Not reached (the lengths were computed above); the one that was made is let go, not freed.
                    (w13, w2) => {
                        let mut first = None;
                        for r in [w13, w2] {
                            match r {
                                Ok(w) => {
                                    let (q, s) = w.into_parts();
                                    borrowed::release(q);
                                    borrowed::release(s);
                                }
                                Err(e) => {
                                    first.get_or_insert(e);
                                }
                            }
                        }
                        return Err(py_err(first.expect("one of the two failed")));
                    }
                };
                let w = Fp8ExpertWeights::from_device(Activation::SiluGated, GateUp::Concatenated, w13, w2, None, None)
                    .map_err(py_err)?;
                // vLLM's per-token-group quantiser: s = max(amax, 1e-10) / 448, not rounded.
                let quant = GroupQuant::new(VLLM_EPS, ScaleRounding::Exact).map_err(py_err)?;
                let w = Arc::new(w.with_activation_quant(quant));
                match MoeLayer::new(&s, w.clone(), options) {
                    Ok(l) => Plan::Fp8(l),
                    Err(e) => {
                        release_fp8(w);
                        return Err(py_err(e));
                    }
                }
            }
            _ => unreachable!("kind checked above"),
        };
        // The plan's tables were written on `stream`; the layer may run on any stream of the device (a graph's
        // capture stream): let them land first. Plan time, not the launch path.
        s.synchronize().map_err(|e| py_err(e.into()))?;
        Ok(Layer { plan: Some(plan), device, hidden, top_k, max_tokens })
    }

    #[getter]
    fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The backend the layer runs for `tokens` tokens (Auto's choice, or the forced one).
    fn backend_for(&self, tokens: usize) -> String {
        match self.plan.as_ref() {
            Some(Plan::Dense(l)) => format!("{:?}", l.backend_for(tokens)),
            Some(Plan::Fp8(l)) => format!("{:?}", l.backend_for(tokens)),
            None => String::new(),
        }
    }

    /// `y [T, H] = Σ_k w[t, k] · expert_{ids[t, k]}(x[t])` on the scratch's stream, `x`, `y` bf16 `[T, H]`,
    /// `ids` int32 and `weights` float32 `[T, k]`. Allocates nothing: the stream wrapper is the scratch's.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        scratch: &mut Scratch,
        tokens: usize,
        x: u64,
        topk_ids: u64,
        topk_weights: u64,
        y: u64,
    ) -> PyResult<()> {
        let (h, k) = (self.hidden, self.top_k);
        if tokens > self.max_tokens {
            return Err(value_err(format!("{tokens} tokens: the plan holds at most max_tokens = {}", self.max_tokens)));
        }
        let s = scratch.stream.clone();
        s.context().bind_to_thread().map_err(|e| py_err(e.into()))?;
        let (nx, nk) = (count("hidden_states", &[tokens, h])?, count("topk_ids", &[tokens, k])?);
        // SAFETY: the Python side checked each tensor: dtype, contiguous, on the layer's device, of these shapes.
        let (xb, ib, wb, mut yb) = unsafe {
            (
                Borrowed::<bf16>::new(&s, x, nx),
                Borrowed::<i32>::new(&s, topk_ids, nk),
                Borrowed::<f32>::new(&s, topk_weights, nk),
                Borrowed::<bf16>::new(&s, y, nx),
            )
        };
        let xv = MatrixView::of("hidden_states", &xb, h).map_err(py_err)?;
        let iv = MatrixView::of("topk_ids", &ib, k).map_err(py_err)?;
        let wv = MatrixView::of("topk_weights", &wb, k).map_err(py_err)?;
        let mut yv = MatrixViewMut::of("out", &mut yb, h).map_err(py_err)?;
        let out = match self.plan.as_ref() {
            Some(Plan::Dense(l)) => l.forward(&s, &mut scratch.inner, &xv, &iv, &wv, &mut yv),
            Some(Plan::Fp8(l)) => l.forward(&s, &mut scratch.inner, &xv, &iv, &wv, &mut yv),
            None => return Err(PyRuntimeError::new_err("the layer was released")),
        };
        out.map_err(py_err)
    }
}

impl Layer {
    fn stream(&self, handle: u64) -> PyResult<Arc<CudaStream>> {
        let ctx = borrowed::context(self.device).map_err(py_err)?;
        Ok(borrowed::stream(&ctx, handle))
    }

    fn needs(&self) -> Option<&moe_gemm::layer::ScratchNeeds> {
        match self.plan.as_ref()? {
            Plan::Dense(l) => Some(l.needs()),
            Plan::Fp8(l) => Some(l.needs()),
        }
    }
}

impl Drop for Layer {
    fn drop(&mut self) {
        // The plan first (it holds the weights' other Arc), then the weights' buffers, leaked: PyTorch owns them.
        match self.plan.take() {
            Some(Plan::Dense(l)) => {
                let w = l.weights().clone();
                drop(l);
                release_dense(w);
            }
            Some(Plan::Fp8(l)) => {
                let w = l.weights().clone();
                drop(l);
                release_fp8(w);
            }
            None => {}
        }
    }
}

/// Lets go of dense weights over PyTorch's memory without freeing it (if another owner holds them, they are
/// forgotten instead: a few bytes of host memory, never a free of PyTorch's).
fn release_dense(w: Arc<ExpertWeights<bf16>>) {
    match Arc::try_unwrap(w) {
        Ok(w) => {
            let (a, b, c, d) = w.into_device();
            borrowed::release(a);
            borrowed::release(b);
            c.into_iter().chain(d).for_each(borrowed::release);
        }
        Err(w) => std::mem::forget(w),
    }
}

fn release_fp8(w: Arc<Fp8ExpertWeights>) {
    match Arc::try_unwrap(w) {
        Ok(w) => {
            let (a, b, c, d) = w.into_device();
            for blocks in [a, b] {
                let (q, s) = blocks.into_parts();
                borrowed::release(q);
                borrowed::release(s);
            }
            c.into_iter().chain(d).for_each(borrowed::release);
        }
        Err(w) => std::mem::forget(w),
    }
}

/// The layers' working memory on one stream (the crate's `MoeScratch`, owned here, allocated once): one per
/// (device, stream), shared by every layer that runs there, grown when a layer needs more.
#[pyclass(module = "moe_gemm_torch._native")]
struct Scratch {
    inner: MoeScratch<bf16>,
    /// The PyTorch stream it serves, wrapped once.
    stream: Arc<CudaStream>,
}

#[pymethods]
impl Scratch {
    /// A scratch on `stream` that covers `layer` and, if given, everything `previous` covered.
    #[new]
    #[pyo3(signature = (layer, stream, previous=None))]
    fn new(layer: &Layer, stream: u64, previous: Option<PyRef<'_, Scratch>>) -> PyResult<Self> {
        let needs = *layer.needs().ok_or_else(|| PyRuntimeError::new_err("the layer was released"))?;
        let needs = match previous {
            Some(p) => p.inner.needs().max(needs).map_err(py_err)?,
            None => needs,
        };
        let s = layer.stream(stream)?;
        Ok(Scratch { inner: MoeScratch::new(&s, &needs).map_err(py_err)?, stream: s })
    }

    /// Whether the scratch has room for `layer`.
    fn covers(&self, layer: &Layer) -> bool {
        layer.needs().is_some_and(|n| self.inner.needs().check_covers(n).is_ok())
    }

    /// Device bytes held.
    fn bytes(&self) -> usize {
        self.inner.bytes()
    }

    /// Reads the device status word (this synchronises the scratch's stream): a `RuntimeError` naming what the
    /// device found (e.g. an expert id out of range, clamped) since the last check.
    fn check(&mut self) -> PyResult<()> {
        self.stream.context().bind_to_thread().map_err(|e| py_err(e.into()))?;
        self.inner.check(&self.stream).map_err(py_err)
    }
}

/// The crate's router on PyTorch's memory: `logits [T, E]` float32 to `topk_ids [T, k]` int32 and
/// `topk_weights [T, k]` float32, with its own device status word (non-finite logits are reported there).
#[pyclass(module = "moe_gemm_torch._native")]
struct Router {
    inner: moe_gemm::Router,
    status: DeviceStatus,
    device: usize,
    /// The stream it last ran on, wrapped once (wrapped again only when the caller's stream changes).
    stream: Arc<CudaStream>,
}

#[pymethods]
impl Router {
    /// `kind`: "softmax" (top-k of the softmax, `renormalize` as vLLM's `fused_topk`) or "grouped_sigmoid"
    /// (DeepSeek-V3's: `n_group` groups of which `topk_group` are kept, the correction bias for selection,
    /// `renormalize`, `routed_scaling_factor`). The status word is made on `stream`.
    #[new]
    #[pyo3(signature = (device, stream, kind, experts, top_k, renormalize, n_group=1, topk_group=1, routed_scaling_factor=1.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        device: usize,
        stream: u64,
        kind: &str,
        experts: usize,
        top_k: usize,
        renormalize: bool,
        n_group: usize,
        topk_group: usize,
        routed_scaling_factor: f32,
    ) -> PyResult<Self> {
        let kind = match kind {
            "softmax" => RouterKind::Softmax { renormalize },
            "grouped_sigmoid" => RouterKind::GroupedSigmoid { n_group, topk_group, renormalize, routed_scaling_factor },
            other => return Err(value_err(format!("kind = {other:?}: one of \"softmax\", \"grouped_sigmoid\""))),
        };
        let config = RouterConfig::new(experts, top_k, kind).map_err(py_err)?;
        let ctx = borrowed::context(device).map_err(py_err)?;
        let s = borrowed::stream(&ctx, stream);
        let inner = moe_gemm::Router::new(&s, config).map_err(py_err)?;
        let status = DeviceStatus::new(&s).map_err(py_err)?;
        s.synchronize().map_err(|e| py_err(e.into()))?;
        Ok(Router { inner, status, device, stream: s })
    }

    /// Routes `tokens` rows of `logits` on `stream`; `bias` (0: none) is the `[E]` float32 correction bias the
    /// grouped sigmoid router requires and the others refuse.
    #[allow(clippy::too_many_arguments)]
    fn route(
        &mut self,
        stream: u64,
        tokens: usize,
        logits: u64,
        bias: u64,
        topk_ids: u64,
        topk_weights: u64,
    ) -> PyResult<()> {
        let (e, k) = (self.inner.config().experts(), self.inner.config().top_k());
        if self.stream.cu_stream() as u64 != stream {
            self.stream = borrowed::stream(&borrowed::context(self.device).map_err(py_err)?, stream);
        }
        let s = self.stream.clone();
        s.context().bind_to_thread().map_err(|e| py_err(e.into()))?;
        let (nl, nk) = (count("router_logits", &[tokens, e])?, count("topk_ids", &[tokens, k])?);
        // SAFETY: the Python side checked each tensor: float32 / int32, contiguous, on the router's device, of
        // these shapes (the bias [E]).
        let (lb, bb, mut ib, mut wb) = unsafe {
            (
                Borrowed::<f32>::new(&s, logits, nl),
                (bias != 0).then(|| Borrowed::<f32>::new(&s, bias, e)),
                Borrowed::<i32>::new(&s, topk_ids, nk),
                Borrowed::<f32>::new(&s, topk_weights, nk),
            )
        };
        let lv = MatrixView::of("router_logits", &lb, e).map_err(py_err)?;
        let bv = bb.as_ref().map(|b| b.as_view());
        let mut iv = MatrixViewMut::of("topk_ids", &mut ib, k).map_err(py_err)?;
        let mut wv = MatrixViewMut::of("topk_weights", &mut wb, k).map_err(py_err)?;
        self.inner.launch(&s, &lv, bv.as_ref(), &mut iv, &mut wv, &mut self.status).map_err(py_err)
    }

    /// Reads the router's status word (synchronises the stream it last ran on).
    fn check(&mut self) -> PyResult<()> {
        self.stream.context().bind_to_thread().map_err(|e| py_err(e.into()))?;
        self.status.check(&self.stream).map_err(py_err)
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Layer>()?;
    m.add_class::<Scratch>()?;
    m.add_class::<Router>()?;
    Ok(())
}
