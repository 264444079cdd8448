//! Element types the kernels accept, as a sealed trait over the host types of `half` (and later `float8`).

use std::fmt;

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};

/// Runtime tag of an element type.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// bfloat16 (`half::bf16`).
    BF16,
    /// IEEE half (`half::f16`).
    F16,
}

impl DType {
    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::BF16 | DType::F16 => 2,
        }
    }

    /// Elements per 16 bytes: the alignment, in elements, that TMA needs of every row and base address.
    pub const fn tma_alignment(self) -> usize {
        16 / self.size_bytes()
    }

    /// Half the distance between 1.0 and the next representable value: the relative rounding error of one
    /// round-to-nearest conversion from f32.
    pub const fn half_ulp(self) -> f32 {
        match self {
            DType::BF16 => 1.0 / 256.0, // 8 significant bits
            DType::F16 => 1.0 / 2048.0, // 11 significant bits
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
        }
    }
}

display_by_name!(DType);

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// A 16-bit floating-point element the grouped GEMMs take as input and produce as output.
/// Sealed: the kernels exist only for the types listed here.
pub trait Element: sealed::Sealed + DeviceRepr + ValidAsZeroBits + Copy + Send + Sync + fmt::Debug + 'static {
    const DTYPE: DType;
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
    /// A quiet NaN: used to poison outputs so that unwritten elements are seen.
    fn nan() -> Self;
    fn to_bits(self) -> u16;
    fn from_bits(bits: u16) -> Self;
}

/// The two impls differ only in the `half` type and its [`DType`]: each method is that type's own.
macro_rules! element {
    ($t:ty, $dtype:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dtype;
            fn from_f32(x: f32) -> Self {
                <$t>::from_f32(x)
            }
            fn to_f32(self) -> f32 {
                <$t>::to_f32(self)
            }
            fn nan() -> Self {
                <$t>::NAN
            }
            fn to_bits(self) -> u16 {
                <$t>::to_bits(self)
            }
            fn from_bits(bits: u16) -> Self {
                <$t>::from_bits(bits)
            }
        }
    };
}
element!(half::bf16, DType::BF16);
element!(half::f16, DType::F16);
