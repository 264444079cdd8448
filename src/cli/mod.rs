pub mod bench;
pub mod info;
