//! Tuned-table files (`ConfigName::parse`, `TunedBackends::from_json`): the input split into a name and a text,
//! and the input as the choices of the generator of broken names and tables.
#![no_main]

#[path = "../../tests/common/parsers.rs"]
mod parsers;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (name, table) = text.split_once('\n').unwrap_or((&text, ""));
    parsers::check_tuned_table(name, table);
    let (name, table) = parsers::tuned_table(data);
    parsers::check_tuned_table(&name, &table);
});
