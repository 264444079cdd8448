//! The library without its default `cli` feature compiles none of the command line's crates (CPU; asks
//! `cargo tree`, offline: the `cargo test` that runs this has just resolved and fetched every package).

use std::process::Command;

/// The crates only the `moe-gemm` binary and the benchmark helpers need. serde_json is not one of them: the library
/// parses FP8 checkpoints' `config.json` with it (and safetensors, which parses its JSON header with it, brings it
/// in anyway).
const CLI_ONLY: [&str; 3] = ["clap", "plotters", "indicatif"];

/// Names of the normal (not build, not dev) dependencies of this package on the host, `depth` levels deep
/// (`None`: the whole tree), with or without the default features (without: only a link mode and a CUDA version).
fn normal_dependencies(default_features: bool, depth: Option<u32>) -> Vec<String> {
    dependencies("normal", default_features, depth)
}

/// As [`normal_dependencies`], over the dependency kinds `edges` names (`cargo tree --edges`).
fn dependencies(edges: &str, default_features: bool, depth: Option<u32>) -> Vec<String> {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args([
        "tree",
        "--offline",
        "--edges",
        edges,
        "--prefix",
        "none",
        "--format",
        "{p}",
    ]);
    if !default_features {
        // A link mode and a CUDA version stay on: the build needs one of each.
        cmd.args(["--no-default-features", "--features", "cuda-dynamic-loading,cuda-13000"]);
    }
    if let Some(d) = depth {
        cmd.args(["--depth", &d.to_string()]);
    }
    let out = cmd.output().expect("cannot run cargo tree");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{cmd:?} failed:\n{}{stdout}", String::from_utf8_lossy(&out.stderr));
    let mut lines = stdout.lines().filter(|l| !l.trim().is_empty());
    let root = lines.next().unwrap_or_default();
    assert!(root.starts_with("moe-gemm "), "{cmd:?}: the first line is not this package: {root:?}");
    let mut names: Vec<String> =
        lines.filter_map(|l| l.split_whitespace().next()).filter(|n| !n.starts_with('[')).map(String::from).collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn library_without_cli_feature_has_no_cli_dependencies() {
    let direct = normal_dependencies(false, Some(1));
    assert!(direct.iter().any(|n| n == "cudarc"), "cudarc missing from the direct dependencies: {direct:?}");
    let found: Vec<&str> = CLI_ONLY.into_iter().filter(|c| direct.iter().any(|n| n == c)).collect();
    assert!(found.is_empty(), "without `cli`, the library still depends on {found:?} (direct: {direct:?})");
    // Nothing else pulls in the binary's crates either.
    let all = normal_dependencies(false, None);
    let found: Vec<&str> = CLI_ONLY.into_iter().filter(|c| all.iter().any(|n| n == c)).collect();
    assert!(found.is_empty(), "without `cli`, the library's dependency tree holds {found:?}");
}

/// serde_json is a direct dependency of the library alone (FP8 `config.json`s).
#[test]
fn library_parses_json_without_cli_feature() {
    assert!(normal_dependencies(false, Some(1)).iter().any(|n| n == "serde_json"));
}

/// The check above sees real output: with the default features, all three are direct dependencies.
#[test]
fn default_features_bring_the_cli_dependencies() {
    let direct = normal_dependencies(true, Some(1));
    for c in CLI_ONLY {
        assert!(direct.iter().any(|n| n == c), "{c} is not a dependency with the default features: {direct:?}");
    }
}

/// Criterion comes only with the `bench` feature: neither a library user nor `cargo test` compiles it (as a
/// dev-dependency, every test binary would wait for it).
#[test]
fn criterion_only_with_the_bench_feature() {
    for default_features in [false, true] {
        let all = dependencies("normal,dev", default_features, None);
        assert!(!all.iter().any(|n| n == "criterion"), "criterion in the tree (default features: {default_features})");
    }
}

/// The features cudarc is built with when moe-gemm has exactly `features` (no defaults).
fn cudarc_features(features: &str) -> Vec<String> {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args([
        "tree",
        "--offline",
        "--edges",
        "normal",
        "--no-default-features",
        "--features",
        features,
        "--invert",
        "cudarc",
        "--depth",
        "0",
        "--format",
        "{p} {f}",
    ]);
    let out = cmd.output().expect("cannot run cargo tree");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{cmd:?} failed:\n{}{stdout}", String::from_utf8_lossy(&out.stderr));
    let line = stdout.lines().next().unwrap_or_default();
    assert!(line.starts_with("cudarc "), "{cmd:?}: the first line is not cudarc: {line:?}");
    line.split_whitespace().nth(2).unwrap_or_default().split(',').map(String::from).collect()
}

/// cudarc's link mode and CUDA version come from moe-gemm's `cuda-*` features alone, so a crate next to candle
/// (whose cudarc links dynamically and asks the build system for the version) can choose candle's: no other
/// feature turns on `dynamic-loading` or pins a version behind its back.
#[test]
fn cudarc_link_mode_and_version_follow_the_cuda_features() {
    let candle = cudarc_features("cuda-dynamic-linking,cuda-version-from-build-system,nccl");
    for f in ["dynamic-linking", "cuda-version-from-build-system"] {
        assert!(candle.iter().any(|c| c == f), "cudarc lacks {f}: {candle:?}");
    }
    let stray: Vec<&String> = candle
        .iter()
        .filter(|c| *c == "dynamic-loading" || *c == "static-linking" || c.starts_with("cuda-1"))
        .collect();
    assert!(stray.is_empty(), "cudarc has {stray:?} beside candle's choice: {candle:?}");

    let default = cudarc_features("cuda-dynamic-loading,cuda-13000");
    for f in ["dynamic-loading", "cuda-13000"] {
        assert!(default.iter().any(|c| c == f), "cudarc lacks {f}: {default:?}");
    }
    assert!(!default.iter().any(|c| c == "dynamic-linking"), "{default:?}");
}
