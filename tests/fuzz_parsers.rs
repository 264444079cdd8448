//! The parsers of untrusted files, fuzzed in a bounded, seeded form (CPU; the open-ended form is `fuzz/`, run
//! with `cargo fuzz`): safetensors checkpoints (every reader, block-FP8 scales included), gpt-oss MXFP4 blocks,
//! `config.json`'s `quantization_config`, tuned-table files. Each case is a valid file written by the crate's own
//! `checkpoint::save` or the safetensors crate, broken by seeded mutations (`common/parsers.rs`).
//!
//! Properties, per case: no panic (each case runs under `catch_unwind`); no allocation larger than
//! [`MAX_ALLOCATION`] (the inputs are a few hundred KiB at most, so a larger one was sized by a header field that
//! the file's bytes do not back); every error a typed `Error` naming the file and the tensor.
//!
//! The mutator is ours, seeded with splitmix64 (printed on failure, so a case is replayed by its seed), not
//! proptest: the mutations are structural (header JSON, offsets, truncation points), the same decoder drives the
//! libFuzzer targets from their raw input, and `cargo test` compiles no new crate for it.

#[path = "common/parsers.rs"]
mod parsers;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::Instant;

use half::bf16;
use moe_gemm::checkpoint::{save, Checkpoint, ExpertNaming};
use parsers::Family;

/// The largest single allocation a case may make.
const MAX_ALLOCATION: usize = 64 << 20;

/// The system allocator, recording the largest request of the current thread.
struct Watch;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static PANIC_AT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

fn note(size: usize) {
    // `try_with`: the thread's slot may be gone while the thread exits.
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: every call is forwarded to `System` unchanged; the bookkeeping touches a const-initialised thread-local
// `Cell` and never allocates.
unsafe impl GlobalAlloc for Watch {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Watch = Watch;

/// splitmix64, for the case inputs.
fn input(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Runs `case(seed)` for `cases` seeds; panics naming every failing seed (a panic or too large an allocation).
fn run(what: &str, cases: u64, case: impl Fn(u64)) {
    let start = Instant::now();
    let mut failures = Vec::new();
    let hook = std::panic::take_hook();
    // Failures are reported below, once, with their seed and where they panicked.
    std::panic::set_hook(Box::new(|info| {
        let at = info.location().map(|l| l.to_string()).unwrap_or_default();
        let _ = PANIC_AT.try_with(|p| *p.borrow_mut() = at);
    }));
    for seed in 0..cases {
        LARGEST.with(|l| l.set(0));
        let r = catch_unwind(AssertUnwindSafe(|| case(seed)));
        let largest = LARGEST.with(|l| l.get());
        if let Err(p) = r {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            let at = PANIC_AT.with(|p| p.borrow().clone());
            failures.push(format!("seed {seed}: panicked at {at}: {msg}"));
        } else if largest > MAX_ALLOCATION {
            failures.push(format!("seed {seed}: allocated {largest} bytes at once"));
        }
    }
    std::panic::set_hook(hook);
    eprintln!("{what}: {cases} cases in {:.2?}", start.elapsed());
    assert!(failures.is_empty(), "{what}: {} of {cases} cases failed:\n{}", failures.len(), failures.join("\n"));
}

fn tmp(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("moe-gemm-fuzz-{}-{tag}.safetensors", std::process::id()))
}

/// 2500 broken safetensors checkpoints through every dense and block-FP8 reader; every 50th also through
/// `Checkpoint::open` of a file, which must agree with `from_bytes` on whether the file is valid.
#[test]
fn broken_safetensors_checkpoints_give_typed_errors() {
    let path = tmp("st");
    run("safetensors", 2500, |seed| {
        let (bytes, block) = parsers::checkpoint_bytes(&input(seed, 512), Family::Safetensors);
        if seed % 50 == 0 {
            std::fs::write(&path, &bytes).unwrap();
            let opened = Checkpoint::open(&path);
            if let Err(e) = &opened {
                parsers::assert_file_error(e, &path);
            }
            assert_eq!(opened.is_ok(), Checkpoint::from_bytes(&path, bytes.clone()).is_ok(), "seed {seed}");
        }
        parsers::check_checkpoint(&path, bytes, Family::Safetensors, block);
    });
    let _ = std::fs::remove_file(&path);
    assert_reaches_the_readers("safetensors", 2500);
    // Per-tensor and per-channel FP8 experts must pack in some cases, or their readers are only fed junk.
    let r = parsers::reached();
    assert!(r.channel_packs * 100 > 2500, "too few per-channel FP8 experts packed: {r:?}");
}

/// The generator is no good if its files stop at the header: a third must open, and the readers must both succeed
/// and fail many times.
fn assert_reaches_the_readers(what: &str, cases: usize) {
    let r = parsers::reached();
    eprintln!("{what}: {r:?}");
    assert!(r.opened * 3 > cases && r.ok * 4 > cases && r.err * 4 > cases, "{what}: {r:?} over {cases} cases");
}

/// 1500 broken gpt-oss MXFP4 checkpoints (blocks, scales, biases).
#[test]
fn broken_mxfp4_checkpoints_give_typed_errors() {
    let path = tmp("mx");
    run("mxfp4", 1500, |seed| {
        let (bytes, block) = parsers::checkpoint_bytes(&input(seed, 512), Family::Mxfp4);
        parsers::check_checkpoint(&path, bytes, Family::Mxfp4, block);
    });
    assert_reaches_the_readers("mxfp4", 1500);
}

/// Random bytes, and random bytes behind a valid length field, are files that are not safetensors.
#[test]
fn random_bytes_are_not_checkpoints() {
    let path = tmp("random");
    run("random bytes", 1000, |seed| {
        let mut bytes = input(seed, (seed % 300) as usize);
        if seed % 2 == 0 && bytes.len() > 8 {
            let n = (bytes.len() - 8) as u64 - seed % 3;
            bytes[..8].copy_from_slice(&n.to_le_bytes());
            bytes[8] = b'{';
        }
        parsers::check_checkpoint(&path, bytes, Family::Safetensors, parsers::fp8_block(0));
    });
}

/// A checkpoint written by `checkpoint::save`, truncated at every byte, is an error when opened from its file,
/// naming the file: never a map whose reads run past the end.
#[test]
fn a_file_truncated_at_any_byte_is_an_error_at_open() {
    let path = tmp("truncated");
    let (i, h) = (2usize, 3usize);
    let tensors: Vec<_> = (0..2)
        .flat_map(|e| {
            let [g, u, d] = ExpertNaming::GateUpDown.names(parsers::PREFIX, e);
            let w = |n: usize| (0..n).map(|x| bf16::from_f32(x as f32)).collect::<Vec<_>>();
            [(g, vec![i, h], w(i * h)), (u, vec![i, h], w(i * h)), (d, vec![h, i], w(h * i))]
        })
        .collect();
    save(&path, &tensors).unwrap();
    let full = std::fs::read(&path).unwrap();
    assert!(Checkpoint::open(&path)
        .unwrap()
        .pack_experts::<bf16>(parsers::PREFIX, 2, ExpertNaming::GateUpDown)
        .is_ok());
    for len in 0..full.len() {
        std::fs::write(&path, &full[..len]).unwrap();
        let err = Checkpoint::open(&path).unwrap_err();
        parsers::assert_file_error(&err, &path);
    }
    let _ = std::fs::remove_file(&path);
}

/// 3000 `config.json` texts with random and mistyped `quantization_config` fields.
#[test]
fn broken_quantization_configs_give_typed_errors() {
    run("config.json", 3000, |seed| parsers::check_config_json(&parsers::config_json(&input(seed, 64))));
    // Some texts must parse into a config, which is then used.
    let r = parsers::reached();
    eprintln!("config.json: {r:?}");
    assert!(r.opened * 20 > 3000 && r.err * 4 > 3000, "config.json: {r:?}");
    assert!(r.compressed_tensors * 200 > 3000, "config.json: too few compressed-tensors schemes parsed: {r:?}");
}

/// 2000 tuned-table file names and texts.
#[test]
fn broken_tuned_tables_give_typed_errors() {
    run("tuned tables", 2000, |seed| {
        let (name, text) = parsers::tuned_table(&input(seed, 256));
        parsers::check_tuned_table(&name, &text);
    });
}

/// Errors at the tensor level name the tensor, the file and the violated constraint; at the file level, the file
/// and what is wrong with it.
#[test]
fn messages_name_the_file_the_tensor_and_the_constraint() {
    let path = tmp("messages");
    let [g, ..] = ExpertNaming::GateUpDown.names(parsers::PREFIX, 0);
    // A [0, 2^40] bf16 tensor holds no bytes: read as an expert, an empty weight.
    let mut header =
        format!(r#"{{"{g}":{{"dtype":"BF16","shape":[0,1099511627776],"data_offsets":[0,0]}}}}"#).into_bytes();
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&header);
    let c = Checkpoint::from_bytes(&path, file.clone()).unwrap();
    let err = c.pack_experts::<bf16>(parsers::PREFIX, 1, ExpertNaming::GateUpDown).unwrap_err().to_string();
    assert!(err.contains(&g) && err.contains(&path.display().to_string()) && err.contains("empty weight"), "{err}");
    // The same header with 2^40 x 2^40 elements: the byte count overflows, an error at open.
    let big = String::from_utf8(file[8..].to_vec()).unwrap().replace("\"shape\":[0,", "\"shape\":[1099511627776,");
    let mut file2 = (big.len() as u64).to_le_bytes().to_vec();
    file2.extend_from_slice(big.as_bytes());
    let err = Checkpoint::from_bytes(&path, file2).unwrap_err().to_string();
    assert!(err.contains(&path.display().to_string()) && err.contains("overflows"), "{err}");
    // Truncated: the header length field points past the end.
    let err = Checkpoint::from_bytes(&path, file[..file.len() - 3].to_vec()).unwrap_err().to_string();
    assert!(err.contains("past the end of the file"), "{err}");
}

/// A safetensors file from (name, dtype, shape) entries of zero bytes each.
fn empty_tensors(entries: &[(&str, &str, &[u64])]) -> Vec<u8> {
    let header: serde_json::Map<String, serde_json::Value> = entries
        .iter()
        .map(|(n, d, s)| (n.to_string(), serde_json::json!({"dtype": d, "shape": s, "data_offsets": [0, 0]})))
        .collect();
    let text = serde_json::to_vec(&header).unwrap();
    let mut file = (text.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&text);
    file
}

/// Tensors with a zero dimension hold no bytes whatever their other dimensions: E = 0 experts of H = 2^63 once
/// passed every MXFP4 check and made `pack_gpt_oss_dequantized` panic (a chunk size of 64 · 2^63, wrapped to 0);
/// `[2^63, 0]` FP8 gate and up overflowed `2 · I` when stacked. Both are errors now, naming the tensor.
#[test]
fn zero_dimensions_beside_huge_ones_are_errors() {
    let path = tmp("zero-dims");
    let p = parsers::PREFIX;
    let n = |s: &str| format!("{p}.experts.{s}");
    let names = [n("gate_up_proj_blocks"), n("gate_up_proj_scales"), n("gate_up_proj_bias"), n("down_proj_blocks")];
    let names2 = [n("down_proj_scales"), n("down_proj_bias")];
    let h = 1u64 << 63;
    let file = empty_tensors(&[
        (&names[0], "U8", &[0, 64, 1 << 58, 16]),
        (&names[1], "U8", &[0, 64, 1 << 58]),
        (&names[2], "BF16", &[0, 64]),
        (&names[3], "U8", &[0, h, 1, 16]),
        (&names2[0], "U8", &[0, h, 1]),
        (&names2[1], "BF16", &[0, h]),
    ]);
    let c = Checkpoint::from_bytes(&path, file).unwrap();
    let err = c.pack_gpt_oss_dequantized::<bf16>(p).unwrap_err().to_string();
    assert!(err.contains(&names[0]) && err.contains("must be positive"), "{err}");

    let [g, u, d] = ExpertNaming::GateUpDown.names(p, 0);
    let (gs, us, ds) = (format!("{g}_scale_inv"), format!("{u}_scale_inv"), format!("{d}_scale_inv"));
    let file = empty_tensors(&[
        (&g, "F8_E4M3", &[h, 0]),
        (&gs, "F32", &[h / 128, 0]),
        (&u, "F8_E4M3", &[h, 0]),
        (&us, "F32", &[h / 128, 0]),
        (&d, "F8_E4M3", &[0, h]),
        (&ds, "F32", &[0, h / 128]),
    ]);
    let c = Checkpoint::from_bytes(&path, file).unwrap();
    let err = c
        .pack_fp8_experts(p, 2, ExpertNaming::GateUpDown, &moe_gemm::checkpoint::Fp8Config::DEEPSEEK_V3)
        .unwrap_err()
        .to_string();
    assert!(err.contains(&g) && err.contains("empty weight"), "{err}");
}
