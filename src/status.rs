//! The device status word: how kernels report invalid device data without trusting it.
//!
//! Kernels that read data produced on the device (offsets, expert ids, logits, per-expert counts) never follow
//! it out of bounds: they clamp, skip or drop, and OR a bit into a caller-owned `u32` on the device. Reading the
//! word is a *checked point* ([`DeviceStatus::check`]): it synchronises the stream, so it belongs after a step,
//! in tests or in debug builds, never inside the launch path or a captured graph.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};

use crate::error::{Error, Result};

/// Bits of the status word (`kErr*` in `cpp/common/launch.h`, `cpp/moe_ops/quant.h` for the FP8 quantisation, `cpp/mx/mx_quant.h`
/// for NVFP4).
pub mod bits {
    /// Grouped GEMM: `offsets[0] != 0`.
    pub const OFFSETS_NOT_ZERO_BASED: u32 = 1 << 0;
    /// Grouped GEMM: `offsets[g+1] < offsets[g]`.
    pub const OFFSETS_NOT_MONOTONE: u32 = 1 << 1;
    /// Grouped GEMM: an offset is negative or past `max_rows`.
    pub const OFFSETS_OUT_OF_RANGE: u32 = 1 << 2;

    /// Router: a logit was NaN or infinite.
    pub const NONFINITE_LOGITS: u32 = 1 << 3;
    /// Layout: an expert id outside `0..experts`.
    pub const EXPERT_ID_OUT_OF_RANGE: u32 = 1 << 4;
    /// Layout: more rows for one expert than the masked layout's capacity `max_m`.
    pub const CAPACITY_OVERFLOW: u32 = 1 << 5;
    /// Grouped GEMM: a group's row count exceeds the room its layout gives it.
    pub const GROUP_COUNT_OUT_OF_RANGE: u32 = 1 << 6;
    /// FP8 quantisation (activations, or weights by `quant::quantize_weights`): an input element was NaN or
    /// infinite (its e4m3 is NaN); FP4 quantisation: likewise (its e2m1, which has no NaN, is ±6).
    pub const NONFINITE_INPUT: u32 = 1 << 7;
    /// NVFP4 quantisation with the caller's tensor scale: a block needed a UE4M3 scale above 448 (it saturated,
    /// so its largest elements clipped).
    pub const SCALE_OVERFLOW: u32 = 1 << 8;
    /// Per-token FP8 quantisation with a static scale (a checkpoint's `input_scale` on the device): the scale was
    /// not finite and positive; the rows took scale 1.
    pub const BAD_STATIC_SCALE: u32 = 1 << 9;

    pub(crate) const KNOWN: &[(u32, &str)] = &[
        (OFFSETS_NOT_ZERO_BASED, "offsets[0] != 0"),
        (OFFSETS_NOT_MONOTONE, "offsets decrease (offsets[g+1] < offsets[g])"),
        (OFFSETS_OUT_OF_RANGE, "an offset is negative or exceeds max_rows (capacity of A and D)"),
        (NONFINITE_LOGITS, "a router logit is NaN or infinite (NaN and -inf count as -inf, +inf as f32::MAX)"),
        (EXPERT_ID_OUT_OF_RANGE, "an expert id is outside 0..experts (its row was dropped)"),
        (CAPACITY_OVERFLOW, "an expert received more rows than the masked layout's max_m (rows past it dropped)"),
        (GROUP_COUNT_OUT_OF_RANGE, "a group's row count is negative or exceeds its room in the layout (clamped)"),
        (NONFINITE_INPUT, "an element quantised to FP8 or FP4 was NaN or infinite (e4m3 NaN; e2m1 +-6)"),
        (SCALE_OVERFLOW, "an NVFP4 block needed a UE4M3 scale above 448 under the given tensor scale (it clipped)"),
        (BAD_STATIC_SCALE, "a static FP8 activation scale was not finite and positive (scale 1 used instead)"),
    ];
}

/// Describes the set bits of a status word, one clause per bit.
pub fn describe(word: u32) -> String {
    let mut parts: Vec<&str> = bits::KNOWN.iter().filter(|(b, _)| word & b != 0).map(|(_, s)| *s).collect();
    let known = bits::KNOWN.iter().fold(0, |m, (b, _)| m | b);
    if word & !known != 0 {
        parts.push("unknown bits");
    }
    parts.join("; ")
}

/// A device status word, shared by every kernel of a step.
#[derive(Debug)]
pub struct DeviceStatus {
    word: CudaSlice<u32>,
}

impl DeviceStatus {
    /// A cleared word on `stream`'s device.
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self> {
        #[cfg(not(moe_gemm_plant_uninit_status))]
        let word = stream.alloc_zeros::<u32>(1)?;
        // `MOE_GEMM_PLANT=uninit-status` (scripts/sanitize.py --planted): the word left unwritten, so that the
        // first kernel's atomicOr reads memory nothing wrote, which initcheck must report.
        #[cfg(moe_gemm_plant_uninit_status)]
        let word = crate::ffi::runtime::alloc_unwritten::<u32>(stream, 1)?;
        Ok(DeviceStatus { word })
    }

    /// Reads and clears the word (synchronises `stream`).
    ///
    /// # Errors
    /// [`Error::DeviceCheck`] naming every check that failed since the last call.
    pub fn check(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        let word = stream.clone_dtoh(&self.word)?[0];
        if word == 0 {
            return Ok(());
        }
        stream.memset_zeros(&mut self.word)?;
        Err(Error::DeviceCheck { word, what: describe(word) })
    }

    pub(crate) fn word_mut(&mut self) -> &mut impl DevicePtrMut<u32> {
        &mut self.word
    }
}
