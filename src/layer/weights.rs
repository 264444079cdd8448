//! Expert weights on the device ([`ExpertWeights`], uploaded from the host's [`PackedExperts`]) and what the layer
//! reads of every kind of weights ([`LayerWeights`]).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::experts::{
    check_lengths, shared_groups_beside, transpose_experts, Activation, ExpertDims, GateUp, PackedExperts,
    SharedExpert, Storage,
};
use crate::kernels::elementwise::DecodeWeights;

/// Expert weights on the device, in the `[out, in]` layout the kernels read.
#[derive(Debug)]
pub struct ExpertWeights<T: Element> {
    pub(crate) dims: ExpertDims,
    pub(crate) w13: CudaSlice<T>,
    pub(crate) w2: CudaSlice<T>,
    pub(crate) b13: Option<CudaSlice<f32>>,
    pub(crate) b2: Option<CudaSlice<f32>>,
}

impl<T: Element> ExpertWeights<T> {
    /// Uploads packed experts (transposing `InOut` storage once). Wrap the result in an `Arc` to share it
    /// between layer plans.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] unless `H` and `I` are multiples of 8 (16-byte rows for TMA); driver errors.
    pub fn upload(stream: &Arc<CudaStream>, p: &PackedExperts<T>) -> Result<Self> {
        let rows13 = p.w13_rows();
        let (w13, w2) = match p.format.storage {
            Storage::OutIn => (stream.clone_htod(&p.w13)?, stream.clone_htod(&p.w2)?),
            Storage::InOut => (
                stream.clone_htod(&transpose_experts(&p.w13, p.experts, p.hidden, rows13))?,
                stream.clone_htod(&transpose_experts(&p.w2, p.experts, p.inter, p.hidden))?,
            ),
        };
        Self::from_device(
            p.experts,
            p.hidden,
            p.inter,
            p.format.gate_up,
            p.format.activation,
            w13,
            w2,
            p.b13.as_ref().map(|b| stream.clone_htod(b)).transpose()?,
            p.b2.as_ref().map(|b| stream.clone_htod(b)).transpose()?,
        )
    }

    /// Uploads routed experts with a shared expert appended as `m = I_s / I` more experts of the routed width:
    /// every tensor on the device holds `E + m` experts (routed `0..E`, shared groups `E..E + m`), which the
    /// layer's GEMMs read like any other, and [`Self::shared_groups`] records `m`. Biases of the routed experts
    /// (if any) get zero rows for the shared groups.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint: routed experts not SwiGLU (the shared MLP is), another
    /// hidden size, `I_s` not a multiple of `I`, tensor lengths (see [`SharedExpert::new`]); as [`Self::upload`].
    pub fn upload_with_shared(
        stream: &Arc<CudaStream>,
        p: &PackedExperts<T>,
        shared: &SharedExpert<T>,
    ) -> Result<Self> {
        let m = shared_groups_beside(p, shared)?;
        let (e, h, i, rows13) = (p.experts, p.hidden, p.inter, p.w13_rows());
        let (w13, w2) = match p.format.storage {
            Storage::OutIn => (std::borrow::Cow::Borrowed(&p.w13[..]), std::borrow::Cow::Borrowed(&p.w2[..])),
            Storage::InOut => (
                std::borrow::Cow::Owned(transpose_experts(&p.w13, e, h, rows13)),
                std::borrow::Cow::Owned(transpose_experts(&p.w2, e, i, h)),
            ),
        };
        let groups: Vec<(Vec<T>, Vec<T>)> =
            (0..m).map(|j| shared.group(i, j, p.format.gate_up, Storage::OutIn)).collect();
        let w13 =
            upload_parts(stream, (e + m) * rows13 * h, [&w13[..]].into_iter().chain(groups.iter().map(|g| &g.0[..])))?;
        let w2 = upload_parts(stream, (e + m) * h * i, [&w2[..]].into_iter().chain(groups.iter().map(|g| &g.1[..])))?;
        let zero_rows = |b: &Option<Vec<f32>>, width: usize| {
            b.as_ref().map(|b| upload_parts(stream, (e + m) * width, [&b[..]].into_iter())).transpose()
        };
        let mut w = Self::from_device(
            e + m,
            h,
            i,
            p.format.gate_up,
            p.format.activation,
            w13,
            w2,
            zero_rows(&p.b13, rows13)?,
            zero_rows(&p.b2, h)?,
        )?;
        w.dims.experts = e;
        w.dims.shared_groups = m;
        Ok(w)
    }

    /// Wraps weights already on the device, in the kernels' `[out, in]` layout: `w13 [E, 2I or I, H]`,
    /// `w2 [E, H, I]`, biases f32 `[E, 2I or I]` and `[E, H]`.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the buffer whose length does not match, or `H`, `I` not multiples of 8.
    #[allow(clippy::too_many_arguments)]
    pub fn from_device(
        experts: usize,
        hidden: usize,
        inter: usize,
        gate_up: GateUp,
        activation: Activation,
        w13: CudaSlice<T>,
        w2: CudaSlice<T>,
        b13: Option<CudaSlice<f32>>,
        b2: Option<CudaSlice<f32>>,
    ) -> Result<Self> {
        for (name, v) in [("hidden", hidden), ("inter", inter)] {
            if v == 0 || v % 8 != 0 {
                return Err(Error::InvalidProblem(format!(
                    "{name} = {v} is not a positive multiple of 8: rows of 16-bit elements must be 16-byte aligned for TMA"
                )));
            }
        }
        check_lengths(
            experts,
            hidden,
            inter,
            activation.gated(),
            [
                ("w13", Some(w13.len())),
                ("w2", Some(w2.len())),
                ("b13", b13.as_ref().map(CudaSlice::len)),
                ("b2", b2.as_ref().map(CudaSlice::len)),
            ],
        )?;
        let dims = ExpertDims::new((experts, hidden, inter), gate_up, activation);
        Ok(ExpertWeights { dims, w13, w2, b13, b2 })
    }

    /// Gives the device buffers back, `(w13, w2, b13, b2)`: e.g. to release memory another library owns with
    /// `CudaSlice::leak` instead of freeing it (a binding that wrapped a PyTorch tensor's memory).
    #[allow(clippy::type_complexity)]
    pub fn into_device(self) -> (CudaSlice<T>, CudaSlice<T>, Option<CudaSlice<f32>>, Option<CudaSlice<f32>>) {
        (self.w13, self.w2, self.b13, self.b2)
    }

    routed_and_shared_getters!(pub(crate));
    /// The ordinal of the device the weights live on.
    pub fn device(&self) -> usize {
        self.w13.context().ordinal()
    }
    /// Device bytes of the weights and biases.
    pub fn bytes(&self) -> usize {
        self.w13.num_bytes()
            + self.w2.num_bytes()
            + self.b13.as_ref().map_or(0, |b| b.num_bytes())
            + self.b2.as_ref().map_or(0, |b| b.num_bytes())
    }
    pub(crate) fn w13_rows(&self) -> usize {
        self.dims.w13_rows()
    }
    /// What the batched backend's decode kernels read of these weights.
    pub(super) fn decode_experts(&self) -> DecodeWeights<'_, T> {
        DecodeWeights {
            act: self.dims.activation.into(),
            gate_up: self.dims.gate_up.into(),
            experts: self.groups(),
            hidden: self.dims.hidden,
            inter: self.dims.inter,
            w13: &self.w13,
            w2: &self.w2,
            b13: self.b13.as_ref(),
            b2: self.b2.as_ref(),
        }
    }
}

/// A device buffer of `len` elements holding `parts` back to back from its start (zeros after them).
fn upload_parts<'a, T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + 'a>(
    stream: &Arc<CudaStream>,
    len: usize,
    parts: impl Iterator<Item = &'a [T]>,
) -> Result<CudaSlice<T>> {
    let mut d = stream.alloc_zeros::<T>(len)?;
    let mut at = 0;
    for part in parts {
        stream.memcpy_htod(part, &mut d.slice_mut(at..at + part.len()))?;
        at += part.len();
    }
    Ok(d)
}

pub use crate::backend::WeightFormat;

/// [`LayerWeights`]' provided methods, each a fact of the sealed `common()`: `name: Type = path;`.
macro_rules! common_getters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty = $($path:ident).+;)*) => {
        $(
            $(#[$doc])*
            fn $name(&self) -> $ty {
                self.common().$($path).+
            }
        )*
    };
}

/// Expert weights a [`MoeLayer`](super::MoeLayer) computes with, for activations of element type `T`:
/// [`ExpertWeights<T>`] (dense, any element type), [`Fp8ExpertWeights`](super::Fp8ExpertWeights) (block FP8,
/// bf16 activations) or [`Mxfp4ExpertWeights`](super::Mxfp4ExpertWeights) (MXFP4, bf16 activations). Sealed: the layer knows how to multiply each of them.
pub trait LayerWeights<T: Element>: sealed::Sealed<T> + std::fmt::Debug + Send + Sync {
    common_getters! {
        /// How the weights are stored.
        format: WeightFormat = format;
        /// Routed experts (without the shared-expert groups).
        experts: usize = dims.experts;
        /// Shared-expert groups appended after the routed experts (0 without a shared expert).
        shared_groups: usize = dims.shared_groups;
        hidden: usize = dims.hidden;
        inter: usize = dims.inter;
        gate_up: GateUp = dims.gate_up;
        activation: Activation = dims.activation;
        /// The ordinal of the device the weights live on.
        device: usize = device;
        /// Device bytes of the weights, their scales and biases.
        bytes: usize = bytes;
    }
}

/// The sealed half of [`LayerWeights`]: what the layer reads of each kind of weights.
pub(super) mod sealed {
    use cudarc::driver::CudaSlice;
    use half::bf16;

    use super::{ExpertWeights, WeightFormat};
    use crate::dtype::Element;
    use crate::experts::ExpertDims;
    use crate::layer::{Fp8ChannelExpertWeights, Fp8ExpertWeights, Mxfp4ExpertWeights};

    /// The facts every kind of weights has.
    #[derive(Clone, Copy, Debug)]
    pub struct Common<'a> {
        pub format: WeightFormat,
        pub dims: ExpertDims,
        pub b13: Option<&'a CudaSlice<f32>>,
        pub b2: Option<&'a CudaSlice<f32>>,
        pub device: usize,
        pub bytes: usize,
    }

    impl Common<'_> {
        /// Experts every tensor holds: the routed ones and the shared groups.
        pub fn groups(&self) -> usize {
            self.dims.groups()
        }
    }

    /// The layer's element type is bf16, which is what the FP8 GEMM writes: a proof the layer can use on its
    /// `T` buffers, made only where `T` is bf16.
    #[derive(Clone, Copy)]
    pub struct IsBf16<T>(pub(crate) for<'x> fn(&'x mut CudaSlice<T>) -> &'x mut CudaSlice<bf16>);

    impl<T> std::fmt::Debug for IsBf16<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("IsBf16")
        }
    }

    impl<T> IsBf16<T> {
        pub fn cast<'x>(&self, s: &'x mut CudaSlice<T>) -> &'x mut CudaSlice<bf16> {
            (self.0)(s)
        }
    }

    /// The weights, by kind.
    #[derive(Debug)]
    pub enum Parts<'a, T: Element> {
        Dense(&'a ExpertWeights<T>),
        Fp8(&'a Fp8ExpertWeights, IsBf16<T>),
        Mx(&'a Mxfp4ExpertWeights, IsBf16<T>),
        Fp8Channel(&'a Fp8ChannelExpertWeights, IsBf16<T>),
    }

    pub trait Sealed<T: Element> {
        fn common(&self) -> Common<'_>;
        fn parts(&self) -> Parts<'_, T>;
    }

    impl<T: Element> Sealed<T> for ExpertWeights<T> {
        fn common(&self) -> Common<'_> {
            weights_common!(self, WeightFormat::Dense, b13: self.b13.as_ref(), b2: self.b2.as_ref())
        }
        fn parts(&self) -> Parts<'_, T> {
            Parts::Dense(self)
        }
    }
}

impl<T: Element> LayerWeights<T> for ExpertWeights<T> {}
