//! What the build put into each kernel unit's object, read back with a pinned `cuobjdump`: every unit holds SASS
//! (and PTX) for exactly the targets of the gencode table (`build/toolchain.rs`), the SM90 GEMMs no sm_100 code,
//! the plain kernels sm_100 SASS, and the SM100 GEMM the tcgen05 MMA (`UTCHMMA`, FP8_NOTES' opcode table) where
//! the SM90 GEMMs have wgmma (`HGMMA`). The only evidence of the SM100 kernels this side of a Blackwell GPU.
//!
//! The disassembler comes from `MOE_GEMM_CUOBJDUMP` (a `cuobjdump` whose folder also holds `nvdisasm`), else
//! from the pinned PyPI wheels installed once into the target folder. Where neither is to be had (offline), the
//! tests print a `SKIP` line and pass; `MOE_GEMM_REQUIRE_SASS=1` turns that into a failure.

#[path = "../build/toolchain.rs"]
#[allow(dead_code)]
mod toolchain;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use toolchain::{kernel_units, KernelUnit, Target, SASS_TOOL_PINS};

/// Prints past the test harness's capture, so that a skip shows in a plain `cargo test`.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn cuobjdump_works(path: &Path) -> bool {
    Command::new(path).arg("--version").output().is_ok_and(|o| o.status.success())
}

/// `cuobjdump` and the folder holding `nvdisasm`, or why there is none.
fn find_tools() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("MOE_GEMM_CUOBJDUMP").map(PathBuf::from) {
        return if cuobjdump_works(&p) {
            Ok(p)
        } else {
            Err(format!("MOE_GEMM_CUOBJDUMP={} does not run", p.display()))
        };
    }
    let version = SASS_TOOL_PINS[0].split_once("==").unwrap().1;
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cuda-disassemblers-{version}"));
    let bin = dir.join("nvidia/cu13/bin/cuobjdump");
    if !cuobjdump_works(&bin) {
        let tmp = dir.with_extension(format!("tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let out = Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--target"])
            .arg(&tmp)
            .args(SASS_TOOL_PINS)
            .output()
            .map_err(|e| format!("`{python} -m pip` could not run: {e}"))?;
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&tmp);
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(format!(
                "`pip install {}` failed (offline?): {}",
                SASS_TOOL_PINS.join(" "),
                err.lines().last().unwrap_or("")
            ));
        }
        if std::fs::rename(&tmp, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&tmp); // another test process installed it first
        }
    }
    if cuobjdump_works(&bin) {
        Ok(bin)
    } else {
        Err(format!("{} does not run after installing {}", bin.display(), SASS_TOOL_PINS.join(" ")))
    }
}

/// The disassembler, once per test binary; `None` (after printing SKIP) where there is none.
fn tools(test: &str) -> Option<&'static Path> {
    static TOOLS: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match TOOLS.get_or_init(find_tools) {
        Ok(p) => Some(p.as_path()),
        Err(why) => {
            if std::env::var_os("MOE_GEMM_REQUIRE_SASS").is_some_and(|v| v != "0") {
                panic!("{test}: no cuobjdump and MOE_GEMM_REQUIRE_SASS is set: {why}");
            }
            say(&format!("SKIP {test}: cuobjdump unavailable, SASS not checked: {why}"));
            None
        }
    }
}

fn cuobjdump(tool: &Path, args: &[&str], object: &Path) -> String {
    let mut path = std::ffi::OsString::from(tool.parent().unwrap());
    if let Some(p) = std::env::var_os("PATH") {
        path.push(":");
        path.push(p);
    }
    let out = Command::new(tool).args(args).arg(object).env("PATH", path).output().unwrap();
    assert!(out.status.success(), "cuobjdump {args:?} {}: {}", object.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The object the build compiled for each unit (`MOE_GEMM_CUDA_OBJECTS`, from build.rs).
fn object(unit: &str) -> PathBuf {
    env!("MOE_GEMM_CUDA_OBJECTS")
        .split(';')
        .find_map(|e| e.split_once('=').filter(|(u, _)| *u == unit).map(|(_, o)| PathBuf::from(o)))
        .unwrap_or_else(|| panic!("{unit} is not in MOE_GEMM_CUDA_OBJECTS"))
}

/// (SASS arches, PTX arches) of an object, as cuobjdump names its embedded files: `x.1.sm_90a.cubin`,
/// `x.1.sm_90.ptx` (the PTX of `compute_90`).
fn embedded(tool: &Path, obj: &Path) -> (Vec<String>, Vec<String>) {
    let listing = cuobjdump(tool, &["-lelf", "-lptx"], obj);
    let arch = |line: &str, ext: &str| -> Option<String> {
        let name = line.rsplit(' ').next()?.strip_suffix(ext)?;
        Some(name.rsplit('.').next()?.to_string())
    };
    let mut sass: Vec<String> = listing.lines().filter_map(|l| arch(l, ".cubin")).collect();
    let mut ptx: Vec<String> = listing.lines().filter_map(|l| arch(l, ".ptx")).collect();
    sass.sort();
    ptx.sort();
    (sass, ptx)
}

fn expected(unit: &KernelUnit) -> (Vec<String>, Vec<String>) {
    let mut sass: Vec<String> = Vec::new();
    let mut ptx: Vec<String> = Vec::new();
    for t in unit.targets {
        match t {
            Target::Sass(n) => sass.push(n.to_string()),
            Target::Ptx(n) => ptx.push(n.replacen("compute_", "sm_", 1)),
        }
    }
    sass.sort();
    ptx.sort();
    (sass, ptx)
}

#[test]
fn every_unit_holds_exactly_its_targets() {
    let Some(tool) = tools("every_unit_holds_exactly_its_targets") else { return };
    let units = kernel_units(std::path::Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
    for unit in &units {
        let got = embedded(tool, &object(&unit.path));
        assert_eq!(got, expected(unit), "{}: (SASS, PTX) in the object vs the gencode table", unit.path);
    }
    // The three facts the gencode table is for, spelled out.
    for u in [
        "cpp/moe_ops/routing.cu",
        "cpp/moe_ops/layouts.cu",
        "cpp/moe_ops/activation.cu",
        "cpp/moe_ops/decode.cu",
        "cpp/moe_ops/quant.cu",
    ] {
        let (sass, ptx) = embedded(tool, &object(u));
        assert_eq!(sass, ["sm_100", "sm_90"], "{u}: plain SASS for both, lowered from the PTX");
        assert_eq!(ptx, ["sm_90"], "{u}");
    }
    for u in units.iter().filter(|u| u.path.contains("_sm90")) {
        let (sass, ptx) = embedded(tool, &object(&u.path));
        assert_eq!(sass, ["sm_90a"], "{}: no sm_100 code in the SM90 GEMMs", u.path);
        assert!(ptx.is_empty(), "{}: {ptx:?}", u.path);
    }
    for u in [SM100, SM100_FP8, SM100_MX] {
        let (sass, ptx) = embedded(tool, &object(u));
        assert_eq!(sass, ["sm_100a"], "{u}");
        assert!(ptx.is_empty(), "{u}: {ptx:?}");
    }
}

/// The units of the CUTLASS families (build/toolchain.rs: one unit per family, its dtypes and schedules in the unit
/// or in `.inl` parts). A part's kernels are told apart by their names: the MMA atom or mainloop CUTLASS instantiated.
const SM90: &str = "cpp/dense/grouped_gemm_sm90.cu";
const SM90_FP8: &str = "cpp/fp8_blockwise/grouped_gemm_sm90_fp8.cu";
const SM90_FP8_ROWWISE: &str = "cpp/fp8_rowwise/grouped_gemm_sm90_fp8_rowwise.cu";
const FUSED: &str = "cpp/fused/fused_moe_sm90.cu";
const SM100: &str = "cpp/dense/grouped_gemm_sm100.cu";
const SM100_FP8: &str = "cpp/fp8_blockwise/grouped_gemm_sm100_fp8.cu";
const SM100_MX: &str = "cpp/mx/grouped_gemm_sm100_mx.cu";

/// One kernel of an object: its `Function :` name and its instructions, each as its opcode with modifiers
/// (`UTCQMMA.2CTA`) and as the whole line.
struct Kernel {
    name: String,
    ops: Vec<String>,
    lines: Vec<String>,
}

impl Kernel {
    fn is_gemm(&self) -> bool {
        self.name.contains("device_kernel")
    }
}

/// The kernels of a unit's object, in cuobjdump's order (every target's).
fn kernels(tool: &Path, unit: &str) -> Vec<Kernel> {
    let sass = cuobjdump(tool, &["-sass"], &object(unit));
    let mut out: Vec<Kernel> = Vec::new();
    for line in sass.lines() {
        if let Some(f) = line.trim().strip_prefix("Function : ") {
            out.push(Kernel { name: f.to_string(), ops: Vec::new(), lines: Vec::new() });
            continue;
        }
        // "        /*0040*/                   UTCHMMA gdesc[UR4], gdesc[UR6], tmem[UR9], ... ;"
        let Some(rest) = line.trim().strip_prefix("/*").and_then(|r| r.split_once("*/")).map(|(_, r)| r.trim()) else {
            continue;
        };
        let rest = rest.strip_prefix('@').map_or(rest, |r| r.split_once(' ').map_or("", |(_, x)| x.trim()));
        let op = rest.split(|c: char| c.is_whitespace() || c == ';').next().unwrap_or("");
        if let (false, Some(k)) = (op.is_empty(), out.last_mut()) {
            k.ops.push(op.to_string());
            k.lines.push(line.trim().to_string());
        }
    }
    out
}

/// The kernels whose name contains `key`.
fn named<'a>(ks: &'a [Kernel], key: &str) -> Vec<&'a Kernel> {
    ks.iter().filter(|k| k.name.contains(key)).collect()
}

/// The distinct opcodes (without modifiers: `UTCQMMA`) of some kernels.
fn base_ops<'a>(ks: impl IntoIterator<Item = &'a Kernel>) -> Vec<String> {
    let mut ops: Vec<String> = Vec::new();
    for k in ks {
        for op in &k.ops {
            let op = op.split('.').next().unwrap_or("");
            if !ops.iter().any(|o| o == op) {
                ops.push(op.to_string());
            }
        }
    }
    ops
}

/// The lines of some kernels holding `op` (as an opcode, modifiers allowed).
fn lines_of<'a>(ks: &[&'a Kernel], op: &str) -> Vec<&'a str> {
    ks.iter()
        .flat_map(|k| k.ops.iter().zip(&k.lines))
        .filter(|(o, _)| o.split('.').next() == Some(op))
        .map(|(_, l)| l.as_str())
        .collect()
}

#[test]
fn the_sm100_gemm_runs_on_tcgen05_and_the_sm90_gemms_on_wgmma() {
    let Some(tool) = tools("the_sm100_gemm_runs_on_tcgen05_and_the_sm90_gemms_on_wgmma") else { return };
    let all = kernels(tool, SM100);
    assert!(!base_ops(&all).iter().any(|o| o.ends_with("GMMA")), "SM100 GEMM with wgmma: {:?}", base_ops(&all));
    // The bf16 part: CUTLASS's F16BF16 tcgen05 atom. Two configurations (CUTLASS's device_kernel each) and one
    // prepare kernel per configuration.
    let bf16: Vec<&Kernel> = named(&all, "SM100_MMA_F16BF16").into_iter().filter(|k| k.is_gemm()).collect();
    let ops = base_ops(bf16.iter().copied());
    say(&format!("grouped_gemm_sm100 bf16: {} kernels; tcgen05/TMA opcodes: {}", bf16.len(), {
        let mut v: Vec<&str> = ops
            .iter()
            .map(String::as_str)
            .filter(|o| o.starts_with("UTC") || o.starts_with("UTMA") || o.starts_with("LDTM"))
            .collect();
        v.sort();
        v.join(" ")
    }));
    for op in ["UTCHMMA", "UTMALDG", "UTMASTG", "LDTM"] {
        assert!(ops.iter().any(|o| o == op), "SM100 bf16 GEMM: no {op} in its SASS: {ops:?}");
    }
    assert_eq!(bf16.len(), 2, "{:?}", all.iter().map(|k| &k.name).collect::<Vec<_>>());
    let prep = named(&all, "prepare_groups");
    assert_eq!(prep.len(), 2, "{:?}", prep.iter().map(|k| &k.name).collect::<Vec<_>>());
    assert!(prep.iter().all(|k| k.name.contains("GroupedGemmSm100")));

    let sm90 = kernels(tool, SM90);
    let ops = base_ops(&sm90);
    assert!(ops.iter().any(|o| o == "HGMMA"), "{SM90}: no HGMMA: {ops:?}");
    assert!(!ops.iter().any(|o| o.starts_with("UTC")), "{SM90}: tcgen05 in an SM90 unit: {ops:?}");
    // Both dtypes, the five tiles each, on wgmma.
    // (f16's names hold `half_t`; so do bf16's, which also hold `bfloat16_t`.)
    let bf16 = |k: &&Kernel| k.name.contains("10bfloat16_t");
    assert_eq!(sm90.iter().filter(|k| k.is_gemm()).count(), 10, "{SM90}: two dtypes of five tiles");
    for dtype in ["bf16", "f16"] {
        let gemms: Vec<&Kernel> = sm90.iter().filter(|k| k.is_gemm() && bf16(k) == (dtype == "bf16")).collect();
        assert_eq!(gemms.len(), 5, "{SM90}: {dtype} GEMMs");
        assert!(gemms.iter().all(|k| k.ops.iter().any(|o| o.starts_with("HGMMA"))), "{SM90}: {dtype}");
    }
    let fp8 = kernels(tool, SM90_FP8);
    let blockwise: Vec<&Kernel> = named(&fp8, "WarpSpecializedBlockwise").into_iter().filter(|k| k.is_gemm()).collect();
    assert_eq!(blockwise.len(), 2, "{SM90_FP8}: the blockwise configurations");
    assert!(blockwise.iter().all(|k| k.ops.iter().any(|o| o.starts_with("QGMMA"))), "FP8 blockwise: no QGMMA");
}

/// The FP8 decode kernels multiply on the tensor cores: their e4m3 `mma.sync` is lowered (sm_90 and sm_100 alike) to f16
/// conversions (`F2FP`) and `HMMA` (what README says); no wgmma, no tcgen05.
#[test]
fn the_fp8_decode_kernels_multiply_on_the_tensor_cores() {
    let Some(tool) = tools("the_fp8_decode_kernels_multiply_on_the_tensor_cores") else { return };
    let ks = kernels(tool, "cpp/moe_ops/decode_fp8.cu");
    let ops = base_ops(&ks);
    say(&format!("decode_fp8: {} kernels (both targets); MMA opcodes: {}", ks.len(), {
        let mut v: Vec<&str> = ops.iter().map(String::as_str).filter(|o| o.contains("MMA") || *o == "F2FP").collect();
        v.sort();
        v.join(" ")
    }));
    assert!(ops.iter().any(|o| o == "HMMA") && ops.iter().any(|o| o == "F2FP"), "decode_fp8: {ops:?}");
    assert!(!ops.iter().any(|o| o.ends_with("GMMA") || o.starts_with("UTC")), "decode_fp8: {ops:?}");
    // expand, and reduce in its 512- and 1024-thread forms, each over block and per-channel scales, for sm_90 and
    // sm_100; the per-tensor amax reduction.
    assert_eq!(named(&ks, "expand_kernel").len(), 4);
    assert_eq!(named(&ks, "reduce_kernel").len(), 8);
    assert_eq!(named(&ks, "x_amax_kernel").len(), 2);
}

/// The portable block-scaled grouped GEMM (`cpp/mx/grouped_mx_portable.cu`) multiplies its dequantised bf16 tiles on
/// the tensor cores with `mma.sync` (`HMMA`, sm_90 and sm_100 alike), no wgmma, no tcgen05: one kernel per format
/// pair per target.
#[test]
fn the_portable_mx_gemm_multiplies_on_the_tensor_cores() {
    let Some(tool) = tools("the_portable_mx_gemm_multiplies_on_the_tensor_cores") else { return };
    let unit = "cpp/mx/grouped_mx_portable.cu";
    let ks = kernels(tool, unit);
    let ops = base_ops(&ks);
    assert!(ops.iter().any(|o| o == "HMMA"), "{unit}: no HMMA: {ops:?}");
    assert!(!ops.iter().any(|o| o.ends_with("GMMA") || o.starts_with("UTC")), "{unit}: {ops:?}");
    assert_eq!(named(&ks, "grouped_mx_kernel").len(), 8);
}

/// Every `mma` line of `ks` carries the block scale in tensor memory after the instruction descriptor
/// (`..., idesc[..], tmem[..]`: FP8_NOTES' form; a per-tensor MMA ends at idesc) when `scaled`, and none does
/// otherwise; there is at least one.
fn assert_scale_operand(ks: &[&Kernel], mma: &str, scaled: bool, what: &str) {
    let mmas = lines_of(ks, mma);
    assert!(!mmas.is_empty(), "{what}: no {mma}");
    for l in &mmas {
        let after = l.split("idesc[").nth(1).unwrap_or_else(|| panic!("{what}: {mma} without idesc: {l}"));
        assert_eq!(after.contains("tmem["), scaled, "{what}: scale operand (block-scaled: {scaled}) in {l}");
    }
}

/// The SM100 MX grouped GEMMs with MXFP8 activations (MXFP8 and MXFP4 weights: `grouped_gemm_sm100_mxfp8.inl`)
/// multiply block-scaled: every `UTCQMMA` carries the scale operand in tensor memory, `UTCCP` copies the scales
/// into tensor memory, TMA loads every operand; and the FP8 rowwise and fused FP8 GEMMs hold wgmma e4m3
/// (`QGMMA`) and no tcgen05.
#[test]
fn the_mxfp8_gemm_multiplies_block_scaled_on_tcgen05() {
    let Some(tool) = tools("the_mxfp8_gemm_multiplies_block_scaled_on_tcgen05") else { return };
    let all = kernels(tool, SM100_MX);
    assert!(!base_ops(&all).iter().any(|o| o.ends_with("GMMA") || o == "UTCHMMA"), "{SM100_MX}");
    // All run a kind::mxf8f6f4 MMA atom (1-SM `SM100_MMA_MXF8F6F4_SS`, 2-SM `..._2x1SM_SS`).
    let gemms: Vec<&Kernel> = named(&all, "SM100_MMA_MXF8F6F4").into_iter().filter(|k| k.is_gemm()).collect();
    let ops = base_ops(gemms.iter().copied());
    for op in ["UTCQMMA", "UTCCP", "UTMALDG", "UTMASTG"] {
        assert!(ops.iter().any(|o| o == op), "MXF8F6F4 GEMMs: no {op}: {ops:?}");
    }
    assert!(!ops.iter().any(|o| o == "UTCOMMA"), "a 4-bit x 4-bit MMA in an MXF8F6F4 GEMM: {ops:?}");
    assert_scale_operand(&gemms, "UTCQMMA", true, "MXF8F6F4 GEMMs");
    say(&format!(
        "{SM100_MX}: {} MXF8F6F4 GEMMs, {} block-scaled UTCQMMA",
        gemms.len(),
        lines_of(&gemms, "UTCQMMA").len()
    ));
    // Three configurations (1-SM MXFP8 and MXFP4 weights, 2-SM MXFP8), a prepare kernel and CUTLASS's kernel each.
    assert_eq!(gemms.len(), 3);
    let prep: Vec<&Kernel> =
        named(&all, "prepare_mx_groups").into_iter().filter(|k| k.name.contains("Mxf8f6f4Sm100")).collect();
    assert_eq!(prep.len(), 3, "the MXF8F6F4 prepare kernels");
    assert_eq!(gemms.iter().filter(|k| k.name.contains("SM100_MMA_MXF8F6F4_SS")).count(), 2);
    assert_eq!(gemms.iter().filter(|k| k.name.contains("SM100_MMA_MXF8F6F4_2x1SM_SS")).count(), 1);
    // The element types live in the runtime instruction descriptor, not the opcode: the kernels' types say which
    // is which. One takes e2m1 weights, and that one is 1-SM.
    let e2m1: Vec<_> = gemms.iter().filter(|k| k.name.contains("float_e2m1_t")).collect();
    assert!(e2m1.len() == 1 && !e2m1[0].name.contains("2x1SM"), "one MXFP4-weight kernel, 1-SM");
    let fp8 = kernels(tool, SM90_FP8_ROWWISE);
    let rowwise: Vec<&Kernel> = fp8.iter().filter(|k| k.is_gemm() && !k.name.contains("Blockwise")).collect();
    assert_eq!(rowwise.len(), 3, "{SM90_FP8_ROWWISE}: the rowwise configurations");
    let fused = kernels(tool, FUSED);
    let fused_fp8 = named(&fused, "fused_moe_fp8_kernel");
    assert_eq!(fused_fp8.len(), 4, "{FUSED}: the FP8 tiles, each over block and per-channel scales");
    for (what, ks) in [("FP8 rowwise", rowwise), ("fused FP8", fused_fp8)] {
        let ops = base_ops(ks.iter().copied());
        assert!(ops.iter().any(|o| o == "QGMMA"), "{what}: no QGMMA: {ops:?}");
        assert!(!ops.iter().any(|o| o.starts_with("UTC")), "{what}: tcgen05 in an SM90 GEMM: {ops:?}");
    }
}

/// The 4-bit x 4-bit SM100 grouped GEMMs (`cpp/mx/grouped_gemm_sm100_fp4.inl`) multiply block-scaled under
/// `kind::mxf4` / `kind::mxf4nvf4`: `UTCOMMA` (FP8_NOTES' opcode table: the 4-bit block-scaled MMA; no `UTCQMMA`,
/// which is the 8-bit one) with the scale operand in tensor memory after the instruction descriptor, `UTCCP`
/// copying scales there, TMA loads and stores. The two kernels are told apart by their types: MXFP4 runs
/// CUTLASS's `SM100_MMA_MXF4_SS` atom with 32-element UE8M0 blocks (`UTCOMMA`, no `.4X`), NVFP4 the same atom
/// with 16-element UE4M3 blocks, whose MMAs are all `UTCOMMA.4X` (four scales per 64 of K).
#[test]
fn the_fp4_gemms_multiply_block_scaled_on_tcgen05() {
    let Some(tool) = tools("the_fp4_gemms_multiply_block_scaled_on_tcgen05") else { return };
    let all = kernels(tool, SM100_MX);
    let gemms: Vec<&Kernel> = named(&all, "SM100_MMA_MXF4").into_iter().filter(|k| k.is_gemm()).collect();
    let ops = base_ops(gemms.iter().copied());
    for op in ["UTCOMMA", "UTCCP", "UTMALDG", "UTMASTG"] {
        assert!(ops.iter().any(|o| o == op), "4-bit GEMMs: no {op}: {ops:?}");
    }
    assert!(!ops.iter().any(|o| o.ends_with("GMMA") || o == "UTCHMMA" || o == "UTCQMMA"), "4-bit GEMMs: {ops:?}");
    for k in &gemms {
        assert_scale_operand(&[k], "UTCOMMA", true, &k.name);
    }
    let prep: Vec<&Kernel> = named(&all, "prepare_mx_groups")
        .into_iter()
        .filter(|k| k.name.contains("Mxf4Sm100") || k.name.contains("Nvf4Sm100"))
        .collect();
    assert_eq!(prep.len(), 2, "the 4-bit prepare kernels");
    assert_eq!(gemms.len(), 2, "1-SM MXFP4 and NVFP4 (their 2-SM kernels were taken out)");
    // Both run CUTLASS's SM100_MMA_MXF4_SS atom; no 2-SM atom is left.
    assert!(gemms.iter().all(|k| k.name.contains("float_e2m1_t")));
    for (atom, n) in [("SM100_MMA_MXF4_SS", 2), ("SM100_MMA_MXF4_2x1SM_SS", 0)] {
        assert_eq!(gemms.iter().filter(|k| k.name.contains(atom)).count(), n, "{atom}");
    }
    let nv: Vec<&Kernel> = gemms.iter().copied().filter(|k| k.name.contains("float_ue4m3_t")).collect();
    let mx: Vec<&Kernel> = gemms
        .iter()
        .copied()
        .filter(|k| k.name.contains("float_ue8m0_t") && !k.name.contains("float_ue4m3_t"))
        .collect();
    assert_eq!((nv.len(), mx.len()), (1, 1), "one NVFP4 (UE4M3) and one MXFP4 (UE8M0) kernel");
    let (nv_mmas, mx_mmas) = (lines_of(&nv, "UTCOMMA"), lines_of(&mx, "UTCOMMA"));
    assert!(!nv_mmas.is_empty() && !mx_mmas.is_empty(), "a kernel without MMAs");
    assert!(nv_mmas.iter().all(|l| l.contains(".4X")), "NVFP4: {nv_mmas:?}");
    assert!(mx_mmas.iter().all(|l| !l.contains(".4X")), "MXFP4: {mx_mmas:?}");
    say(&format!(
        "{SM100_MX}: {} 4-bit GEMMs; {} NVFP4 UTCOMMA.4X, {} MXFP4 UTCOMMA",
        gemms.len(),
        nv_mmas.len(),
        mx_mmas.len()
    ));
}

/// The SM100 FP8 blockwise grouped GEMM (`cpp/fp8_blockwise/grouped_gemm_sm100_fp8.cu`, FP8_NOTES' opcode table):
/// the FP8 tcgen05 MMA (`UTCQMMA`) in its per-tensor form, ending at the instruction descriptor (no scale operand
/// in tensor memory, so no `UTCCP`: the f32 scales are applied outside the tensor cores); the f32 promotion of
/// each 128-wide K block as `FFMA` in CUTLASS's kernel; the K-major scales loaded with cp.async (`LDGSTS`), the
/// operands with TMA; one prepare kernel (ours, shared with SM90) per GEMM.
#[test]
fn the_sm100_fp8_blockwise_gemm_multiplies_on_tcgen05_and_promotes_with_ffma() {
    let Some(tool) = tools("the_sm100_fp8_blockwise_gemm_multiplies_on_tcgen05_and_promotes_with_ffma") else {
        return;
    };
    let all = kernels(tool, SM100_FP8);
    let gemms: Vec<&Kernel> = named(&all, "MainloopSm100ArrayTmaUmmaWarpSpecializedBlockwiseScaling")
        .into_iter()
        .filter(|k| k.is_gemm())
        .collect();
    assert_eq!(gemms.len(), 2, "two configurations (1-SM, 2-SM)");
    let ops = base_ops(gemms.iter().copied());
    for op in ["UTCQMMA", "FFMA", "LDGSTS", "UTMALDG", "UTMASTG"] {
        assert!(ops.iter().any(|o| o == op), "FP8 blockwise: no {op}: {ops:?}");
    }
    assert!(!ops.iter().any(|o| o == "UTCCP"), "UTCCP (scales in tensor memory) in the f32-scale kernel");
    assert!(!ops.iter().any(|o| o.ends_with("GMMA") || o == "UTCHMMA" || o == "UTCOMMA"), "{ops:?}");
    assert_eq!(named(&all, "prepare_fp8_groups").len(), 2);
    for (atom, n) in [("SM100_MMA_F8F6F4_SS", 1), ("SM100_MMA_F8F6F4_2x1SM_SS", 1), ("MXF8F6F4", 0)] {
        assert_eq!(gemms.iter().filter(|k| k.name.contains(atom)).count(), n, "{atom}: not block-scaled");
    }
    for k in &gemms {
        assert_scale_operand(&[k], "UTCQMMA", false, "FP8 blockwise");
        let ffma = k.ops.iter().filter(|o| o.split('.').next() == Some("FFMA")).count();
        assert!(ffma > 0, "no FFMA in a GEMM: the f32 promotion is missing");
        say(&format!("{SM100_FP8}: FP8 blockwise GEMM, {} UTCQMMA, {ffma} FFMA", lines_of(&[k], "UTCQMMA").len()));
    }
}

/// The 2-SM schedules (`KernelPtrArrayTmaWarpSpecialized2SmMxf8f6f4Sm100`, `...Blockwise2SmSm100`) beside their
/// 1-SM twins (the FP4 part's were taken out for nvcc time, and must stay out): each 2-SM GEMM is
/// CUTLASS's kernel over the `2x1SM` MMA atom, its prepare kernel is named by the 2-SM schedule, and its machine
/// code is the pair form of tcgen05 as cuobjdump prints it: every MMA `UTCQMMA.2CTA` / `UTCOMMA.2CTA[.4X]`, the
/// scale copies into tensor memory `UTCCP.T.S.2CTA.4` (block-scaled only), the commits `UTCBAR.2CTA.MULTICAST`
/// (both SMs' barriers), TMA loads `UTMALDG.*.2CTA` (each SM its half of the tile) and the tensor-memory
/// allocation `UTCATOMSWS.2CTA...`. No 1-SM GEMM (nor the bf16 and 4-bit ones) holds any `.2CTA` instruction.
#[test]
fn the_sm100_units_hold_their_2sm_kernels_in_the_pair_form_of_tcgen05() {
    let Some(tool) = tools("the_sm100_units_hold_their_2sm_kernels_in_the_pair_form_of_tcgen05") else { return };
    let (dense, fp8, mx) = (kernels(tool, SM100), kernels(tool, SM100_FP8), kernels(tool, SM100_MX));
    // (what, its GEMMs, their MMA, the 2-SM schedules, block-scaled)
    // Both are 8-bit MMAs (`UTCQMMA`); (what, its GEMMs, its 2-SM schedule, block-scaled).
    let mma = "UTCQMMA";
    let mxf8 = named(&mx, "SM100_MMA_MXF8F6F4");
    let blockwise = named(&fp8, "MainloopSm100ArrayTmaUmmaWarpSpecializedBlockwiseScaling");
    let families = [
        ("MXF8F6F4", mxf8, "KernelPtrArrayTmaWarpSpecialized2SmMxf8f6f4Sm100", true),
        ("FP8 blockwise", blockwise, "KernelPtrArrayTmaWarpSpecializedBlockwise2SmSm100", false),
    ];
    for (what, gemms, schedule, block_scaled) in families {
        let gemms: Vec<&Kernel> = gemms.into_iter().filter(|k| k.is_gemm()).collect();
        let (pair, single): (Vec<&Kernel>, Vec<&Kernel>) = gemms.into_iter().partition(|k| k.name.contains("2x1SM"));
        assert_eq!(pair.len(), 1, "{what}: one 2-SM GEMM");
        assert!(!single.is_empty(), "{what}: the 1-SM twins");
        let prep = fp8.iter().chain(&mx).filter(|k| k.name.contains("prepare_") && k.name.contains(schedule)).count();
        assert_eq!(prep, 1, "{what}: the prepare kernel of {schedule}");
        for k in &pair {
            let ops = &k.ops;
            let has = |op: &str| ops.iter().any(|o| o == op || o.starts_with(&format!("{op}.")));
            let mmas: Vec<&String> = ops.iter().filter(|o| o.split('.').next() == Some(mma)).collect();
            assert!(!mmas.is_empty(), "{what}: no {mma} in a 2-SM GEMM");
            assert!(mmas.iter().all(|o| o.starts_with(&format!("{mma}.2CTA"))), "{what}: a 1-SM MMA: {mmas:?}");
            assert!(has("UTCBAR.2CTA"), "{what}: no UTCBAR.2CTA in a 2-SM GEMM: {ops:?}");
            assert!(ops.iter().any(|o| o.starts_with("UTMALDG") && o.ends_with(".2CTA")), "{what}: {ops:?}");
            assert!(ops.iter().any(|o| o.starts_with("UTCATOMSWS.2CTA")), "{what}: {ops:?}");
            if block_scaled {
                let cps: Vec<&String> = ops.iter().filter(|o| o.starts_with("UTCCP")).collect();
                assert!(!cps.is_empty() && cps.iter().all(|o| o.contains(".2CTA")), "{what}: {cps:?}");
            } else {
                assert!(!has("UTCCP"), "{what}: UTCCP in the f32-scale kernel");
            }
            let mut forms: Vec<&str> = ops.iter().map(String::as_str).filter(|o| o.contains(".2CTA")).collect();
            forms.sort();
            forms.dedup();
            say(&format!("{what}: 2-SM GEMM, {} {mma}.2CTA; pair forms {}", mmas.len(), forms.join(" ")));
        }
        for k in &single {
            assert!(!k.ops.iter().any(|o| o.contains(".2CTA")), "{what}: a 2-SM instruction in a 1-SM GEMM {}", k.name);
        }
    }
    for (what, key, ks) in [("bf16", "SM100_MMA_F16BF16", &dense), ("4-bit", "SM100_MMA_MXF4", &mx)] {
        let ks = named(ks, key);
        assert!(!ks.is_empty(), "{what}: no GEMM");
        assert!(ks.iter().all(|k| !k.ops.iter().any(|o| o.contains(".2CTA"))), "{what} is 1-SM only");
    }
}
