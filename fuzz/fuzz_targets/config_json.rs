//! `config.json`'s `quantization_config` (`Fp8Config::from_config_json`): the input as text, and the input as the
//! choices of the generator of mistyped and out-of-range fields; a config that parses must quantise experts.
#![no_main]

#[path = "../../tests/common/parsers.rs"]
mod parsers;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    parsers::check_config_json(&String::from_utf8_lossy(data));
    parsers::check_config_json(&parsers::config_json(data));
});
