//! gpt-oss MXFP4 checkpoints (`mxfp4_weight`, `pack_gpt_oss_mxfp4`, `pack_gpt_oss_dequantized`): the input itself
//! as a file, and the input as the choices of the generator that breaks valid ones (blocks, scales, biases).
#![no_main]

#[path = "../../tests/common/parsers.rs"]
mod parsers;

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use parsers::Family;

fuzz_target!(|data: &[u8]| {
    let file = Path::new("fuzz-input.safetensors");
    parsers::check_checkpoint(file, data.to_vec(), Family::Mxfp4, parsers::fp8_block(0));
    let (bytes, block) = parsers::checkpoint_bytes(data, Family::Mxfp4);
    parsers::check_checkpoint(file, bytes, Family::Mxfp4, block);
});
