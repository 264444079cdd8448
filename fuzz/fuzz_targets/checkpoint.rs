//! A safetensors checkpoint through every dense and block-FP8 reader (`Checkpoint::from_bytes`, `tensor`,
//! `fp8_weight`, `fp8_block_weight`, `pack_experts`, `pack_shared_expert`, `pack_experts_fp8`,
//! `pack_fp8_experts`, `pack_fp8_shared_expert`, `pack_gpt_oss`): the input itself as a file, and the input as
//! the choices of the generator that breaks valid checkpoints (offsets, shapes, dtypes, scale grids, truncation).
#![no_main]

#[path = "../../tests/common/parsers.rs"]
mod parsers;

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use parsers::Family;

fuzz_target!(|data: &[u8]| {
    let file = Path::new("fuzz-input.safetensors");
    parsers::check_checkpoint(file, data.to_vec(), Family::Safetensors, parsers::fp8_block(0));
    let (bytes, block) = parsers::checkpoint_bytes(data, Family::Safetensors);
    parsers::check_checkpoint(file, bytes, Family::Safetensors, block);
});
