//! The bottom floor: the door to C++ (the MoE ops' cxx bridge, `bridge`) and the launch layer around it. The GEMM
//! families' launchers, each a `launch.rs` in its family's folder with the family's own bridge, and their generated
//! `sys.rs`, stand on this floor too (`tests/layering.rs` lists them): they use the helpers and checks here, and
//! nothing here names them. Every `unsafe` block of the crate lives in these files, each with the argument for its
//! safety; the crate denies `unsafe_code` everywhere else.
//!
//! ffi knows no domain type: it takes cudarc buffers, `DType`/`Element` and its own plain descriptors (the C++
//! enums as `sys` generates them, small structs of scalars and buffers defined here), which `kernels`, `layouts`,
//! `routing` and `layer` build from their validated types. Each launcher binds the stream's context to the calling thread,
//! checks the buffer lengths and alignments its unsafe call relies on (O(1) host work: nothing is allocated,
//! copied, read back or synchronised), holds cudarc's stream-ordering guards until the C++ call has queued its
//! work, and maps the C++ status to `crate::Error` (`status`).
//!
//! | module | what |
//! |---|---|
//! | `sys` | the C++ argument structs, their enums and `Status`, generated from the headers (scripts/bindgen.sh) |
//! | `bridge` | the MoE ops' and the runtime's `#[cxx::bridge]`: the C++ functions, taking `sys`'s types |
//! | `gemm` | what the grouped GEMM launchers share: the group arrays, the plan descriptor, the launch checks |
//! | `routing` | routers |
//! | `layouts` | layout build, gather, combine |
//! | `elementwise` | activation, the fused backend's sum over slots, the batched decode layer |
//! | `quant` | FP8 activation quantisation: rows, rows gathered to layout positions, rows in use |
//! | `runtime` | driver and runtime facts, spin, read sweep, SIGPIPE, mmap of checkpoints |
//! | `cublas` | the ceilings' cuBLAS bf16 and cuBLASLt fp8 GEMMs |
//! | `status` | `Status` → `Error` |

pub(crate) mod bridge;
#[cfg(feature = "cli")]
pub(crate) mod cublas;
pub(crate) mod decode_fp8;
pub(crate) mod elementwise;
pub(crate) mod ep;
pub(crate) mod gemm;
pub(crate) mod layouts;
pub(crate) mod mx_quant;
pub(crate) mod quant;
pub(crate) mod routing;
pub(crate) mod runtime;
pub(crate) mod status;
pub(crate) mod sys;

use cudarc::driver::CudaStream;

/// Checks at compile time that a generated type (`sys`, a family's `sys`) has its C++ layout: `layout!(Type: size,
/// align; field offset, ...)`, the numbers bindgen computed from the header (scripts/bindgen.sh writes the lines).
macro_rules! layout {
    ($t:ident: $size:literal, $align:literal; $($field:ident $offset:literal),* $(,)?) => {
        const _: () = {
            assert!(::std::mem::size_of::<$t>() == $size, concat!("size of ", stringify!($t)));
            assert!(::std::mem::align_of::<$t>() == $align, concat!("alignment of ", stringify!($t)));
            $(assert!(
                ::std::mem::offset_of!($t, $field) == $offset,
                concat!("offset of ", stringify!($t), "::", stringify!($field))
            );)*
        };
    };
}
pub(crate) use layout;

pub(crate) use sys::{Activation, GateUp, LayoutKind, RouterKind};

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

pub(crate) fn dtype(d: DType) -> sys::DType {
    match d {
        DType::BF16 => sys::DType::BF16,
        DType::F16 => sys::DType::F16,
    }
}

/// Makes the stream's context current on this thread: a fresh thread, or one that last worked on another
/// device, then launches on the stream's device. Cheap when it already is current (one driver query).
pub(crate) fn bind(stream: &CudaStream) -> Result<()> {
    Ok(stream.context().bind_to_thread()?)
}

pub(crate) fn need_len(name: &'static str, len: usize, need: usize, what: &str) -> Result<()> {
    if len < need {
        return Err(Error::Buffer { name, detail: format!("holds {len} elements, needs {need} ({what})") });
    }
    Ok(())
}

pub(crate) fn need_aligned(name: &'static str, ptr: u64) -> Result<()> {
    if ptr % 16 != 0 {
        return Err(Error::Buffer { name, detail: format!("device address {ptr:#x} is not 16-byte aligned (TMA)") });
    }
    Ok(())
}

/// f32 scales read one at a time need their natural alignment, which a view of an f32 slice always has; checked
/// because the unsafe calls rely on it.
pub(crate) fn need_f32_aligned(name: &'static str, ptr: u64) -> Result<()> {
    if ptr % 4 != 0 {
        return Err(Error::Buffer { name, detail: format!("device address {ptr:#x} is not 4-byte aligned") });
    }
    Ok(())
}

/// A row length (in elements of `T`) whose rows start on 16-byte boundaries when the base does: the element
/// type's TMA alignment, which the kernels' vector loads and TMA descriptors need. Positive and within int32.
pub(crate) fn need_row_len<T: Element>(name: &'static str, len: usize) -> Result<()> {
    let align = T::DTYPE.tma_alignment();
    if len == 0 || len % align != 0 || len > i32::MAX as usize {
        return Err(Error::InvalidProblem(format!(
            "{name} = {len}: must be a positive multiple of {align} within int32 (16-byte rows of {})",
            T::DTYPE
        )));
    }
    Ok(())
}

/// `v` as the kernels' int32 extent named `name`.
pub(crate) fn to_i32(name: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::InvalidProblem(format!("{name} = {v} exceeds the kernels' int32 range")))
}

/// `v` as the kernels' int64 extent named `name`.
pub(crate) fn to_i64(name: &str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::InvalidProblem(format!("{name} = {v} exceeds the kernels' int64 range")))
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;

    /// FNV-1a (64 bits) of `bytes`, continued from `h`: scripts/bindgen.sh's hash of its inputs.
    fn fnv1a64(h: u64, bytes: &[u8]) -> u64 {
        bytes.iter().fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
    }
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

    fn read(path: &str) -> Vec<u8> {
        fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// The headers `text` includes by quotes (`#include "common/launch.h"`), as paths from the crate root.
    fn quoted_includes(text: &[u8]) -> Vec<String> {
        String::from_utf8_lossy(text)
            .lines()
            .filter_map(|l| l.strip_prefix("#include \"")?.strip_suffix('"').map(|h| format!("cpp/{h}")))
            .collect()
    }

    #[test]
    fn the_inputs_hash_is_fnv1a64() {
        assert_eq!(fnv1a64(FNV_OFFSET, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(FNV_OFFSET, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(FNV_OFFSET, b"foobar"), 0x8594_4171_f739_67e8);
    }

    /// The inputs a generated sys.rs records, and whether their hash is still the recorded one.
    fn recorded_inputs(sys_path: &str) -> (Vec<String>, bool) {
        let sys = String::from_utf8(read(sys_path)).unwrap();
        let recorded =
            sys.lines().find_map(|l| l.strip_prefix("//! inputs-fnv1a64: ")).expect("no inputs-fnv1a64 line");
        let inputs: Vec<String> = sys.lines().filter_map(|l| l.strip_prefix("//! input: ")).map(String::from).collect();
        let hash = inputs.iter().fold(FNV_OFFSET, |h, path| {
            let h = fnv1a64(fnv1a64(h, path.as_bytes()), &[0]);
            fnv1a64(fnv1a64(h, &read(path)), &[0])
        });
        (inputs, format!("{hash:016x}") == recorded)
    }

    const STALE: &str = "is stale: a header it was generated from (or scripts/bindgen.sh) changed since; run \
                         scripts/bindgen.sh (bindgen-cli 0.73, libclang) and commit what it writes";

    /// The headers a bridge includes (`include!("moe-gemm/cpp/...")`), as paths from the crate root.
    fn bridge_headers(text: &str) -> Vec<String> {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix("include!(\"moe-gemm/")?.strip_suffix("\");").map(String::from))
            .collect()
    }

    /// The headers every family shares and the MoE ops' (those src/ffi/bridge.rs includes).
    fn shared_headers() -> Vec<String> {
        bridge_headers(&String::from_utf8(read("src/ffi/bridge.rs")).unwrap())
    }

    /// src/ffi/sys.rs records the inputs it was generated from and their hash; they must be as they are now.
    #[test]
    fn sys_rs_is_generated_from_the_headers_as_they_are() {
        let (inputs, fresh) = recorded_inputs("src/ffi/sys.rs");
        let mut listed = vec!["scripts/bindgen.sh".to_string()];
        listed.extend(shared_headers());
        assert_eq!(
            inputs, listed,
            "src/ffi/bridge.rs includes other headers than src/ffi/sys.rs was generated from: run scripts/bindgen.sh"
        );
        for header in &listed[1..] {
            for inc in quoted_includes(&read(header)) {
                assert!(
                    listed.contains(&inc),
                    "{header} includes {inc}, which src/ffi/bridge.rs does not: include it there, then run \
                     scripts/bindgen.sh"
                );
            }
        }
        assert!(fresh, "src/ffi/sys.rs {STALE}");
    }

    /// Each GEMM family's sys.rs is generated from the headers its bridge includes, as they are now; a header they
    /// include is the family's own or a shared one.
    #[test]
    fn each_familys_sys_rs_is_generated_from_its_bridges_headers() {
        let shared = shared_headers();
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut families = 0;
        for entry in fs::read_dir(root.join("src/kernels")).unwrap() {
            let dir = entry.unwrap().path();
            let family = dir.file_name().unwrap().to_string_lossy().to_string();
            let launcher = format!("src/kernels/{family}/launch.rs");
            let Ok(text) = fs::read_to_string(root.join(&launcher)) else { continue };
            if !text.contains("#[cxx::bridge") {
                continue;
            }
            families += 1;
            let own = bridge_headers(&text);
            let sys_path = format!("src/kernels/{family}/sys.rs");
            let (inputs, fresh) = recorded_inputs(&sys_path);
            let mut listed = vec!["scripts/bindgen.sh".to_string()];
            listed.extend(own.iter().cloned());
            assert_eq!(
                inputs, listed,
                "{launcher} includes other headers than {sys_path} was generated from: run scripts/bindgen.sh"
            );
            for header in &own {
                for inc in quoted_includes(&read(header)) {
                    assert!(
                        own.contains(&inc) || shared.contains(&inc),
                        "{header} includes {inc}, neither {family}'s (its bridge's include!s) nor src/ffi/bridge.rs's"
                    );
                }
            }
            assert!(fresh, "{sys_path} {STALE}");
        }
        assert!(
            families >= 5,
            "found {families} GEMM families with a bridge, expected dense, fp8_blockwise, fp8_rowwise, mx, fused"
        );
    }
}
