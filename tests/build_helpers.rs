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

fn root() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The units as the build finds them.
fn units() -> Vec<KernelUnit> {
    kernel_units(root()).unwrap()
}

#[test]
fn a_unit_declares_its_family_targets_and_cost() {
    let u = parse_unit("cpp/x/a.cu", "// what it is\n// moe-gemm unit: family=routing targets=portable seconds=3\n")
        .unwrap();
    assert_eq!((u.family.as_str(), u.targets, u.seconds), ("routing", PORTABLE, 3));
    let u = parse_unit("cpp/x/a.cu", "// moe-gemm unit: targets=sm_90a seconds=75 family=grouped_gemm_sm90").unwrap();
    assert_eq!(u.targets, SM90A);
    // Loud failures, each naming the file and what is wrong.
    let undeclared = parse_unit("cpp/x/a.cu", "#include <cuda_runtime.h>\n").unwrap_err();
    assert!(undeclared.contains("cpp/x/a.cu declares no unit"), "{undeclared}");
    let arch = parse_unit("cpp/x/a.cu", "// moe-gemm unit: family=f targets=sm_89 seconds=1").unwrap_err();
    assert!(arch.contains("`targets=sm_89`"), "{arch}");
    let partial = parse_unit("cpp/x/a.cu", "// moe-gemm unit: family=f targets=sm_90a").unwrap_err();
    assert!(partial.contains("needs family=, targets= and seconds="), "{partial}");
}

#[test]
fn gencode_flags_are_spelled_as_nvcc_wants() {
    // The exact flag of the single-gencode build: the SM90 units keep their object-cache hash.
    assert_eq!(gencodes(SM90A), ["-gencode=arch=compute_90a,code=sm_90a"]);
    assert_eq!(gencodes(SM100A), ["-gencode=arch=compute_100a,code=sm_100a"]);
    // The plain units: one cicc pass, its PTX lowered to both SASS targets and embedded.
    assert_eq!(gencodes(PORTABLE), ["-gencode=arch=compute_90,code=[sm_90,sm_100,compute_90]"]);
    assert_eq!(gencodes(&[Target::Ptx("compute_90")]), ["-gencode=arch=compute_90,code=compute_90"]);
    let mixed = [Target::Sass("sm_90a"), Target::Sass("sm_100"), Target::Ptx("compute_90")];
    assert_eq!(
        gencodes(&mixed),
        ["-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_90,code=[sm_100,compute_90]"]
    );
    assert!(std::panic::catch_unwind(|| gencodes(&[Target::Sass("sm_90")])).is_err(), "plain SASS without PTX");
}

/// The files of `cpp/<family>/` with extension `ext`, as paths relative to the crate root (`cpp/` holds one
/// folder per kernel family and nothing else).
fn cpp_files(ext: &str) -> Vec<String> {
    let mut out = Vec::new();
    for dir in std::fs::read_dir(root().join("cpp")).unwrap().filter_map(|e| e.ok().map(|e| e.path())) {
        assert!(dir.is_dir(), "cpp/ holds family folders only, not {}", dir.display());
        let family = dir.file_name().unwrap().to_string_lossy().into_owned();
        for f in std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok().map(|e| e.path())) {
            if f.extension().is_some_and(|e| e == ext) {
                out.push(format!("cpp/{family}/{}", f.file_name().unwrap().to_string_lossy()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn every_cuda_file_is_one_unit() {
    let on_disk = cpp_files("cu");
    let mut found: Vec<String> = units().iter().map(|u| u.path.clone()).collect();
    found.sort();
    assert_eq!(found, on_disk, "every cpp/*/*.cu is a unit, once");
    assert!(found.len() >= 18, "the units found: {found:?}");
}

/// Each family's C++ stands in its own folder: it includes headers of its folder and of `cpp/common` only, so that
/// a family is added, moved or removed with its folder (and its `src/kernels/<family>/`) alone.
#[test]
fn each_family_includes_its_own_headers_and_the_common_ones_only() {
    let mut checked = 0;
    for ext in ["cu", "cuh", "inl", "h"] {
        for file in cpp_files(ext) {
            let family = file.split('/').nth(1).unwrap();
            for line in std::fs::read_to_string(root().join(&file)).unwrap().lines() {
                let Some(inc) = line.trim_start().strip_prefix("#include \"").and_then(|r| r.split('"').next()) else {
                    continue;
                };
                // Ours are `folder/file`, found in cpp/ (CUTLASS's and CuTe's are found elsewhere).
                let Some((folder, _)) = inc.split_once('/').filter(|_| root().join("cpp").join(inc).is_file()) else {
                    continue;
                };
                assert!(folder == family || folder == "common", "{file} includes {inc}: another family's header");
                checked += 1;
            }
        }
    }
    assert!(checked > 40, "only {checked} includes of ours found");
}

/// Each `.inl` part (a family's dtypes and schedules) is compiled exactly once: exactly one unit includes it,
/// directly or through another part.
#[test]
fn every_part_is_included_by_exactly_one_unit() {
    // Included by their path below cpp/ (`#include "fp8_blockwise/grouped_gemm_sm90_fp8_blockwise.inl"`).
    let parts: Vec<String> = cpp_files("inl").into_iter().map(|p| p["cpp/".len()..].to_string()).collect();
    assert!(parts.len() >= 4, "the CUTLASS families' parts: {parts:?}");
    for part in &parts {
        let include = format!("#include \"{part}\"");
        let units = units();
        let by: Vec<&str> =
            units.iter().filter(|u| code_of(&unit_text(&u.path)).contains(&include)).map(|u| u.path.as_str()).collect();
        assert_eq!(by.len(), 1, "{part} is included by {by:?}");
    }
}

#[test]
fn the_gencode_table_gives_each_family_its_arches() {
    let units = units();
    for u in &units {
        let name = u.path.rsplit('/').next().unwrap();
        // fused_decode.cu is plain mma.sync, but joins the Fused backend's SM90 family (FusedGemm requires it).
        if name.contains("_sm90") || u.family.ends_with("_sm90") {
            assert_eq!(u.targets, SM90A, "{}: Hopper GEMMs (wgmma) and their family get sm_90a SASS only", u.path);
        } else if name.contains("_sm100") {
            assert_eq!(u.targets, SM100A, "{}: Blackwell GEMMs (tcgen05) get sm_100a SASS only", u.path);
        } else {
            assert_eq!(u.targets, PORTABLE, "{}: plain kernels get both SASS and compute_90 PTX", u.path);
        }
        for t in u.targets {
            if let Target::Ptx(c) = t {
                // compute_90a / compute_100a / compute_100f PTX cannot be JIT-compiled for another GPU.
                assert!(c.starts_with("compute_") && c[8..].chars().all(|ch| ch.is_ascii_digit()), "{}: {c}", u.path);
            }
        }
    }
    // The units of one family share their targets: a family's arch list is then one list.
    for u in &units {
        let first = units.iter().find(|v| v.family == u.family).unwrap();
        assert_eq!(u.targets, first.targets, "{} and {} are both {}", u.path, first.path, u.family);
    }
    let names: Vec<&str> = families(&units).iter().map(|(f, _)| *f).collect();
    assert_eq!(names.len(), 11, "{names:?}");
    let some = ["grouped_gemm_sm90", "grouped_gemm_sm90_fp8", "fused_moe_sm90", "grouped_gemm_sm100", "routing"];
    for f in some.into_iter().chain(["grouped_gemm_mx_portable"]) {
        assert!(names.contains(&f), "{f} missing from {names:?}");
    }
}

/// The text of a unit and the headers of cpp/ it includes, transitively.
fn unit_text(path: &str) -> String {
    let cpp = root().join("cpp");
    let (mut todo, mut seen, mut text) = (vec![root().join(path)], Vec::new(), String::new());
    while let Some(f) = todo.pop() {
        if seen.contains(&f) {
            continue;
        }
        let body = std::fs::read_to_string(&f).unwrap();
        for line in body.lines() {
            if let Some(inc) = line.trim_start().strip_prefix("#include \"").and_then(|r| r.split('"').next()) {
                let p = cpp.join(inc);
                if p.is_file() {
                    todo.push(p);
                }
            }
        }
        text += &body;
        seen.push(f);
    }
    text
}

/// `text` without its `//` comments.
fn code_of(text: &str) -> String {
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

#[test]
fn portable_units_use_no_arch_specific_feature() {
    // What sm_90a / sm_100a alone have: a unit with any of these cannot be compiled for compute_90 PTX (nor
    // run its SASS on the other arch), and CUTLASS/CuTe headers bring them in. The code is read, not the `//`
    // comments: a plain header may name the instructions of the kernels it describes (mx/launch.h, which the
    // portable block-scaled GEMM includes for its arguments).
    let markers = ["wgmma", "setmaxnreg", "tcgen05", "#include \"cutlass/", "#include \"cute/", "__CUDA_ARCH_FEAT_"];
    for u in units().iter().filter(|u| u.targets == PORTABLE) {
        let text = code_of(&unit_text(&u.path));
        for m in markers {
            assert!(!text.contains(m), "{} is compiled for every target but contains `{m}`", u.path);
        }
    }
    // And the check can fail: the SM90 and SM100 GEMMs do contain such features, in their code.
    assert!(code_of(&unit_text("cpp/dense/grouped_gemm_sm90.cu")).contains("#include \"cutlass/"));
    assert!(code_of(&unit_text("cpp/dense/grouped_gemm_sm100.cu")).contains("__CUDA_ARCH_FEAT_SM100_ALL"));
    assert!(unit_text("cpp/mx/grouped_mx_portable.cu").contains("tcgen05"), "the header's comments are read past");
}

#[test]
fn heavy_units_start_first() {
    // The build queue takes units in table order: the CUTLASS GEMMs first, so the small units fill the other core.
    let units = units();
    let first_small = units.iter().position(|u| u.targets == PORTABLE).unwrap();
    assert!(units[..first_small].iter().all(|u| u.targets != PORTABLE));
    assert!(units[first_small..].iter().all(|u| u.targets == PORTABLE));
    assert!(units.windows(2).all(|w| w[0].seconds >= w[1].seconds), "heaviest first");
}

#[test]
fn the_family_table_for_the_library_and_the_description_agree() {
    let units = units();
    let rs = families_rs(&units);
    assert!(rs.contains(r#"("grouped_gemm_sm100", &["sm_100a"], &[], "sm_100a"),"#), "{rs}");
    assert!(rs.contains(r#"("routing", &["sm_90", "sm_100"], &["compute_90"], "sm_90 or sm_100"),"#), "{rs}");
    let text = describe_families(&units);
    assert!(text.contains("grouped_gemm_sm90: sm_90a;"), "{text}");
    assert!(text.contains("layouts: sm_90, sm_100, compute_90 (PTX)"), "{text}");
}

#[test]
fn the_disassemblers_are_pinned_to_one_release() {
    let versions: Vec<&str> = SASS_TOOL_PINS.iter().map(|p| p.split_once("==").expect("pinned with ==").1).collect();
    assert_eq!(versions.len(), 2);
    assert!(versions.iter().all(|v| *v == versions[0]), "{SASS_TOOL_PINS:?}");
}

#[test]
fn cudarc_link_mode_and_version_are_checked() {
    let default = CudarcChoice { dynamic_loading: true, cuda_13000: true, ..Default::default() };
    assert_eq!(cudarc_choice_problem(default), None);
    let candle = CudarcChoice { dynamic_linking: true, version_from_build_system: true, ..Default::default() };
    assert_eq!(cudarc_choice_problem(candle), None);
    // A pinned version and the build system's together: cudarc takes the pinned one.
    assert_eq!(cudarc_choice_problem(CudarcChoice { version_from_build_system: true, ..default }), None);
    // CUDARC_CUDA_VERSION stands in for a version feature.
    let env = CudarcChoice { dynamic_linking: true, version_from_env: true, ..Default::default() };
    assert_eq!(cudarc_choice_problem(env), None);

    let both = cudarc_choice_problem(CudarcChoice { dynamic_linking: true, ..default }).unwrap();
    assert!(both.contains("`cuda-dynamic-loading` and `cuda-dynamic-linking` are both on"), "{both}");
    assert!(both.contains("default-features = false"), "{both}");
    let neither = cudarc_choice_problem(CudarcChoice { cuda_13000: true, ..Default::default() }).unwrap();
    assert!(neither.contains("neither `cuda-dynamic-loading` nor `cuda-dynamic-linking`"), "{neither}");
    let no_version = cudarc_choice_problem(CudarcChoice { dynamic_loading: true, ..Default::default() }).unwrap();
    assert!(no_version.contains("`cuda-13000`") && no_version.contains("`cuda-version-from-build-system`"));
}
