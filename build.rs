//! Builds the CUDA kernels of moe-gemm and the cxx bridges.
//!
//! 1. Finds nvcc (>= 12.8) and CUTLASS (>= 4.0); where either is missing, provisions the pinned CUDA 13.0
//!    toolkit and CUTLASS 4.2 from PyPI into `third_party/pypi` (set `MOE_GEMM_NO_PROVISION=1` to forbid that).
//! 2. Compiles every `cpp/<folder>/*.cu` (build/toolchain.rs's `kernel_units`: each unit declares its own targets, e.g. sm_90a
//!    only for the Hopper GEMMs, sm_100a only for the Blackwell ones, sm_90 and sm_100 lowered from compute_90
//!    PTX, which is embedded too, for the plain kernels) with one nvcc process each, two at a time, into objects
//!    cached under OUT_DIR by a hash of their inputs: a bridge edit reruns this script but recompiles no CUDA.
//! 3. Generates the Rust types of the C++ launch headers with bindgen (build/bindings.rs; libclang from
//!    `LIBCLANG_PATH`, else the pinned PyPI wheel provisioned into `third_party/libclang`).
//! 4. Compiles the cxx bridges (`src/ffi/bridge.rs` and each family's `src/kernels/<family>/launch.rs`) with the
//!    host compiler and links cudart statically.

#[path = "build/bindings.rs"]
mod bindings;
#[path = "build/toolchain.rs"]
mod toolchain;

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use toolchain::*;

fn main() {
    // First, before any work: cudarc's own build script would panic on the same mistakes, in its terms.
    println!("cargo:rerun-if-env-changed=CUDARC_CUDA_VERSION");
    let feature = |f: &str| env::var_os(format!("CARGO_FEATURE_{f}")).is_some();
    let choice = CudarcChoice {
        dynamic_loading: feature("CUDA_DYNAMIC_LOADING"),
        dynamic_linking: feature("CUDA_DYNAMIC_LINKING"),
        cuda_13000: feature("CUDA_13000"),
        version_from_build_system: feature("CUDA_VERSION_FROM_BUILD_SYSTEM"),
        version_from_env: env::var_os("CUDARC_CUDA_VERSION").is_some(),
    };
    if let Some(problem) = cudarc_choice_problem(choice) {
        fail(&problem, "");
    }

    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    // The bridges, and cpp/ (where a new family's folder comes with its unit): not all of src/kernels, whose
    // plans the build script does not read.
    let bridges = bridge_files(&root);
    fs::write(out.join("kernel_modules.rs"), kernel_modules(&root, &bridges[1..])).unwrap();
    for p in ["build.rs", "build/bindings.rs", "build/toolchain.rs", "cpp"] {
        println!("cargo:rerun-if-changed={p}");
    }
    for p in &bridges {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    for v in [
        "NVCC",
        "CUDA_HOME",
        "CUDA_PATH",
        "CUTLASS_DIR",
        "MOE_GEMM_NO_PROVISION",
        "MOE_GEMM_LINEINFO",
        "PYTHON",
        "NVCC_CCBIN",
        "MOE_GEMM_CUDA_CACHE",
        "MOE_GEMM_PLANT",
        "LIBCLANG_PATH",
    ] {
        println!("cargo:rerun-if-env-changed={v}");
    }

    let tc = Toolchain::find_or_provision(&root);
    println!("cargo:rustc-env=MOE_GEMM_NVCC={}", tc.nvcc.display());
    println!("cargo:rustc-env=MOE_GEMM_NVCC_RELEASE={}.{}", tc.nvcc_release.0, tc.nvcc_release.1);
    let (cm, cn, cp) = tc.cutlass_version;
    println!("cargo:rustc-env=MOE_GEMM_CUTLASS_VERSION={cm}.{cn}.{cp}");
    println!("cargo:rustc-env=MOE_GEMM_CUTLASS_DIR={}", tc.cutlass.display());
    let units = kernel_units(&root).unwrap_or_else(|problem| fail(&problem, ""));
    println!("cargo:rustc-env=MOE_GEMM_CUDA_ARCHS={}", describe_families(&units));
    fs::write(out.join("kernel_families.rs"), families_rs(&units)).unwrap();

    // The Rust types of the launch headers, which the bridges take.
    find_or_provision_libclang(&root);
    if let Err(problem) = bindings::generate(&root, &out, &bridges[1..]) {
        fail(&problem, "");
    }

    // The bridge first: it references the CUDA library, which must come after it on the link line.
    cxx_build::bridges(&bridges)
        .include(root.join("cpp"))
        .std("c++17")
        .flag_if_supported("-Wno-unused-parameter")
        .compile("moe_gemm_bridge");

    let objects = compile_cuda(&root, &out, &tc, &units);
    // For tests/sass.rs, which disassembles each unit's object: `unit=object;...`.
    let listing: Vec<String> = units.iter().zip(&objects).map(|(u, o)| format!("{}={}", u.path, o.display())).collect();
    println!("cargo:rustc-env=MOE_GEMM_CUDA_OBJECTS={}", listing.join(";"));
    let lib = out.join("libmoe_gemm_cuda.a");
    let _ = fs::remove_file(&lib);
    let ar = env::var("AR").unwrap_or_else(|_| "ar".into());
    run(Command::new(&ar).arg("crs").arg(&lib).args(&objects), "ar");

    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=moe_gemm_cuda");
    println!("cargo:rustc-link-search=native={}", tc.cudart_dir.display());
    println!("cargo:rustc-link-lib=static=cudart_static");
    for l in ["stdc++", "dl", "rt", "pthread"] {
        println!("cargo:rustc-link-lib=dylib={l}");
    }
    if choice.dynamic_linking {
        // cudarc links libcuda (-lcuda) and finds it through CUDA_HOME / CUDA_PATH / CUDA_ROOT or the system
        // folders. A toolkit's driver stub serves the link on a machine without a driver; the PyPI wheels that
        // provision ours ship none, so this adds the folder only where the toolkit has one.
        let cuda_root = tc.nvcc.parent().and_then(Path::parent).unwrap();
        for d in ["lib/stubs", "lib64/stubs", "targets/x86_64-linux/lib/stubs"] {
            let d = cuda_root.join(d);
            if d.join("libcuda.so").is_file() {
                println!("cargo:rustc-link-search=native={}", d.display());
            }
        }
    }
}

struct Toolchain {
    nvcc: PathBuf,
    nvcc_release: (u32, u32),
    cuda_include: Vec<PathBuf>,
    cudart_dir: PathBuf,
    cutlass: PathBuf,
    cutlass_version: (u32, u32, u32),
}

impl Toolchain {
    fn find_or_provision(root: &Path) -> Toolchain {
        let pypi = root.join("third_party/pypi");
        let mut nvcc = find_nvcc(&pypi);
        let mut cutlass = find_cutlass(root, &pypi);
        if nvcc.is_none() || cutlass.is_none() {
            provision(&pypi, nvcc.is_none(), cutlass.is_none());
            nvcc = nvcc.or_else(|| find_nvcc(&pypi));
            cutlass = cutlass.or_else(|| find_cutlass(root, &pypi));
        }
        let (nvcc, nvcc_release) = nvcc.unwrap_or_else(|| fail("nvcc still not found after provisioning", ""));
        let (cutlass, cutlass_version) =
            cutlass.unwrap_or_else(|| fail("CUTLASS still not found after provisioning", ""));
        let cuda_root = nvcc.parent().and_then(Path::parent).unwrap().to_path_buf();
        let mut cuda_include = vec![cuda_root.join("include")];
        if cuda_root.join("include/cccl").is_dir() {
            cuda_include.push(cuda_root.join("include/cccl"));
        }
        let cudart_dir = ["lib64", "lib", "targets/x86_64-linux/lib"]
            .iter()
            .map(|d| cuda_root.join(d))
            .find(|d| d.join("libcudart_static.a").is_file())
            .unwrap_or_else(|| {
                fail(
                    &format!("libcudart_static.a not found under {}", cuda_root.display()),
                    "install the CUDA runtime of the same release as nvcc (PyPI: nvidia-cuda-runtime)",
                )
            });
        Toolchain { nvcc, nvcc_release, cuda_include, cudart_dir, cutlass, cutlass_version }
    }
}

/// The files with a `#[cxx::bridge]`: the MoE operations' (`src/ffi/bridge.rs`) and each GEMM family's launcher
/// that declares one (`src/kernels/<family>/launch.rs`), found here so that a new family needs no line in this file.
fn bridge_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("src/ffi/bridge.rs")];
    let mut families: Vec<PathBuf> = fs::read_dir(root.join("src/kernels"))
        .unwrap()
        .filter_map(|e| Some(Path::new("src/kernels").join(e.ok()?.file_name()).join("launch.rs")))
        .filter(|p| fs::read_to_string(root.join(p)).is_ok_and(|t| t.contains("#[cxx::bridge")))
        .collect();
    families.sort();
    files.extend(families);
    files
}

/// The family modules of src/kernels, one per launcher, for src/kernels/mod.rs to include: a new family's folder
/// is a module with no line elsewhere.
fn kernel_modules(root: &Path, launchers: &[PathBuf]) -> String {
    let mut s = String::from("// Generated by build.rs: one module per family folder of src/kernels.\n");
    for launcher in launchers {
        let dir = root.join(launcher.parent().unwrap());
        let name = dir.file_name().unwrap().to_string_lossy();
        s += &format!("#[path = {:?}]\npub mod {name};\n", dir.join("mod.rs").display().to_string());
    }
    s
}

fn nvcc_release(nvcc: &Path) -> Option<(u32, u32)> {
    let out = Command::new(nvcc).arg("--version").output().ok()?;
    parse_nvcc_release(&String::from_utf8_lossy(&out.stdout))
}

/// `NVCC`, `CUDA_HOME`/`CUDA_PATH`, `PATH`, `/usr/local/cuda`, then the provisioned toolkit. An explicit choice
/// (the two variables) that is unusable is an error; a too-old nvcc found by searching is skipped with a warning.
fn find_nvcc(pypi: &Path) -> Option<(PathBuf, (u32, u32))> {
    let explicit = env::var_os("NVCC").map(PathBuf::from).or_else(|| {
        env::var_os("CUDA_HOME").or_else(|| env::var_os("CUDA_PATH")).map(|h| Path::new(&h).join("bin/nvcc"))
    });
    if let Some(p) = explicit {
        match nvcc_release(&p) {
            Some(v) if v >= MIN_NVCC => return Some((p, v)),
            Some(v) => fail(
                &format!(
                    "{} is CUDA {}.{}, older than the required {}.{}",
                    p.display(),
                    v.0,
                    v.1,
                    MIN_NVCC.0,
                    MIN_NVCC.1
                ),
                "point NVCC / CUDA_HOME at CUDA >= 12.8, or unset them to use the provisioned CUDA 13.0",
            ),
            None => fail(
                &format!("{} (from NVCC / CUDA_HOME / CUDA_PATH) does not run", p.display()),
                "fix or unset the variable",
            ),
        }
    }
    let mut candidates: Vec<PathBuf> =
        env::var_os("PATH").map(|p| env::split_paths(&p).map(|d| d.join("nvcc")).collect()).unwrap_or_default();
    candidates.push("/usr/local/cuda/bin/nvcc".into());
    candidates.push(pypi.join("nvidia/cu13/bin/nvcc"));
    for p in candidates.into_iter().filter(|p| p.is_file()) {
        match nvcc_release(&p) {
            Some(v) if v >= MIN_NVCC => return Some((p, v)),
            Some(v) => println!(
                "cargo:warning=skipping {} (CUDA {}.{} < {}.{})",
                p.display(),
                v.0,
                v.1,
                MIN_NVCC.0,
                MIN_NVCC.1
            ),
            None => {}
        }
    }
    None
}

/// `CUTLASS_DIR`, then `third_party/cutlass` (a checkout), then the provisioned PyPI headers.
fn find_cutlass(root: &Path, pypi: &Path) -> Option<(PathBuf, (u32, u32, u32))> {
    let check = |dir: &Path| -> Option<(u32, u32, u32)> {
        let v = parse_cutlass_version(&fs::read_to_string(dir.join("include/cutlass/version.h")).ok()?)?;
        if v < MIN_CUTLASS {
            println!("cargo:warning=skipping CUTLASS {}.{}.{} at {} (need >= 4.0)", v.0, v.1, v.2, dir.display());
            return None;
        }
        Some(v)
    };
    if let Some(dir) = env::var_os("CUTLASS_DIR").map(PathBuf::from) {
        return match check(&dir) {
            Some(v) => Some((dir, v)),
            None => fail(
                &format!("CUTLASS_DIR={} has no usable include/cutlass/version.h (CUTLASS >= 4.0)", dir.display()),
                "point CUTLASS_DIR at a CUTLASS 4.x source tree, or unset it to use the provisioned CUTLASS 4.2",
            ),
        };
    }
    [root.join("third_party/cutlass"), pypi.join("cutlass_library/source")]
        .into_iter()
        .find_map(|d| check(&d).map(|v| (d, v)))
}

/// The pinned CUDA toolkit and CUTLASS wheels, into `third_party/pypi`.
fn provision(pypi: &Path, need_nvcc: bool, need_cutlass: bool) {
    let missing = match (need_nvcc, need_cutlass) {
        (true, true) => "nvcc (CUDA >= 12.8) and CUTLASS (>= 4.0)",
        (true, false) => "nvcc (CUDA >= 12.8)",
        _ => "CUTLASS (>= 4.0)",
    };
    let hint = "either install them yourself and set NVCC (or CUDA_HOME) and CUTLASS_DIR, or let this build fetch them";
    pip_install(pypi, PYPI_PINS, missing, "~330 MB", hint);
}

/// libclang for bindgen (build/bindings.rs): `LIBCLANG_PATH` where set, else the pinned PyPI wheel's, provisioned
/// into `third_party/libclang` once. One pinned clang everywhere, so that every build generates the same types.
fn find_or_provision_libclang(root: &Path) {
    if env::var_os("LIBCLANG_PATH").is_some() {
        return;
    }
    let dir = root.join("third_party/libclang");
    let native = dir.join("clang/native");
    if !native.join("libclang.so").is_file() {
        let hint = "set LIBCLANG_PATH to the folder of a libclang (>= 9), or let this build fetch it";
        pip_install(&dir, &[LIBCLANG_PIN], "libclang (for bindgen)", "~65 MB", hint);
    }
    // Read by clang-sys when bindgen loads libclang, below; the build script has no other thread yet.
    env::set_var("LIBCLANG_PATH", &native);
}

/// `pip install --no-deps --target` of the pinned wheels into a temporary folder, then renamed into place, so that
/// an interrupted download never leaves a half toolkit behind.
fn pip_install(folder: &Path, pins: &[&str], missing: &str, size: &str, hint: &str) {
    let hint =
        format!("{hint}:\n  {} -m pip install --no-deps --target {} {}", python(), folder.display(), pins.join(" "));
    if env::var_os("MOE_GEMM_NO_PROVISION").is_some_and(|v| v != "0") {
        fail(&format!("{missing} not found and MOE_GEMM_NO_PROVISION is set"), &hint);
    }
    if folder.exists() {
        // A provisioned folder that lacks what we need is stale or broken: replace it.
        let _ = fs::remove_dir_all(folder);
    }
    let tmp = folder.with_file_name(format!(".pypi-tmp-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    println!("cargo:warning=moe-gemm: provisioning {missing} from PyPI into {} ({size}, once)", folder.display());
    let status = Command::new(python())
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--target"])
        .arg(&tmp)
        .args(pins)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => {
            let _ = fs::remove_dir_all(&tmp);
            fail(&format!("{missing} not found, and `pip install` of the pinned wheels failed ({s}); offline?"), &hint)
        }
        Err(e) => fail(&format!("{missing} not found, and `{} -m pip` could not run: {e}", python()), &hint),
    }
    if fs::rename(&tmp, folder).is_err() {
        // Another build provisioned it concurrently; keep theirs.
        let _ = fs::remove_dir_all(&tmp);
    }
}

fn python() -> String {
    env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

fn fail(what: &str, fix: &str) -> ! {
    if fix.is_empty() {
        panic!("\n\nmoe-gemm build: {what}\n\n");
    }
    panic!("\n\nmoe-gemm build: {what}\n  fix: {fix}\n\n");
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| fail(&format!("{what} could not start: {e}"), ""));
    if !out.status.success() {
        fail(
            &format!(
                "{what} failed ({})\ncommand: {cmd:?}\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            "",
        );
    }
}

/// The text of `src` and of every header of ours it includes, transitively (`#include "x"` found in `dir`), in
/// a fixed order: what the object cache hashes, so that a header edit recompiles only the units that use it. A
/// unit's declaration line is left out: it compiles to nothing (its targets are in the flags, which are hashed),
/// so that updating its `seconds=` recompiles nothing.
fn local_sources(src: &Path, dir: &Path) -> Vec<u8> {
    let mut seen: Vec<PathBuf> = Vec::new();
    let mut todo = vec![src.to_path_buf()];
    let mut text = Vec::new();
    while let Some(file) = todo.pop() {
        if seen.contains(&file) {
            continue;
        }
        let body = fs::read_to_string(&file).unwrap_or_else(|e| fail(&format!("{}: {e}", file.display()), ""));
        for line in body.lines() {
            let inc = line.trim_start().strip_prefix("#include \"").and_then(|r| r.split('"').next());
            if let Some(path) = inc.map(|i| dir.join(i)).filter(|p| p.is_file()) {
                todo.push(path);
            }
        }
        // The path relative to cpp/, so that checkouts at different places can share one object cache.
        let name = file.strip_prefix(dir).unwrap_or(&file);
        text.extend_from_slice(name.display().to_string().as_bytes());
        let declaration = body.lines().find(|l| l.starts_with(UNIT_DECLARATION)).map(|l| format!("{l}\n"));
        text.extend_from_slice(declaration.map_or(body.clone(), |d| body.replacen(&d, "", 1)).as_bytes());
        seen.push(file);
    }
    text
}

/// Compiles each kernel unit with its own nvcc process (no relocatable device code), several at a time. An
/// object is reused when the hash of its source, every header in cpp/ it includes, its flags (its targets among
/// them) and the toolchain is unchanged. Returns the objects in the order of `units`.
fn compile_cuda(root: &Path, out: &Path, tc: &Toolchain, units: &[KernelUnit]) -> Vec<PathBuf> {
    let base: Vec<String> = [
        "-std=c++17",
        "-O3",
        "-DNDEBUG",
        "--expt-relaxed-constexpr",
        "-Xcompiler=-fPIC",
        "-Xcudafe=--diag_suppress=esa_on_defaulted_function_ignored",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut tail: Vec<String> = Vec::new();
    if env::var_os("MOE_GEMM_LINEINFO").is_some_and(|v| v != "0") {
        tail.push("-lineinfo".into()); // never -G: it serialises wgmma and ran ptxas to 22 GB here
    }
    if let Ok(ccbin) = env::var("NVCC_CCBIN") {
        tail.push(format!("-ccbin={ccbin}"));
    }
    let includes = [root.join("cpp"), tc.cutlass.join("include"), tc.cutlass.join("tools/util/include")]
        .into_iter()
        .chain(tc.cuda_include.iter().cloned())
        .map(|p| format!("-I{}", p.display()));
    tail.extend(includes);

    // Versions, not paths: checkouts at different places (with their own provisioned copies of the same pinned
    // toolchain) can then share one object cache. The include flags are paths too and stay out of the hash.
    let toolchain_id = format!("nvcc {:?}|cutlass {:?}", tc.nvcc_release, tc.cutlass_version);

    // MOE_GEMM_CUDA_CACHE: a folder shared by several checkouts (objects are named by the hash of all their
    // inputs, so sharing is safe); stale objects are then left for the owner to clear.
    let shared_cache = env::var_os("MOE_GEMM_CUDA_CACHE").map(PathBuf::from);
    let obj_dir = shared_cache.clone().unwrap_or_else(|| out.join("cuda-objects"));
    fs::create_dir_all(&obj_dir).unwrap();
    let jobs: usize = env::var("NUM_JOBS").ok().and_then(|j| j.parse().ok()).unwrap_or(2).max(1);

    // (source, object, flags): the flags in the order the single-gencode build had them (base, gencode, tail), so
    // that a unit whose targets did not change keeps its hash and its cached object.
    let plants = planted_defines();
    let units: Vec<(PathBuf, PathBuf, Vec<String>)> = units
        .iter()
        .map(|u| {
            let src = root.join(&u.path);
            let mut flags = base.clone();
            flags.extend(gencodes(u.targets));
            flags.extend(tail.iter().cloned());
            flags.extend(plants.iter().filter(|(unit, _)| *unit == u.path).map(|(_, d)| d.to_string()));
            let text = local_sources(&src, &root.join("cpp"));
            let flag_id: Vec<&str> = flags.iter().filter(|f| !f.starts_with("-I")).map(String::as_str).collect();
            let flag_id = flag_id.join(" ");
            let hash = fnv1a(&[&text, flag_id.as_bytes(), toolchain_id.as_bytes()]);
            let stem = Path::new(&u.path).file_stem().unwrap().to_string_lossy().to_string();
            (src, obj_dir.join(format!("{stem}-{hash:016x}.o")), flags)
        })
        .collect();

    // A queue that `jobs` workers drain in table order (heaviest first): a small unit never waits for the other
    // half of a fixed pair to finish.
    let todo: Vec<&(PathBuf, PathBuf, Vec<String>)> = units.iter().filter(|(_, o, _)| !o.is_file()).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..jobs.min(todo.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some((src, obj, flags)) = todo.get(i) else { break };
                let tmp = obj.with_extension(format!("o.{}.tmp", std::process::id()));
                let t0 = std::time::Instant::now();
                run(
                    Command::new(&tc.nvcc).arg("-c").arg(src).arg("-o").arg(&tmp).args(flags),
                    &format!("nvcc {}", src.display()),
                );
                fs::rename(&tmp, obj).unwrap();
                eprintln!("moe-gemm: compiled {} in {:.0} s", src.display(), t0.elapsed().as_secs_f64());
            });
        }
    });
    // Objects of earlier inputs are dead weight in OUT_DIR: keep only the current ones.
    let keep: Vec<&PathBuf> = units.iter().map(|(_, o, _)| o).collect();
    let listing = shared_cache.is_none().then(|| fs::read_dir(&obj_dir).unwrap());
    for stale in listing.into_iter().flatten().filter_map(|e| e.ok().map(|e| e.path())) {
        if !keep.contains(&&stale) {
            let _ = fs::remove_file(stale);
        }
    }
    units.into_iter().map(|(_, o, _)| o).collect()
}

/// `MOE_GEMM_PLANT` (a comma-separated list, for `scripts/sanitize.py --planted` only): builds with known bugs
/// planted on purpose, so that each compute-sanitizer tool is shown to catch its kind. Each CUDA plant is a
/// define of the one unit it touches (the other units keep their cached objects); `uninit-status` is a Rust cfg.
fn planted_defines() -> Vec<(&'static str, &'static str)> {
    const CUDA: &[(&str, &str, &str)] = &[
        ("warp-race", "cpp/moe_ops/routing.cu", "-DMOE_GEMM_PLANT_WARP_RACE"),
        ("row-store", "cpp/moe_ops/routing.cu", "-DMOE_GEMM_PLANT_ROW_STORE"),
    ];
    println!("cargo:rustc-check-cfg=cfg(moe_gemm_plant_uninit_status)");
    let Ok(list) = env::var("MOE_GEMM_PLANT") else { return Vec::new() };
    let mut defines = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        println!("cargo:warning=MOE_GEMM_PLANT: this build carries the planted bug `{name}`; never use it");
        if name == "uninit-status" {
            println!("cargo:rustc-cfg=moe_gemm_plant_uninit_status");
        } else if let Some(&(_, unit, define)) = CUDA.iter().find(|(n, _, _)| *n == name) {
            defines.push((unit, define));
        } else {
            fail(&format!("MOE_GEMM_PLANT: unknown plant `{name}`"), "known: warp-race, row-store, uninit-status");
        }
    }
    defines
}
