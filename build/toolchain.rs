//! Helpers of the build script: the kernel units and their targets, parsing tool versions, hashing inputs.
//! Pure but for reading the units' declarations, so that `tests/build_helpers.rs` can unit-test them
//! (`#[path]`-included there).

/// One compilation target of a kernel unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Real code (SASS) for one GPU architecture. An arch-specific one (`sm_90a`, `sm_100a`: wgmma, tcgen05) comes
    /// from the PTX of its own virtual architecture (`compute_90a`) and runs on that compute capability only. A
    /// plain one (`sm_90`, `sm_100`) is lowered by ptxas from the unit's portable PTX target (see [`gencodes`]).
    Sass(&'static str),
    /// PTX of a portable virtual architecture, e.g. `compute_90`, embedded for the driver to JIT-compile on GPUs
    /// that have no SASS in the library. Never an arch-specific (`a`) one: such PTX does not JIT onto any other GPU.
    Ptx(&'static str),
}

impl Target {
    /// The name as nvcc and cuobjdump spell it: `sm_90a`, `sm_90`, `compute_90`.
    pub fn name(self) -> &'static str {
        match self {
            Target::Sass(n) | Target::Ptx(n) => n,
        }
    }

    /// SASS of an arch-specific target (`sm_90a`, `sm_100a`), which needs the PTX of its own virtual architecture.
    pub fn is_arch_specific(self) -> bool {
        matches!(self, Target::Sass(n) if n.ends_with('a'))
    }
}

/// nvcc's `-gencode` flags for a unit's targets. Each arch-specific SASS target gets its own pair (one cicc pass
/// each, from `compute_90a` / `compute_100a`). The plain SASS targets and the PTX target share one flag,
/// `-gencode=arch=compute_90,code=[sm_90,sm_100,compute_90]`: cicc runs once and ptxas lowers its PTX to each SASS.
/// (As three pairs, cicc ran three times: the ten plain units took 65 s of user time on the 2-core build machine,
/// 38 s as one pass each, 2026-12-03.) Panics on plain SASS without exactly one PTX target to lower it from.
pub fn gencodes(targets: &[Target]) -> Vec<String> {
    let mut out: Vec<String> = targets
        .iter()
        .filter(|t| t.is_arch_specific())
        .map(|t| format!("-gencode=arch={},code={}", t.name().replacen("sm_", "compute_", 1), t.name()))
        .collect();
    let plain: Vec<&str> =
        targets.iter().filter(|t| matches!(t, Target::Sass(_)) && !t.is_arch_specific()).map(|t| t.name()).collect();
    let ptx: Vec<&str> = targets.iter().filter(|t| matches!(t, Target::Ptx(_))).map(|t| t.name()).collect();
    match (plain.as_slice(), ptx.as_slice()) {
        ([], []) => {}
        ([], [p]) => out.push(format!("-gencode=arch={p},code={p}")),
        (sass, [p]) => out.push(format!("-gencode=arch={p},code=[{},{p}]", sass.join(","))),
        _ => panic!("plain SASS targets {plain:?} need exactly one PTX target to lower them from, not {ptx:?}"),
    }
    out
}

/// Hopper's arch-specific features (wgmma, setmaxnreg, TMA multicast): SM90 only.
pub const SM90A: &[Target] = &[Target::Sass("sm_90a")];
/// Blackwell's arch-specific features (tcgen05 UMMA, tensor memory): SM100 (compute capability 10.0) only.
pub const SM100A: &[Target] = &[Target::Sass("sm_100a")];
/// Plain CUDA (no arch-specific instruction): SASS for both GPUs moe-gemm knows, lowered from the compute_90 PTX
/// that is embedded too, for newer GPUs to JIT.
pub const PORTABLE: &[Target] = &[Target::Sass("sm_90"), Target::Sass("sm_100"), Target::Ptx("compute_90")];

/// A CUDA translation unit: the gencode family it joins (one of src/device/family.rs's `KernelFamily`; the units of
/// one family share their targets), its targets, and how long its nvcc takes on the 2-core build machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelUnit {
    pub path: String,
    pub family: String,
    pub targets: &'static [Target],
    pub seconds: u32,
}

/// How a unit declares itself: one line of its opening comment, e.g.
/// `// moe-gemm unit: family=grouped_gemm_sm90 targets=sm_90a seconds=75`. `targets` is `sm_90a` ([`SM90A`]),
/// `sm_100a` ([`SM100A`]) or `portable` ([`PORTABLE`]); `seconds`, its nvcc's wall time on the 2-core build
/// machine, orders the build. So a new unit is found by the build where it stands, with no line elsewhere.
pub const UNIT_DECLARATION: &str = "// moe-gemm unit:";

/// The declaration of the unit at `path` (crate-relative) whose text is `text`.
pub fn parse_unit(path: &str, text: &str) -> Result<KernelUnit, String> {
    let line = text.lines().find_map(|l| l.strip_prefix(UNIT_DECLARATION)).ok_or_else(|| {
        format!(
            "{path} declares no unit: add `{UNIT_DECLARATION} family=NAME targets=sm_90a|sm_100a|portable seconds=N`"
        )
    })?;
    let (mut family, mut targets, mut seconds) = (None, None, None);
    for word in line.split_whitespace() {
        match word.split_once('=') {
            Some(("family", f)) if !f.is_empty() => family = Some(f.to_string()),
            Some(("targets", "sm_90a")) => targets = Some(SM90A),
            Some(("targets", "sm_100a")) => targets = Some(SM100A),
            Some(("targets", "portable")) => targets = Some(PORTABLE),
            Some(("seconds", n)) => seconds = n.parse().ok(),
            _ => return Err(format!("{path}: `{word}` in its unit declaration: expected family=, targets= (sm_90a, sm_100a or portable) or seconds=")),
        }
    }
    match (family, targets, seconds) {
        (Some(family), Some(targets), Some(seconds)) => {
            Ok(KernelUnit { path: path.to_string(), family, targets, seconds })
        }
        _ => Err(format!("{path}: its unit declaration needs family=, targets= and seconds=")),
    }
}

/// The CUDA translation units with their targets, the gencode table: every `cpp/<folder>/*.cu`, each declared in
/// its own text ([`UNIT_DECLARATION`]), none compiled by accident (an undeclared one is an error). A CUTLASS family
/// is one unit (its dtypes and schedules in `.inl` parts the unit includes), because nvcc's cost is mostly per
/// unit: on the 2-core build machine (2026-12-02, user time) a unit that only includes the SM90 grouped GEMM's
/// header takes 14 s (CUTLASS parsed by cudafe++, cicc and the host compiler), its first kernel 33 s more, each
/// further kernel 3.5-8 s. In build order: the heaviest first, so that the small ones fill the other core while
/// they compile. The SM100 GEMMs are one unit per family, not one for all, for memory too: as one unit nvcc peaked
/// at 9.3 GB (of the machine's 24, with another unit compiling beside it), the larger of two halves at 7.3 GB.
pub fn kernel_units(root: &std::path::Path) -> Result<Vec<KernelUnit>, String> {
    let mut units = Vec::new();
    let folders = std::fs::read_dir(root.join("cpp")).map_err(|e| format!("cpp/: {e}"))?;
    for folder in folders.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_dir()) {
        let files = std::fs::read_dir(&folder).map_err(|e| format!("{}: {e}", folder.display()))?;
        for file in files.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|e| e == "cu"))
        {
            let path = file.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&file).map_err(|e| format!("{path}: {e}"))?;
            units.push(parse_unit(&path, &text)?);
        }
    }
    units.sort_by(|a, b| b.seconds.cmp(&a.seconds).then_with(|| a.path.cmp(&b.path)));
    Ok(units)
}

/// Each family once, in table order, with its targets (those of its first unit).
pub fn families(units: &[KernelUnit]) -> Vec<(&str, &'static [Target])> {
    let mut out: Vec<(&str, &'static [Target])> = Vec::new();
    for u in units {
        if !out.iter().any(|(f, _)| *f == u.family) {
            out.push((&u.family, u.targets));
        }
    }
    out
}

/// What `moe_gemm::build_info::CUDA_ARCHS` says: `family: target, target; family: ...`, PTX marked `(PTX)`.
pub fn describe_families(units: &[KernelUnit]) -> String {
    let names = |ts: &[Target]| -> String {
        ts.iter()
            .map(|t| match t {
                Target::Sass(n) => n.to_string(),
                Target::Ptx(n) => format!("{n} (PTX)"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    families(units).iter().map(|(f, ts)| format!("{f}: {}", names(ts))).collect::<Vec<_>>().join("; ")
}

/// The Rust table the library includes (`OUT_DIR/kernel_families.rs`): per family, its SASS targets, its PTX
/// targets, and the SASS targets as an error message names them (`sm_90 or sm_100`).
pub fn families_rs(units: &[KernelUnit]) -> String {
    let pick = |ts: &[Target], sass: bool| -> Vec<&'static str> {
        ts.iter().filter(|t| matches!(t, Target::Sass(_)) == sass).map(|t| t.name()).collect()
    };
    let list = |names: &[&str]| -> String {
        format!("&[{}]", names.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", "))
    };
    let mut s = String::from(
        "// Generated by build.rs from the kernel units' declarations (build/toolchain.rs):\n\
         // (family, SASS targets, PTX targets, the SASS targets in words).\n\
         pub(crate) const FAMILY_TARGETS: &[(&str, &[&str], &[&str], &str)] = &[\n",
    );
    for (f, ts) in families(units) {
        let sass = pick(ts, true);
        s += &format!("    ({f:?}, {}, {}, {:?}),\n", list(&sass), list(&pick(ts, false)), sass.join(" or "));
    }
    s += "];\n";
    s
}

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

/// The libclang bindgen loads (build/bindings.rs) where `LIBCLANG_PATH` names none: clang 18's, from PyPI.
pub const LIBCLANG_PIN: &str = "libclang==18.1.1";

/// The disassembler wheels `tests/sass.rs` installs (into the target folder, not the build's toolchain) to read
/// the kernels' SASS. No 13.0 wheel of either exists on PyPI; 13.2.51 is the oldest, and reads CUDA 13.0's
/// sm_90a and sm_100a cubins. `cuobjdump -sass` runs `nvdisasm`, so both, of one release.
#[allow(dead_code)] // read by tests/sass.rs, not by the build
pub const SASS_TOOL_PINS: &[&str] = &["nvidia-cuda-cuobjdump==13.2.51", "nvidia-cuda-nvdisasm==13.2.51"];

/// The `cuda-*` features of moe-gemm that choose cudarc's link mode and CUDA version, as the build script sees
/// them (`CARGO_FEATURE_*`), plus whether `CUDARC_CUDA_VERSION` names a version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudarcChoice {
    pub dynamic_loading: bool,
    pub dynamic_linking: bool,
    pub cuda_13000: bool,
    pub version_from_build_system: bool,
    pub version_from_env: bool,
}

/// What is wrong with a choice of cudarc's link mode and version, as a message naming the features, or `None`.
/// cudarc 0.19's build script panics on none or several link modes and on no version; this says so first, in
/// moe-gemm's terms.
pub fn cudarc_choice_problem(c: CudarcChoice) -> Option<String> {
    const CANDLE: &str = "next to candle-core (`cuda`), whose cudarc uses dynamic linking, depend on moe-gemm with \
                          `default-features = false, features = [\"cuda-dynamic-linking\", \
                          \"cuda-version-from-build-system\"]`";
    match (c.dynamic_loading, c.dynamic_linking) {
        (true, true) => {
            return Some(format!(
                "features `cuda-dynamic-loading` and `cuda-dynamic-linking` are both on; cudarc accepts one link \
                 mode. `cuda-dynamic-loading` is a default feature: {CANDLE}"
            ))
        }
        (false, false) => {
            return Some(format!(
                "neither `cuda-dynamic-loading` nor `cuda-dynamic-linking` is on; choose one (the default is \
                 `cuda-dynamic-loading`; {CANDLE})"
            ))
        }
        _ => {}
    }
    if !(c.cuda_13000 || c.version_from_build_system || c.version_from_env) {
        return Some(
            "no CUDA version for cudarc: turn on `cuda-13000` (the default) or `cuda-version-from-build-system` \
             (asks the nvcc on PATH), or set CUDARC_CUDA_VERSION"
                .into(),
        );
    }
    None
}
