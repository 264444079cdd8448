//! [`MoeScratch`]: the per-batch intermediates of MoE layers, owned by the caller and shared by every layer that
//! runs on one stream (one after another), so a model of 40–100 layers holds one set, not one per layer.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, ValidAsZeroBits};

use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::kernels::grouped::Workspace;
use crate::layouts::{ExpertLayout, LayoutDims, LayoutRoom, LayoutSpec};
use crate::quant::{Fp8Rows, Fp8TokenRows, Mxfp8Rows};
use crate::status::DeviceStatus;

use super::sizing::ScratchNeeds;
use super::{LayerWeights, MoeLayer};

/// Intermediates of MoE layer forwards: one permuted copy of x, GEMM1's output, the activation, GEMM2's
/// output, one expert layout, one GEMM workspace, the shared-expert routing and the step's [`DeviceStatus`];
/// for layers over FP8 weights, x and the activation quantised (e4m3 and scales) for the two GEMMs.
/// Sized by [`ScratchNeeds`] (see [`MoeScratch::for_layers`]); every byte it holds is in
/// [`ScratchNeeds::footprint`], and [`MoeScratch::bytes`] reports what was allocated.
///
/// Not `Sync` by use: a forward borrows it mutably, so two streams need two scratches. A scratch belongs to
/// the stream it was made on ([`Self::cu_stream`]): a forward or [`Self::check`] on another stream is refused
/// before anything is queued, since its work would race the first stream's where nothing orders them
/// (cudarc's event tracking, off for graph capture, is what would). [`Self::hand_over`] moves it. The check
/// compares `CUstream` handles: the legacy default stream (0) and the per-thread default stream (one handle,
/// `CU_STREAM_PER_THREAD`, for every thread's) look the same from every thread, so a scratch used from two
/// threads on their per-thread streams is not caught.
#[derive(Debug)]
pub struct MoeScratch<T: Element> {
    needs: ScratchNeeds,
    device: usize,
    /// The stream the scratch is used on (`CUstream` as u64): the one it was made on, or handed over to.
    stream: u64,
    pub(crate) layout: Option<ExpertLayout>,
    pub(crate) a: Option<CudaSlice<T>>,
    pub(crate) a8: Option<Fp8Rows>,
    pub(crate) h8: Option<Fp8Rows>,
    pub(crate) a8_token: Option<Fp8TokenRows>,
    pub(crate) h8_token: Option<Fp8TokenRows>,
    pub(crate) a_mx: Option<Mxfp8Rows>,
    pub(crate) h_mx: Option<Mxfp8Rows>,
    pub(crate) d1: Option<CudaSlice<T>>,
    pub(crate) h: Option<CudaSlice<T>>,
    pub(crate) d2: Option<CudaSlice<T>>,
    pub(crate) workspace: Option<Workspace>,
    pub(crate) ids: Option<CudaSlice<i32>>,
    pub(crate) weights: Option<CudaSlice<f32>>,
    pub(crate) single: Option<CudaSlice<i32>>,
    pub(crate) amax: Option<CudaSlice<u32>>,
    pub(crate) arrivals: Option<CudaSlice<u32>>,
    pub(crate) status: DeviceStatus,
}

fn alloc<U: ValidAsZeroBits + cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    n: usize,
) -> Result<Option<CudaSlice<U>>> {
    Ok(if n == 0 { None } else { Some(stream.alloc_zeros::<U>(n)?) })
}

/// Zeroed e4m3 rows `[rows, k]` and their scales, or nothing for no rows.
fn alloc_mx(stream: &Arc<CudaStream>, rows: usize, k: usize, groups: usize) -> Result<Option<Mxfp8Rows>> {
    let k = super::mx::mx_padded(k);
    Ok(if rows == 0 || k == 0 { None } else { Some(Mxfp8Rows::alloc(stream, rows, k, groups.max(1))?) })
}

fn alloc_token_rows(stream: &Arc<CudaStream>, rows: usize, k: usize) -> Result<Option<Fp8TokenRows>> {
    Ok(if rows == 0 || k == 0 { None } else { Some(Fp8TokenRows::zeros(stream, rows, k)?) })
}

fn alloc_fp8(stream: &Arc<CudaStream>, rows: usize, k: usize) -> Result<Option<Fp8Rows>> {
    Ok(if rows == 0 || k == 0 { None } else { Some(Fp8Rows::alloc(stream, rows, k)?) })
}

impl<T: Element> MoeScratch<T> {
    /// Allocates a scratch of `needs` on `stream`'s device.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`](Error::InvalidProblem) if `needs` is for another element type than
    /// `T`; driver errors (out of memory).
    pub fn new(stream: &Arc<CudaStream>, needs: &ScratchNeeds) -> Result<Self> {
        if needs.dtype != T::DTYPE {
            return Err(Error::InvalidProblem(format!(
                "scratch needs are for {} elements, the scratch is of {}",
                needs.dtype,
                T::DTYPE
            )));
        }
        let n = needs;
        let layout = if n.groups > 0 {
            let room = LayoutRoom {
                groups: n.groups,
                rows: n.layout_rows,
                tiles: n.layout_tiles,
                positions: n.layout_positions,
                scratch_ints: n.layout_scratch_ints,
            };
            // Any dims that fit the room do for the allocation; layers reshape it per forward.
            let dims = LayoutDims::new(LayoutSpec::Grouped, 1, 1, n.groups, n.groups)?;
            Some(ExpertLayout::with_room(stream, room, dims)?)
        } else {
            None
        };
        let has_layout = layout.is_some();
        Ok(MoeScratch {
            needs: *needs,
            device: stream.context().ordinal(),
            stream: stream.cu_stream() as u64,
            layout,
            a: alloc(stream, n.a_rows * n.hidden)?,
            a8: alloc_fp8(stream, n.a_fp8_rows, n.hidden)?,
            h8: alloc_fp8(stream, n.h_fp8_rows, n.inter)?,
            a8_token: alloc_token_rows(stream, n.a_token_rows, n.hidden)?,
            h8_token: alloc_token_rows(stream, n.h_token_rows, n.inter)?,
            a_mx: alloc_mx(stream, n.a_mx_rows, n.hidden, n.groups)?,
            h_mx: alloc_mx(stream, n.h_mx_rows, n.inter, n.groups)?,
            amax: alloc(stream, n.amax_words)?,
            arrivals: alloc(stream, n.arrival_words)?,
            d1: alloc(stream, n.d1_rows * n.w13_cols)?,
            h: alloc(stream, n.h_rows * n.inter)?,
            d2: alloc(stream, n.d2_rows * n.d2_cols)?,
            // Wherever there is a layout: a layout backend's GEMMs take one, of 0 bytes where every plan needs none
            // (the FP8 swap-AB decode kernel).
            workspace: if n.workspace_bytes > 0 || has_layout {
                Some(Workspace::zeroed(stream, n.workspace_bytes)?)
            } else {
                None
            },
            ids: alloc(stream, n.routing_slots)?,
            weights: alloc(stream, n.routing_slots)?,
            single: alloc(stream, if n.eager { 2 } else { 0 })?,
            status: DeviceStatus::new(stream)?,
        })
    }

    /// A scratch that serves every layer of `layers` (the field-wise maximum of their needs).
    ///
    /// # Errors
    /// As [`Self::new`]; [`Error::InvalidProblem`](Error::InvalidProblem) if `layers` is empty.
    pub fn for_layers<'a, W: LayerWeights<T> + 'a>(
        stream: &Arc<CudaStream>,
        layers: impl IntoIterator<Item = &'a MoeLayer<T, W>>,
    ) -> Result<Self> {
        let mut needs: Option<ScratchNeeds> = None;
        for l in layers {
            needs = Some(match needs {
                None => *l.needs(),
                Some(n) => n.max(*l.needs())?,
            });
        }
        let needs =
            needs.ok_or_else(|| Error::InvalidProblem("MoeScratch::for_layers needs at least one layer".into()))?;
        Self::new(stream, &needs)
    }

    /// What the scratch was sized for.
    pub fn needs(&self) -> &ScratchNeeds {
        &self.needs
    }

    /// The ordinal of the device the scratch lives on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The stream the scratch is used on, as the `CUstream` handle (`stream.cu_stream() as u64`): the one it was
    /// made on, or the last one it was handed over to.
    pub fn cu_stream(&self) -> u64 {
        self.stream
    }

    /// Hands the scratch over to `stream`: forwards and [`Self::check`] are then accepted on `stream` only.
    ///
    /// This does **not** synchronise or order anything: the caller must make `stream` wait for the work the old
    /// stream queued on the scratch (e.g. an event recorded on the old stream and waited on by the new one,
    /// `CudaStream::join`), or the two streams' kernels race on the same buffers.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`](Error::InvalidProblem) if `stream` is on another device than the
    /// scratch (naming both).
    pub fn hand_over(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        let d = stream.context().ordinal();
        if d != self.device {
            return Err(Error::InvalidProblem(format!(
                "hand_over: the stream is on device {d}, the scratch lives on device {}",
                self.device
            )));
        }
        self.stream = stream.cu_stream() as u64;
        Ok(())
    }

    /// Whether the scratch may be used on `stream` (the one it was made on or handed over to).
    pub(crate) fn check_stream(&self, stream: &Arc<CudaStream>) -> Result<()> {
        same_stream(self.stream, stream.cu_stream() as u64)
    }

    /// Device bytes allocated (equal to `needs().footprint().total()`).
    pub fn bytes(&self) -> usize {
        fn b<U>(s: &Option<CudaSlice<U>>) -> usize {
            s.as_ref().map_or(0, |s| s.num_bytes())
        }
        fn b8(r: &Option<Fp8Rows>) -> usize {
            r.as_ref().map_or(0, |r| r.data().num_bytes() + r.scales().num_bytes())
        }
        fn bt(r: &Option<Fp8TokenRows>) -> usize {
            r.as_ref().map_or(0, Fp8TokenRows::bytes)
        }
        self.layout.as_ref().map_or(0, ExpertLayout::bytes)
            + b(&self.a)
            + b8(&self.a8)
            + b8(&self.h8)
            + bt(&self.a8_token)
            + bt(&self.h8_token)
            + self.a_mx.as_ref().map_or(0, Mxfp8Rows::bytes)
            + self.h_mx.as_ref().map_or(0, Mxfp8Rows::bytes)
            + b(&self.d1)
            + b(&self.h)
            + b(&self.d2)
            + self.workspace.as_ref().map_or(0, Workspace::len)
            + b(&self.ids)
            + b(&self.weights)
            + b(&self.single)
            + b(&self.amax)
            + b(&self.arrivals)
            + std::mem::size_of::<u32>()
    }

    /// The step's status word: pass it to the router too, so one checked point covers the whole step.
    pub fn status_mut(&mut self) -> &mut DeviceStatus {
        &mut self.status
    }

    /// Reads and clears the status word (synchronises `stream`): invalid ids, capacity overflow and every other
    /// device-side check of the forwards since the last call.
    ///
    /// # Errors
    /// [`Error::DeviceCheck`](crate::Error::DeviceCheck) naming each failed check.
    /// [`Error::InvalidProblem`](Error::InvalidProblem) naming both streams if `stream` is not the
    /// scratch's ([`Self::hand_over`]).
    pub fn check(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        self.check_stream(stream)?;
        self.status.check(stream)
    }
}

/// A scratch of stream `owner` used on stream `used` (both `CUstream` handles as u64): the same stream, or an
/// error naming both.
pub(crate) fn same_stream(owner: u64, used: u64) -> Result<()> {
    if owner == used {
        return Ok(());
    }
    Err(Error::InvalidProblem(format!(
        "the scratch belongs to stream {owner:#x}, used on stream {used:#x}: two streams would race on its buffers; \
         order the first stream's work before the second's (an event) and call MoeScratch::hand_over"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_on_another_stream_is_refused_naming_both() {
        assert!(same_stream(0x5a00, 0x5a00).is_ok());
        let msg = same_stream(0x5a00, 0x7b00).unwrap_err().to_string();
        assert!(msg.contains("stream 0x5a00") && msg.contains("stream 0x7b00") && msg.contains("hand_over"), "{msg}");
    }
}
