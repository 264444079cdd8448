//! The crate's floors, checked on the source text: `src/ffi` (the bottom floor, where every `unsafe` lives) names
//! no domain module, and no file outside it contains `unsafe`.

use std::fs;
use std::path::{Path, PathBuf};

/// Domain modules the bottom floor must not reach up into (by `crate::` or the crate's own name), and
/// `super::super`, which climbs out of `ffi` without naming `crate`.
const DOMAIN: &[&str] = &["layer", "layouts", "routing", "kernels"];
const ROOTS: &[&str] = &["crate::", "moe_gemm::"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every way `text` names a domain module: the forbidden paths, and `crate::{..}` groups that list one.
fn domain_references(text: &str) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join("");
    for root in ROOTS {
        for m in DOMAIN {
            if flat.contains(&format!("{root}{m}")) {
                found.push(format!("{root}{m}"));
            }
        }
    }
    if flat.contains("super::super") {
        found.push("super::super".into());
    }
    // `use crate::{dtype, kernels::TileConfig}`: the names inside a group that starts at the crate root.
    let mut rest = flat.as_str();
    while let Some(i) = rest.find("crate::{") {
        let group = &rest[i + "crate::{".len()..];
        let end = group.find('}').unwrap_or(group.len());
        for item in group[..end].split(',') {
            let head = item.split("::").next().unwrap_or("");
            if DOMAIN.contains(&head) {
                found.push(format!("crate::{{{head}..}}"));
            }
        }
        rest = &group[end..];
    }
    found
}

/// Whether `text`, with `//` comments removed, has the identifier `unsafe` (so `unsafe_op_in_unsafe_fn` in a
/// lint attribute does not count).
fn has_unsafe_token(text: &str) -> bool {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .any(|code| code.split(|c: char| !(c.is_alphanumeric() || c == '_')).any(|token| token == "unsafe"))
}

#[test]
fn the_checks_can_fail() {
    assert!(!domain_references("use crate::layer::Activation;").is_empty());
    assert!(!domain_references("fn f(t: crate :: kernels :: TileConfig) {}").is_empty());
    assert!(!domain_references("use crate::{dtype::DType, routing::RouterKind};").is_empty());
    assert!(!domain_references("use super::super::layouts::LayoutDims;").is_empty());
    assert!(!domain_references("fn f(_: &moe_gemm::layer::ExpertWeights<T>) {}").is_empty());
    assert!(domain_references("use crate::dtype::{DType, Element};\nuse crate::error::Result;").is_empty());
    assert!(has_unsafe_token("let x = unsafe { f() };"));
    assert!(has_unsafe_token("pub unsafe fn g() {}"));
    assert!(!has_unsafe_token("#![deny(unsafe_op_in_unsafe_fn)]"));
    assert!(!has_unsafe_token("let y = 1; // not unsafe"));
}

#[test]
fn ffi_names_no_domain_module() {
    let mut files = Vec::new();
    rust_files(&src().join("ffi"), &mut files);
    assert!(files.len() >= 5, "expected the ffi modules under src/ffi, found {files:?}");
    let bad: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let refs = domain_references(&fs::read_to_string(f).unwrap());
            (!refs.is_empty()).then(|| format!("{}: {}", f.display(), refs.join(", ")))
        })
        .collect();
    assert!(bad.is_empty(), "src/ffi is the bottom floor and must not name domain modules:\n{}", bad.join("\n"));
}

#[test]
fn unsafe_lives_only_in_ffi() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let ffi = src().join("ffi");
    let outside: Vec<&PathBuf> = files.iter().filter(|f| !f.starts_with(&ffi)).collect();
    assert!(outside.len() >= 10, "expected the crate's modules under src, found {outside:?}");
    let bad: Vec<String> = outside
        .into_iter()
        .filter(|f| has_unsafe_token(&fs::read_to_string(f).unwrap()))
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        bad.is_empty(),
        "`unsafe` outside src/ffi (move it into ffi, with its SAFETY argument):\n{}",
        bad.join("\n")
    );
}
