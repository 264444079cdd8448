//! Unit tests of the build script's pure helpers (build/toolchain.rs).

#[path = "../build/toolchain.rs"]
#[allow(dead_code)]
mod toolchain;

use toolchain::*;

#[test]
fn nvcc_release_is_parsed() {
    let out = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n";
    assert_eq!(parse_nvcc_release(out), Some((13, 0)));
    assert_eq!(parse_nvcc_release("Cuda compilation tools, release 12.8, V12.8.61"), Some((12, 8)));
    assert_eq!(parse_nvcc_release("garbage"), None);
    assert!(parse_nvcc_release("release 12.4, V12.4.1").unwrap() < MIN_NVCC);
}

#[test]
fn cutlass_version_is_parsed() {
    let h = "#pragma once\n#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n#define CUTLASS_PATCH 0\n";
    assert_eq!(parse_cutlass_version(h), Some((4, 2, 0)));
    assert_eq!(parse_cutlass_version("#define CUTLASS_MAJOR 3\n"), None);
}

#[test]
fn object_cache_hash_separates_inputs() {
    assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
    assert_eq!(fnv1a(&[b"x"]), fnv1a(&[b"x"]));
}

#[test]
fn every_cuda_wheel_is_pinned_to_one_13_0_release() {
    for pin in PYPI_PINS.iter().filter(|p| p.starts_with("nvidia-cuda") || p.starts_with("nvidia-nvvm")) {
        let (_, ver) = pin.split_once("==").expect("pinned with ==");
        assert!(ver.starts_with("13.0."), "{pin}");
    }
    assert!(PYPI_PINS.contains(&"nvidia-cutlass==4.2.0.0"));
}
