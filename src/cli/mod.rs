pub mod bench;
pub mod fp8_bench;
pub mod info;
pub mod layer_bench;
pub mod peer;
pub mod plan;
pub mod plot;
