//! The crate's floors, checked on the source text: every module stands on a floor and names (by `crate::`,
//! `super::` or a name the crate root re-exports) only modules on floors below its own, so no import circle
//! between modules can come back unnoticed. The bottom floor but for the element types and the error, `ffi`, is
//! a set of files: `src/ffi` and each GEMM family's launcher with its generated types (`src/kernels/<family>/launch.rs`,
//! see [`FFI_ELSEWHERE`]). It is where every `unsafe` lives: no other file contains `unsafe`.
//!
//! The check reads the code with comments and string literals blanked out (an intra-doc link is no import), and
//! resolves each path the way rustc does: `crate::` from the crate root, each `super::` one module up from the
//! file's module (and any inline `mod name { .. }` around the path), `{..}` groups item by item, and a name that
//! `src/lib.rs` re-exports (`crate::DeviceInfo`) to the module it comes from.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The library's modules, bottom floor first. A module may name modules on lower floors (and itself), never one
/// on its own floor or above.
const LIB_FLOORS: &[&[&str]] = &[
    &["dtype"],
    &["error"],
    // The one door to C++: element types and errors only.
    &["ffi"],
    &["device", "status", "view", "random"],
    &["layouts", "routing", "timing"],
    &["quant"],
    // The shared vocabulary: experts on the host, the layer's backends.
    &["experts", "backend"],
    &["kernels", "ceilings"],
    &["tuning"],
    &["checkpoint"],
    &["layer"],
    // Expert parallelism; the layer as a candle operation (`candle` feature).
    &["parallel", "candle"],
    // The CPU references of every part: they may use all of it, nothing in the library uses them.
    &["reference"],
];

/// The `moe-gemm` binary's command modules (`src/cli/`), bottom floor first.
const CLI_FLOORS: &[&[&str]] = &[
    &["args", "peer", "plot", "info", "compare"],
    &["layer_inputs", "plan", "ep_bench"],
    &["layer_fp8"],
    &["fp8_bench", "layer_bench"],
    &["bench"],
    &["tune"],
];

/// Modules that are part of the `ffi` unit (the bottom floor) though they live in another module's folder, as
/// path patterns (`*` any one segment; a pattern covers the modules under it too): each GEMM family's launcher
/// with its cxx bridge and the C++ types of its launch headers (`launch::sys`, generated), kept next to the
/// family's plans. They may name `ffi`, each other and the floors below, nothing else of `kernels`; they and `src/ffi` are
/// the only files with `unsafe`.
const FFI_ELSEWHERE: &[&[&str]] = &[&["kernels", "*", "launch"]];

/// Whether the module path `path` is one of [`FFI_ELSEWHERE`]'s (or inside one).
fn is_ffi_elsewhere(path: &[String]) -> bool {
    FFI_ELSEWHERE
        .iter()
        .any(|pattern| path.len() >= pattern.len() && pattern.iter().zip(path).all(|(p, seg)| *p == "*" || p == seg))
}

/// References that break a floor and are known, each with its reason: `(from, to, why)`. This list may only
/// shrink: a new entry is a new circle.
const KNOWN_EXCEPTIONS: &[(&str, &str, &str)] = &[];

/// One crate's part to check: its files, the module path of its directory and its floors.
struct Scope {
    /// The module path whose children the floors name: `[]` for the library, `["cli"]` for the binary.
    under: Vec<String>,
    floors: &'static [&'static [&'static str]],
    /// Names the crate root re-exports, to the path they come from (`DeviceInfo` → `device::DeviceInfo`).
    root_names: HashMap<String, Vec<String>>,
}

impl Scope {
    fn floor(&self, unit: &str) -> Option<usize> {
        self.floors.iter().position(|f| f.contains(&unit))
    }

    /// The unit (a module on a floor) that an absolute path names, if it names one.
    fn unit_of(&self, path: &[String]) -> Option<String> {
        let path = match path.first() {
            Some(first) if self.under.is_empty() && !self.floors.iter().any(|f| f.contains(&first.as_str())) => {
                self.root_names.get(first)?.clone()
            }
            _ => path.to_vec(),
        };
        if self.under.is_empty() && is_ffi_elsewhere(&path) {
            return Some("ffi".to_string());
        }
        let rest = path.strip_prefix(self.under.as_slice())?;
        let unit = rest.first()?;
        self.floor(unit).map(|_| unit.clone())
    }
}

/// A reference that breaks a floor.
#[derive(Debug, PartialEq)]
struct Violation {
    line: usize,
    from: String,
    to: String,
    written: String,
}

/// `text` with comments removed and the contents of string and char literals blanked, newlines kept (so line
/// numbers hold).
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if c[i] == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&c, i) {
            // Raw string: r"..", r#".."#.
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            out.push('"');
            j += 1;
            while j < c.len() && !(c[j] == '"' && (1..=hashes).all(|h| c.get(j + h) == Some(&'#'))) {
                out.push(blank(c[j]));
                j += 1;
            }
            out.push('"');
            i = j + 1 + hashes;
        } else if c[i] == '"' {
            out.push('"');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
        } else if c[i] == '\'' && (c.get(i + 2) == Some(&'\'') || next == Some('\\')) {
            // A char literal ('{', '\n', '\''); a lifetime has no closing quote.
            let mut j = i + 1;
            if c[j] == '\\' {
                j += 1;
            }
            j += 1;
            while j < c.len() && c[j] != '\'' {
                j += 1;
            }
            out.push_str("' '");
            i = j + 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn ident_before(c: &[char], i: usize) -> bool {
    i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_')
}

/// A tiny reader of Rust paths over code without comments.
struct Reader<'a> {
    c: &'a [char],
    i: usize,
}

impl Reader<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.c.len() && self.c[self.i].is_whitespace() {
            self.i += 1;
        }
    }
    fn eat(&mut self, s: &str) -> bool {
        self.skip_ws();
        let n = s.chars().count();
        if self.c.len() >= self.i + n && self.c[self.i..self.i + n].iter().copied().eq(s.chars()) {
            self.i += n;
            true
        } else {
            false
        }
    }
    fn ident(&mut self) -> Option<String> {
        self.skip_ws();
        let start = self.i;
        while self.i < self.c.len() && (self.c[self.i].is_alphanumeric() || self.c[self.i] == '_') {
            self.i += 1;
        }
        (self.i > start).then(|| self.c[start..self.i].iter().collect())
    }

    /// The paths that continue `prefix` here: `a::b`, `{a, b::{c, d}}`, `*`.
    fn paths(&mut self, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        if self.eat("{") {
            loop {
                if self.eat("}") {
                    return;
                }
                self.paths(prefix.clone(), out);
                if !self.eat(",") {
                    self.eat("}");
                    return;
                }
            }
        }
        let Some(seg) = self.ident() else {
            out.push(prefix);
            return;
        };
        let mut path = prefix;
        path.push(seg);
        if self.eat("::") {
            self.paths(path, out);
        } else {
            out.push(path);
            // `a::B as C`
            let at = self.i;
            if self.ident().as_deref() == Some("as") {
                self.ident();
            } else {
                self.i = at;
            }
        }
    }
}

/// Every path in `code` that starts at `crate::` or `super::`, resolved to an absolute module path from the
/// file's module `module`, with its line and the words as written.
fn references(code: &str, module: &[String]) -> Vec<(usize, Vec<String>, String)> {
    let c: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    // Inline modules around the reader: (name, brace depth at which its body opened).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut line = 1;
    let mut i = 0;
    while i < c.len() {
        match c[i] {
            '\n' => line += 1,
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|m| m.1 > depth) {
                    inline.pop();
                }
            }
            _ => {}
        }
        let word_start = c[i].is_alphabetic() && !ident_before(&c, i);
        if !word_start {
            i += 1;
            continue;
        }
        let mut r = Reader { c: &c, i };
        let word = r.ident().unwrap_or_default();
        let word_end = r.i;
        if word == "mod" {
            if let Some(name) = r.ident() {
                if r.eat("{") {
                    depth += 1;
                    inline.push((name, depth));
                    line += c[i..r.i].iter().filter(|&&ch| ch == '\n').count();
                    i = r.i;
                    continue;
                }
            }
            r.i = word_end;
        }
        if (word == "crate" || word == "super") && r.eat("::") {
            let mut here: Vec<String> = module.to_vec();
            here.extend(inline.iter().map(|m| m.0.clone()));
            let start = if word == "crate" {
                Vec::new()
            } else {
                here.pop();
                let mut reader = Reader { c: &c, i: r.i };
                while reader.eat("super") && reader.eat("::") {
                    here.pop();
                    r.i = reader.i;
                }
                here
            };
            let mut paths = Vec::new();
            r.paths(start, &mut paths);
            let written: String = c[i..r.i].iter().collect::<String>().split_whitespace().collect();
            found.extend(paths.into_iter().map(|p| (line, p, written.clone())));
            line += c[i..r.i].iter().filter(|&&ch| ch == '\n').count();
            i = r.i;
            continue;
        }
        i = word_end;
    }
    found
}

/// The floor violations of one file's text, whose module path is `module`.
fn check_source(scope: &Scope, module: &[String], text: &str) -> Vec<Violation> {
    let Some(from) = scope.unit_of(module) else { return Vec::new() };
    let here = scope.floor(&from).expect("a unit has a floor");
    references(&code_only(text), module)
        .into_iter()
        .filter_map(|(line, path, written)| {
            let to = scope.unit_of(&path)?;
            let there = scope.floor(&to).expect("a unit has a floor");
            (to != from && there >= here).then_some(Violation { line, from: from.clone(), to, written })
        })
        .filter(|v| !KNOWN_EXCEPTIONS.iter().any(|&(f, t, _)| f == v.from && t == v.to))
        .collect()
}

/// `src/lib.rs`'s `pub use` items, by the name they are reachable under at the root.
fn root_names(lib: &str) -> HashMap<String, Vec<String>> {
    let code = code_only(lib);
    let c: Vec<char> = code.chars().collect();
    let mut names = HashMap::new();
    for (at, _) in code.match_indices("pub use ") {
        let i = code[..at].chars().count() + "pub use ".len();
        let mut r = Reader { c: &c, i };
        let mut paths = Vec::new();
        r.paths(Vec::new(), &mut paths);
        for p in paths {
            if let Some(last) = p.last() {
                names.insert(last.clone(), p.clone());
            }
        }
    }
    names
}

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

/// The module path of a file under `src` (`src/layer/mod.rs` → `layer`, `src/lib.rs` → the root).
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).unwrap().with_extension("");
    let mut path: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    if matches!(path.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        path.pop();
    }
    path
}

/// Checks every file of `files` in `scope`, and that each of their modules has a floor.
fn check_files(scope: &Scope, files: &[PathBuf]) -> Vec<String> {
    let mut bad = Vec::new();
    for file in files {
        let module = module_of(file);
        let f = file.strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap_or(file);
        let Some(unit) = module.strip_prefix(scope.under.as_slice()).and_then(|m| m.first()) else { continue };
        if scope.floor(unit).is_none() {
            bad.push(format!("{}: module `{unit}` stands on no floor: give it one in tests/layering.rs", f.display()));
            continue;
        }
        for v in check_source(scope, &module, &fs::read_to_string(file).unwrap()) {
            let floor = |u: &str| scope.floor(u).unwrap() + 1;
            bad.push(format!(
                "{}:{}: `{}` (floor {}) names `{}` (floor {}): `{}`",
                f.display(),
                v.line,
                v.from,
                floor(&v.from),
                v.to,
                floor(&v.to),
                v.written
            ));
        }
    }
    bad
}

fn lib_scope() -> Scope {
    Scope {
        under: Vec::new(),
        floors: LIB_FLOORS,
        root_names: root_names(&fs::read_to_string(src().join("lib.rs")).unwrap()),
    }
}

#[test]
fn no_library_module_names_one_on_its_floor_or_above() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let cli = src().join("cli");
    files.retain(|f| !f.starts_with(&cli) && f.file_name().is_some_and(|n| n != "main.rs"));
    assert!(files.len() >= 50, "expected the library's files under src, found {}", files.len());
    let bad = check_files(&lib_scope(), &files);
    assert!(
        bad.is_empty(),
        "a module names one that is not below it (move the name down, or the code up):\n{}",
        bad.join("\n")
    );
}

#[test]
fn no_command_module_names_one_on_its_floor_or_above() {
    let mut files = Vec::new();
    rust_files(&src().join("cli"), &mut files);
    assert!(files.len() >= 10, "expected the binary's modules under src/cli, found {files:?}");
    let scope = Scope { under: vec!["cli".into()], floors: CLI_FLOORS, root_names: HashMap::new() };
    let bad = check_files(&scope, &files);
    assert!(bad.is_empty(), "a command module names one that is not below it:\n{}", bad.join("\n"));
}

#[test]
fn every_floor_lists_existing_modules_once() {
    let mut seen: Vec<&str> = Vec::new();
    for unit in LIB_FLOORS.iter().flat_map(|f| f.iter()) {
        assert!(!seen.contains(unit), "{unit} stands on two floors");
        seen.push(unit);
        let (file, dir) = (src().join(format!("{unit}.rs")), src().join(unit).join("mod.rs"));
        assert!(file.exists() || dir.exists(), "LIB_FLOORS names {unit}, which is no module under src");
    }
    for unit in CLI_FLOORS.iter().flat_map(|f| f.iter()) {
        assert!(src().join("cli").join(format!("{unit}.rs")).exists(), "CLI_FLOORS names {unit}, not in src/cli");
    }
}

/// The checker itself: an upward import planted in a synthetic source is reported, in each way of writing it.
#[test]
fn the_floor_check_reports_a_planted_upward_import() {
    let scope = Scope {
        under: Vec::new(),
        floors: LIB_FLOORS,
        root_names: root_names("pub use layer::{MoeLayer, MoeLayerOptions};\npub use dtype::DType;"),
    };
    let kernels = |file: &str| vec!["kernels".to_string(), file.to_string()];
    let reported = |module: &[String], text: &str| check_source(&scope, module, text);
    let planted = [
        "use crate::layer::Activation;",
        "fn f(t: crate :: layer :: ExpertWeights<T>) {}",
        "use crate::{dtype::DType, layer::ExpertWeights};",
        "use crate::{dtype::DType, kernels::{grouped::GroupRows, fused}, tuning::TunedBackends};",
        "use super::super::layer::ExpertWeights;",
        "fn f() -> crate::MoeLayer<T, W> { todo!() }",
        "mod tests {\n    use super::super::super::checkpoint::Checkpoint;\n}",
    ];
    for text in planted {
        let v = reported(&kernels("elementwise"), text);
        assert_eq!(v.len(), 1, "{text:?}: {v:?}");
        assert_eq!(v[0].from, "kernels");
        assert!(["layer", "tuning", "checkpoint"].contains(&v[0].to.as_str()), "{text:?}: {v:?}");
    }
    // Same floor is no better than above: kernels naming ceilings.
    assert_eq!(reported(&kernels("grouped"), "use crate::ceilings::Ceilings;").len(), 1);
    // The line is the reference's.
    assert_eq!(reported(&kernels("fused"), "use crate::dtype::DType;\n\nuse crate::layer::Backend;")[0].line, 3);
    // Downward and sideways-within-the-module references, comments, strings and doc links are no violations.
    let clean = "//! See [`crate::layer::MoeLayer`].\nuse super::TileConfig;\nuse super::grouped::Workspace;\n\
                 use crate::dtype::{DType, Element};\nuse crate::error::Result;\nuse crate::{experts::GateUp, quant};\n\
                 /* crate::layer */ const S: &str = \"crate::layer::x\";\nfn f() -> crate::DType { todo!() }\n\
                 mod tests {\n    use super::*;\n    use super::super::fused::FusedGemm;\n}";
    assert_eq!(reported(&kernels("grouped"), clean), []);
    // A module's own `mod.rs`: `super` is the crate root there.
    assert_eq!(reported(&["kernels".to_string()], "use super::layer::Activation;").len(), 1);
    assert_eq!(reported(&["kernels".to_string()], "use super::experts::Activation;"), []);
    // A family's launcher is of the bottom floor: it names ffi and below, never its family's plans nor anything
    // else above ffi; the plans name it freely.
    let launch = |family: &str| vec!["kernels".to_string(), family.to_string(), "launch".to_string()];
    for text in [
        "use super::sm90::GroupedGemm;",
        "use crate::kernels::plan::Workspace;",
        "use crate::layouts::GroupRows;",
        "use super::super::fp8_blockwise::sm90::check_fp8_extents;",
        "mod tests {\n    use super::super::MxGemm;\n}",
    ] {
        let v = reported(&launch("dense"), text);
        assert_eq!(v.len(), 1, "{text:?}: {v:?}");
        assert_eq!(v[0].from, "ffi", "{text:?}");
    }
    let clean = "use crate::ffi::sys;\nuse crate::ffi::gemm::GroupedRows;\nuse crate::dtype::DType;\n\
                 use crate::kernels::fp8_blockwise::launch::Fp8Plan;";
    assert_eq!(reported(&launch("mx"), clean), []);
    let plans = "use super::launch;\nuse crate::kernels::dense::launch::built;\nuse super::super::fused::FusedGemm;";
    assert_eq!(reported(&["kernels".to_string(), "dense".to_string(), "sm90".to_string()], plans), []);
}

#[test]
fn ffi_is_a_floor_below_every_domain_module() {
    let ffi = LIB_FLOORS.iter().position(|f| f.contains(&"ffi")).unwrap();
    for m in ["layer", "layouts", "routing", "kernels", "quant", "experts", "checkpoint"] {
        assert!(LIB_FLOORS.iter().position(|f| f.contains(&m)).unwrap() > ffi, "{m}");
    }
}

/// Whether `text`, with `//` comments removed, has the identifier `unsafe` (so `unsafe_op_in_unsafe_fn` in a
/// lint attribute does not count).
fn has_unsafe_token(text: &str) -> bool {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .any(|code| code.split(|c: char| !(c.is_alphanumeric() || c == '_')).any(|token| token == "unsafe"))
}

#[test]
fn the_unsafe_check_can_fail() {
    assert!(has_unsafe_token("let x = unsafe { f() };"));
    assert!(has_unsafe_token("pub unsafe fn g() {}"));
    assert!(!has_unsafe_token("#![deny(unsafe_op_in_unsafe_fn)]"));
    assert!(!has_unsafe_token("let y = 1; // not unsafe"));
}

#[test]
fn unsafe_lives_only_in_ffi() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let ffi = src().join("ffi");
    let elsewhere: Vec<&PathBuf> = files.iter().filter(|f| is_ffi_elsewhere(&module_of(f))).collect();
    assert!(elsewhere.len() >= 4, "expected the GEMM families' launchers under src/kernels, found {elsewhere:?}");
    let outside: Vec<&PathBuf> =
        files.iter().filter(|f| !f.starts_with(&ffi) && !is_ffi_elsewhere(&module_of(f))).collect();
    assert!(outside.len() >= 10, "expected the crate's modules under src, found {outside:?}");
    let bad: Vec<String> = outside
        .into_iter()
        .filter(|f| has_unsafe_token(&fs::read_to_string(f).unwrap()))
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        bad.is_empty(),
        "`unsafe` outside the bottom floor, src/ffi and src/kernels/<family>/launch.rs (move it there, with its \
         SAFETY argument):\n{}",
        bad.join("\n")
    );
}
