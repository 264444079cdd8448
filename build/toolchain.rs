//! Pure helpers of the build script: parsing tool versions and hashing inputs.
//! Kept free of I/O so that `tests/build_helpers.rs` can unit-test them (`#[path]`-included there).

/// The CUDA release `nvcc --version` reports, e.g. "Cuda compilation tools, release 13.0, V13.0.88" -> (13, 0).
pub fn parse_nvcc_release(output: &str) -> Option<(u32, u32)> {
    let rest = &output[output.find("release ")? + "release ".len()..];
    let ver: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    let mut it = ver.split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// CUTLASS's version from the text of `cutlass/version.h` (`#define CUTLASS_MAJOR 4` ...).
pub fn parse_cutlass_version(version_h: &str) -> Option<(u32, u32, u32)> {
    let field = |name: &str| -> Option<u32> {
        version_h.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("#define") && w.next() == Some(name)).then(|| w.next()?.parse().ok())?
        })
    };
    Some((field("CUTLASS_MAJOR")?, field("CUTLASS_MINOR")?, field("CUTLASS_PATCH")?))
}

/// The oldest nvcc the kernels are written for (SM90 ptr-array grouped GEMM and SM100 block-scaled kernels).
pub const MIN_NVCC: (u32, u32) = (12, 8);
/// The oldest CUTLASS whose SM90 ptr-array grouped GEMM API the kernels use.
pub const MIN_CUTLASS: (u32, u32, u32) = (4, 0, 0);

/// 64-bit FNV-1a: stable across Rust releases (unlike `DefaultHasher`), which the object cache relies on.
pub fn fnv1a(chunks: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for chunk in chunks {
        for &b in *chunk {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separate chunks so that ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The pinned PyPI wheels that make a CUDA 13.0 toolkit and the CUTLASS 4.2 headers. Every CUDA wheel is pinned to
/// one 13.0.x release: unpinned, pip mixes in parts of newer releases.
pub const PYPI_PINS: &[&str] = &[
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cutlass==4.2.0.0",
];
