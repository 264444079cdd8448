//! What the build put into each kernel unit's object, read back with a pinned `cuobjdump`: every unit holds SASS
//! (and PTX) for exactly the targets of the gencode table (`build/toolchain.rs`), the SM90 GEMMs no sm_100 code,
//! the plain kernels sm_100a SASS, and the SM100 GEMM the tcgen05 MMA (`UTCHMMA`, FP8_NOTES' opcode table) where
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

use toolchain::{KernelUnit, Target, KERNEL_UNITS, SASS_TOOL_PINS};

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
    for unit in KERNEL_UNITS {
        let got = embedded(tool, &object(unit.path));
        assert_eq!(got, expected(unit), "{}: (SASS, PTX) in the object vs the gencode table", unit.path);
    }
    // The three facts the gencode table is for, spelled out.
    for u in ["cpp/routing.cu", "cpp/layouts.cu", "cpp/activation.cu", "cpp/decode.cu", "cpp/quant.cu"] {
        let (sass, ptx) = embedded(tool, &object(u));
        assert!(sass.contains(&"sm_100a".into()) && sass.contains(&"sm_90a".into()), "{u}: {sass:?}");
        assert_eq!(ptx, ["sm_90"], "{u}");
    }
    for u in KERNEL_UNITS.iter().filter(|u| u.path.contains("_sm90")) {
        let (sass, ptx) = embedded(tool, &object(u.path));
        assert_eq!(sass, ["sm_90a"], "{}: no sm_100 code in the SM90 GEMMs", u.path);
        assert!(ptx.is_empty(), "{}: {ptx:?}", u.path);
    }
    for u in [
        "cpp/grouped_gemm_sm100_bf16.cu",
        "cpp/grouped_gemm_sm100_mxfp8.cu",
        "cpp/grouped_gemm_sm100_fp4.cu",
        "cpp/grouped_gemm_sm100_fp8_blockwise.cu",
    ] {
        let (sass, ptx) = embedded(tool, &object(u));
        assert_eq!(sass, ["sm_100a"], "{u}");
        assert!(ptx.is_empty(), "{u}: {ptx:?}");
    }
}

/// The distinct opcodes (first word of each instruction, e.g. `UTCHMMA`) in an object's SASS, and its kernel
/// names.
fn opcodes(tool: &Path, unit: &str) -> (Vec<String>, Vec<String>) {
    let sass = cuobjdump(tool, &["-sass"], &object(unit));
    let mut ops: Vec<String> = Vec::new();
    let mut kernels: Vec<String> = Vec::new();
    for line in sass.lines() {
        if let Some(f) = line.trim().strip_prefix("Function : ") {
            kernels.push(f.to_string());
        }
        // "        /*0040*/                   UTCHMMA gdesc[UR4], gdesc[UR6], tmem[UR9], ... ;"
        let Some(rest) = line.trim().strip_prefix("/*").and_then(|r| r.split_once("*/")).map(|(_, r)| r.trim()) else {
            continue;
        };
        let rest = rest.strip_prefix('@').map_or(rest, |r| r.split_once(' ').map_or("", |(_, x)| x.trim()));
        let op = rest.split(|c: char| c.is_whitespace() || c == ';').next().unwrap_or("");
        let op = op.split('.').next().unwrap_or("");
        if !op.is_empty() && !ops.iter().any(|o| o == op) {
            ops.push(op.to_string());
        }
    }
    (ops, kernels)
}

#[test]
fn the_sm100_gemm_runs_on_tcgen05_and_the_sm90_gemms_on_wgmma() {
    let Some(tool) = tools("the_sm100_gemm_runs_on_tcgen05_and_the_sm90_gemms_on_wgmma") else { return };
    let (ops, kernels) = opcodes(tool, "cpp/grouped_gemm_sm100_bf16.cu");
    say(&format!("grouped_gemm_sm100_bf16: {} kernels; tcgen05/TMA opcodes: {}", kernels.len(), {
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
    assert!(!ops.iter().any(|o| o.ends_with("GMMA")), "SM100 GEMM with wgmma: {ops:?}");
    // Two configurations (CUTLASS's device_kernel each) and one prepare kernel per configuration.
    assert_eq!(kernels.iter().filter(|k| k.contains("device_kernel")).count(), 2, "{kernels:?}");
    assert_eq!(kernels.iter().filter(|k| k.contains("prepare_groups")).count(), 2, "{kernels:?}");

    for unit in ["cpp/grouped_gemm_sm90_bf16.cu", "cpp/grouped_gemm_sm90_f16.cu"] {
        let (ops, _) = opcodes(tool, unit);
        assert!(ops.iter().any(|o| o == "HGMMA"), "{unit}: no HGMMA: {ops:?}");
        assert!(!ops.iter().any(|o| o.starts_with("UTC")), "{unit}: tcgen05 in an SM90 unit: {ops:?}");
    }
    let (ops, _) = opcodes(tool, "cpp/grouped_gemm_sm90_fp8_blockwise.cu");
    assert!(ops.iter().any(|o| o == "QGMMA"), "FP8 blockwise: no QGMMA: {ops:?}");
}

/// The FP8 decode kernels multiply on the tensor cores: their e4m3 `mma.sync` is lowered (sm_90a and sm_100a alike) to f16
/// conversions (`F2FP`) and `HMMA` (what README and benches/results/NOTES.md say); no wgmma, no tcgen05.
#[test]
fn the_fp8_decode_kernels_multiply_on_the_tensor_cores() {
    let Some(tool) = tools("the_fp8_decode_kernels_multiply_on_the_tensor_cores") else { return };
    let (ops, kernels) = opcodes(tool, "cpp/decode_fp8.cu");
    say(&format!("decode_fp8: {} kernels (both targets); MMA opcodes: {}", kernels.len(), {
        let mut v: Vec<&str> = ops.iter().map(String::as_str).filter(|o| o.contains("MMA") || *o == "F2FP").collect();
        v.sort();
        v.join(" ")
    }));
    assert!(ops.iter().any(|o| o == "HMMA") && ops.iter().any(|o| o == "F2FP"), "decode_fp8: {ops:?}");
    assert!(!ops.iter().any(|o| o.ends_with("GMMA") || o.starts_with("UTC")), "decode_fp8: {ops:?}");
    // expand, and reduce in its 512- and 1024-thread forms, for sm_90a and sm_100a.
    assert_eq!(kernels.iter().filter(|k| k.contains("expand_kernel")).count(), 2, "{kernels:?}");
    assert_eq!(kernels.iter().filter(|k| k.contains("reduce_kernel")).count(), 4, "{kernels:?}");
}

/// The portable block-scaled grouped GEMM (`cpp/grouped_mx_portable.cu`) multiplies its dequantised bf16 tiles on
/// the tensor cores with `mma.sync` (`HMMA`, sm_90a and sm_100a alike), no wgmma, no tcgen05: one kernel per format
/// pair per target.
#[test]
fn the_portable_mx_gemm_multiplies_on_the_tensor_cores() {
    let Some(tool) = tools("the_portable_mx_gemm_multiplies_on_the_tensor_cores") else { return };
    let unit = "cpp/grouped_mx_portable.cu";
    let (ops, kernels) = opcodes(tool, unit);
    assert!(ops.iter().any(|o| o == "HMMA"), "{unit}: no HMMA: {ops:?}");
    assert!(!ops.iter().any(|o| o.ends_with("GMMA") || o.starts_with("UTC")), "{unit}: {ops:?}");
    assert_eq!(kernels.iter().filter(|k| k.contains("grouped_mx_kernel")).count(), 8, "{kernels:?}");
}

/// The SM100 MX grouped GEMMs (MXFP8 and MXFP4 weights) multiply block-scaled: every `UTCQMMA` carries the scale operand in tensor memory
/// after the instruction descriptor (`..., idesc[..], tmem[..]`: FP8_NOTES' MXFP8 form; a per-tensor FP8 MMA ends
/// at idesc), `UTCCP` copies the scales into tensor memory, TMA loads every operand; and the FP8 rowwise and
/// fused FP8 units hold wgmma e4m3 (`QGMMA`) and no tcgen05.
#[test]
fn the_mxfp8_gemm_multiplies_block_scaled_on_tcgen05() {
    let Some(tool) = tools("the_mxfp8_gemm_multiplies_block_scaled_on_tcgen05") else { return };
    let unit = "cpp/grouped_gemm_sm100_mxfp8.cu";
    let (ops, kernels) = opcodes(tool, unit);
    for op in ["UTCQMMA", "UTCCP", "UTMALDG", "UTMASTG"] {
        assert!(ops.iter().any(|o| o == op), "{unit}: no {op}: {ops:?}");
    }
    assert!(!ops.iter().any(|o| o.ends_with("GMMA") || o == "UTCHMMA"), "{unit}: {ops:?}");
    let sass = cuobjdump(tool, &["-sass"], &object(unit));
    let mmas: Vec<&str> = sass.lines().filter(|l| l.contains("UTCQMMA")).collect();
    assert!(!mmas.is_empty());
    for l in &mmas {
        let after = l.split("idesc[").nth(1).unwrap_or_else(|| panic!("{unit}: UTCQMMA without idesc: {l}"));
        assert!(after.contains("tmem["), "{unit}: a UTCQMMA without its scale operand: {l}");
    }
    say(&format!("{unit}: {} kernels, {} block-scaled UTCQMMA", kernels.len(), mmas.len()));
    // Three configurations (1-SM MXFP8 and MXFP4 weights, 2-SM MXFP8), a prepare kernel and CUTLASS's kernel each.
    assert_eq!(kernels.iter().filter(|k| k.contains("prepare_mx_groups")).count(), 3, "{kernels:?}");
    let gemms: Vec<&String> = kernels.iter().filter(|k| k.contains("device_kernel")).collect();
    assert_eq!(gemms.len(), 3, "{kernels:?}");
    // The element types live in the runtime instruction descriptor, not the opcode: the kernels' types say which
    // is which. All run a kind::mxf8f6f4 MMA atom (1-SM `SM100_MMA_MXF8F6F4_SS`, 2-SM `..._2x1SM_SS`); one takes
    // e2m1 weights, and that one is 1-SM.
    assert_eq!(gemms.iter().filter(|k| k.contains("SM100_MMA_MXF8F6F4_SS")).count(), 2, "{gemms:?}");
    assert_eq!(gemms.iter().filter(|k| k.contains("SM100_MMA_MXF8F6F4_2x1SM_SS")).count(), 1, "{gemms:?}");
    let e2m1: Vec<_> = gemms.iter().filter(|k| k.contains("float_e2m1_t")).collect();
    assert!(e2m1.len() == 1 && !e2m1[0].contains("2x1SM"), "{gemms:?}");
    for unit in ["cpp/grouped_gemm_sm90_fp8_rowwise.cu", "cpp/fused_moe_sm90_fp8.cu"] {
        let (ops, _) = opcodes(tool, unit);
        assert!(ops.iter().any(|o| o == "QGMMA"), "{unit}: no QGMMA: {ops:?}");
        assert!(!ops.iter().any(|o| o.starts_with("UTC")), "{unit}: tcgen05 in an SM90 unit: {ops:?}");
    }
}

/// The 4-bit x 4-bit SM100 grouped GEMMs (`cpp/grouped_gemm_sm100_fp4.cu`) multiply block-scaled under
/// `kind::mxf4` / `kind::mxf4nvf4`: `UTCOMMA` (FP8_NOTES' opcode table: the 4-bit block-scaled MMA; no `UTCQMMA`,
/// which is the 8-bit one) with the scale operand in tensor memory after the instruction descriptor, `UTCCP`
/// copying scales there, TMA loads and stores. The two kernels are told apart by their types: MXFP4 runs
/// CUTLASS's `SM100_MMA_MXF4_SS` atom with 32-element UE8M0 blocks (`UTCOMMA`, no `.4X`), NVFP4 the same atom
/// with 16-element UE4M3 blocks, whose MMAs are all `UTCOMMA.4X` (four scales per 64 of K). No 8-bit MMA here,
/// no 4-bit one in the MXF8F6F4 unit.
#[test]
fn the_fp4_gemms_multiply_block_scaled_on_tcgen05() {
    let Some(tool) = tools("the_fp4_gemms_multiply_block_scaled_on_tcgen05") else { return };
    let unit = "cpp/grouped_gemm_sm100_fp4.cu";
    let (ops, kernels) = opcodes(tool, unit);
    for op in ["UTCOMMA", "UTCCP", "UTMALDG", "UTMASTG"] {
        assert!(ops.iter().any(|o| o == op), "{unit}: no {op}: {ops:?}");
    }
    assert!(!ops.iter().any(|o| o.ends_with("GMMA") || o == "UTCHMMA" || o == "UTCQMMA"), "{unit}: {ops:?}");
    // Each kernel's MMAs, by the function they are in.
    let sass = cuobjdump(tool, &["-sass"], &object(unit));
    let mut per_kernel: Vec<(String, Vec<String>)> = Vec::new();
    for line in sass.lines() {
        if let Some(f) = line.trim().strip_prefix("Function : ") {
            per_kernel.push((f.to_string(), Vec::new()));
        } else if line.contains("UTCOMMA") {
            per_kernel.last_mut().expect("an instruction before any function").1.push(line.trim().to_string());
        }
    }
    for (k, mmas) in &per_kernel {
        for l in mmas {
            let after = l.split("idesc[").nth(1).unwrap_or_else(|| panic!("{unit}: UTCOMMA without idesc: {l}"));
            assert!(after.contains("tmem["), "{unit}: a UTCOMMA without its scale operand in {k}: {l}");
        }
    }
    assert_eq!(kernels.iter().filter(|k| k.contains("prepare_mx_groups")).count(), 2, "{kernels:?}");
    let gemms: Vec<&(String, Vec<String>)> = per_kernel.iter().filter(|(k, _)| k.contains("device_kernel")).collect();
    assert_eq!(gemms.len(), 2, "1-SM MXFP4 and NVFP4 (their 2-SM kernels were taken out): {kernels:?}");
    // Both run CUTLASS's SM100_MMA_MXF4_SS atom; no 2-SM atom is left in the unit.
    assert!(gemms.iter().all(|(k, _)| k.contains("float_e2m1_t")), "{kernels:?}");
    for (atom, n) in [("SM100_MMA_MXF4_SS", 2), ("SM100_MMA_MXF4_2x1SM_SS", 0)] {
        assert_eq!(gemms.iter().filter(|(k, _)| k.contains(atom)).count(), n, "{atom}: {kernels:?}");
    }
    let nv: Vec<_> = gemms.iter().filter(|(k, _)| k.contains("float_ue4m3_t")).collect();
    let mx: Vec<_> =
        gemms.iter().filter(|(k, _)| k.contains("float_ue8m0_t") && !k.contains("float_ue4m3_t")).collect();
    assert_eq!((nv.len(), mx.len()), (1, 1), "one NVFP4 (UE4M3) and one MXFP4 (UE8M0) kernel: {kernels:?}");
    let nv_mmas: Vec<&String> = nv.iter().flat_map(|(_, m)| m).collect();
    let mx_mmas: Vec<&String> = mx.iter().flat_map(|(_, m)| m).collect();
    assert!(nv.iter().all(|(_, m)| !m.is_empty()) && mx.iter().all(|(_, m)| !m.is_empty()), "a kernel without MMAs");
    assert!(nv_mmas.iter().all(|l| l.contains(".4X")), "NVFP4: {nv_mmas:?}");
    assert!(mx_mmas.iter().all(|l| !l.contains(".4X")), "MXFP4: {mx_mmas:?}");
    say(&format!(
        "{unit}: {} kernels; {} NVFP4 UTCOMMA.4X, {} MXFP4 UTCOMMA",
        kernels.len(),
        nv_mmas.len(),
        mx_mmas.len()
    ));
    let (ops, _) = opcodes(tool, "cpp/grouped_gemm_sm100_mxfp8.cu");
    assert!(!ops.iter().any(|o| o == "UTCOMMA"), "a 4-bit x 4-bit MMA in the MXF8F6F4 unit: {ops:?}");
}

/// The SM100 FP8 blockwise grouped GEMM (`cpp/grouped_gemm_sm100_fp8_blockwise.cu`, FP8_NOTES' opcode table):
/// sm_100a SASS only; the FP8 tcgen05 MMA (`UTCQMMA`) in its per-tensor form, ending at the instruction
/// descriptor (no scale operand in tensor memory, so no `UTCCP`: the f32 scales are applied outside the tensor
/// cores); the f32 promotion of each 128-wide K block as `FFMA` in CUTLASS's kernel; the K-major scales loaded
/// with cp.async (`LDGSTS`), the operands with TMA; one prepare kernel (ours, shared with SM90) and one GEMM.
#[test]
fn the_sm100_fp8_blockwise_gemm_multiplies_on_tcgen05_and_promotes_with_ffma() {
    let Some(tool) = tools("the_sm100_fp8_blockwise_gemm_multiplies_on_tcgen05_and_promotes_with_ffma") else {
        return;
    };
    let unit = "cpp/grouped_gemm_sm100_fp8_blockwise.cu";
    let (sass_arches, ptx) = embedded(tool, &object(unit));
    assert_eq!(sass_arches, ["sm_100a"], "{unit}: no sm_90 code");
    assert!(ptx.is_empty(), "{unit}: {ptx:?}");
    let (ops, kernels) = opcodes(tool, unit);
    for op in ["UTCQMMA", "FFMA", "LDGSTS", "UTMALDG", "UTMASTG"] {
        assert!(ops.iter().any(|o| o == op), "{unit}: no {op}: {ops:?}");
    }
    assert!(!ops.iter().any(|o| o == "UTCCP"), "{unit}: UTCCP (scales in tensor memory) in the f32-scale kernel");
    assert!(!ops.iter().any(|o| o.ends_with("GMMA") || o == "UTCHMMA" || o == "UTCOMMA"), "{unit}: {ops:?}");
    let sass = cuobjdump(tool, &["-sass"], &object(unit));
    // Per kernel: its UTCQMMA lines and its FFMA count.
    let mut per_kernel: Vec<(String, Vec<String>, usize)> = Vec::new();
    for line in sass.lines() {
        if let Some(f) = line.trim().strip_prefix("Function : ") {
            per_kernel.push((f.to_string(), Vec::new(), 0));
        } else if let Some((_, mmas, ffma)) = per_kernel.last_mut() {
            if line.contains("UTCQMMA") {
                mmas.push(line.trim().to_string());
            }
            if line.contains(" FFMA") {
                *ffma += 1;
            }
        }
    }
    let gemms: Vec<_> = per_kernel.iter().filter(|(k, ..)| k.contains("device_kernel")).collect();
    assert_eq!(gemms.len(), 2, "two configurations (1-SM, 2-SM): {kernels:?}");
    assert_eq!(kernels.iter().filter(|k| k.contains("prepare_fp8_groups")).count(), 2, "{kernels:?}");
    for (atom, n) in [("SM100_MMA_F8F6F4_SS", 1), ("SM100_MMA_F8F6F4_2x1SM_SS", 1), ("MXF8F6F4", 0)] {
        assert_eq!(gemms.iter().filter(|(k, ..)| k.contains(atom)).count(), n, "{atom}: not block-scaled");
    }
    for (name, mmas, ffma) in gemms {
        assert!(name.contains("MainloopSm100ArrayTmaUmmaWarpSpecializedBlockwiseScaling"), "{name}");
        assert!(!mmas.is_empty(), "{unit}: no UTCQMMA in a GEMM");
        for l in mmas {
            let after = l.split("idesc[").nth(1).unwrap_or_else(|| panic!("{unit}: UTCQMMA without idesc: {l}"));
            assert!(!after.contains("tmem["), "{unit}: a block-scaled UTCQMMA (scale operand after idesc): {l}");
        }
        assert!(*ffma > 0, "{unit}: no FFMA in a GEMM: the f32 promotion is missing");
        say(&format!("{unit}: {} UTCQMMA, {ffma} FFMA in a GEMM", mmas.len()));
    }
}

/// Each kernel of an object (its `Function :` name) with its instructions' opcodes, modifiers included (e.g.
/// `UTCQMMA.2CTA`).
fn kernel_opcodes(tool: &Path, unit: &str) -> Vec<(String, Vec<String>)> {
    let sass = cuobjdump(tool, &["-sass"], &object(unit));
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in sass.lines() {
        if let Some(f) = line.trim().strip_prefix("Function : ") {
            out.push((f.to_string(), Vec::new()));
            continue;
        }
        let Some(rest) = line.trim().strip_prefix("/*").and_then(|r| r.split_once("*/")).map(|(_, r)| r.trim()) else {
            continue;
        };
        let rest = rest.strip_prefix('@').map_or(rest, |r| r.split_once(' ').map_or("", |(_, x)| x.trim()));
        let op = rest.split(|c: char| c.is_whitespace() || c == ';').next().unwrap_or("");
        if let (false, Some((_, ops))) = (op.is_empty(), out.last_mut()) {
            ops.push(op.to_string());
        }
    }
    out
}

/// The 2-SM schedules (`KernelPtrArrayTmaWarpSpecialized2SmMxf8f6f4Sm100`, `...Blockwise2SmSm100`) in the SM100
/// units beside their 1-SM twins (the FP4 unit's were taken out in session 8 for nvcc time, and must stay out): each 2-SM GEMM is CUTLASS's kernel over the
/// `2x1SM` MMA atom, its prepare kernel is named by the 2-SM schedule, and its machine code is the pair form of
/// tcgen05 as cuobjdump prints it: every MMA `UTCQMMA.2CTA` / `UTCOMMA.2CTA[.4X]`, the scale copies into tensor
/// memory `UTCCP.T.S.2CTA.4` (block-scaled only), the commits `UTCBAR.2CTA.MULTICAST` (both SMs' barriers), TMA
/// loads `UTMALDG.*.2CTA` (each SM its half of the tile) and the tensor-memory allocation
/// `UTCATOMSWS.2CTA...`. No 1-SM GEMM (nor the bf16 unit's) holds any `.2CTA` instruction.
#[test]
fn the_sm100_units_hold_their_2sm_kernels_in_the_pair_form_of_tcgen05() {
    let Some(tool) = tools("the_sm100_units_hold_their_2sm_kernels_in_the_pair_form_of_tcgen05") else { return };
    let units: [(&str, &str, &[&str], bool); 2] = [
        ("cpp/grouped_gemm_sm100_mxfp8.cu", "UTCQMMA", &["KernelPtrArrayTmaWarpSpecialized2SmMxf8f6f4Sm100"], true),
        (
            "cpp/grouped_gemm_sm100_fp8_blockwise.cu",
            "UTCQMMA",
            &["KernelPtrArrayTmaWarpSpecializedBlockwise2SmSm100"],
            false,
        ),
    ];
    for (unit, mma, schedules, block_scaled) in units {
        let kernels = kernel_opcodes(tool, unit);
        let gemms: Vec<_> = kernels.iter().filter(|(k, _)| k.contains("device_kernel")).collect();
        let (pair, single): (Vec<_>, Vec<_>) = gemms.into_iter().partition(|(k, _)| k.contains("2x1SM"));
        assert_eq!(pair.len(), schedules.len(), "{unit}: one 2-SM GEMM per 2-SM schedule");
        assert!(!single.is_empty(), "{unit}: the 1-SM twins");
        for s in schedules {
            let prep = kernels.iter().filter(|(k, _)| k.contains("prepare_") && k.contains(s)).count();
            assert_eq!(prep, 1, "{unit}: the prepare kernel of {s}");
        }
        for (k, ops) in &pair {
            let has = |op: &str| ops.iter().any(|o| o == op || o.starts_with(&format!("{op}.")));
            let mmas: Vec<&String> = ops.iter().filter(|o| o.split('.').next() == Some(mma)).collect();
            assert!(!mmas.is_empty(), "{unit}: no {mma} in a 2-SM GEMM");
            assert!(mmas.iter().all(|o| o.starts_with(&format!("{mma}.2CTA"))), "{unit}: a 1-SM MMA in {k}: {mmas:?}");
            assert!(has("UTCBAR.2CTA"), "{unit}: no UTCBAR.2CTA in a 2-SM GEMM: {ops:?}");
            assert!(ops.iter().any(|o| o.starts_with("UTMALDG") && o.ends_with(".2CTA")), "{unit}: {ops:?}");
            assert!(ops.iter().any(|o| o.starts_with("UTCATOMSWS.2CTA")), "{unit}: {ops:?}");
            if block_scaled {
                let cps: Vec<&String> = ops.iter().filter(|o| o.starts_with("UTCCP")).collect();
                assert!(!cps.is_empty() && cps.iter().all(|o| o.contains(".2CTA")), "{unit}: {cps:?}");
            } else {
                assert!(!has("UTCCP"), "{unit}: UTCCP in the f32-scale kernel");
            }
            let mut forms: Vec<&str> = ops.iter().map(String::as_str).filter(|o| o.contains(".2CTA")).collect();
            forms.sort();
            forms.dedup();
            say(&format!("{unit}: 2-SM GEMM, {} {mma}.2CTA; pair forms {}", mmas.len(), forms.join(" ")));
        }
        for (k, ops) in &single {
            assert!(!ops.iter().any(|o| o.contains(".2CTA")), "{unit}: a 2-SM instruction in a 1-SM GEMM {k}");
        }
    }
    for unit in ["cpp/grouped_gemm_sm100_bf16.cu", "cpp/grouped_gemm_sm100_fp4.cu"] {
        let ops = kernel_opcodes(tool, unit);
        assert!(ops.iter().all(|(_, ops)| !ops.iter().any(|o| o.contains(".2CTA"))), "{unit} is 1-SM only");
    }
}
