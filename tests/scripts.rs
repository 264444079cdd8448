//! The results scripts' own checks: each parses a sample of the tool output it reads (here, on any machine).

use std::process::Command;

#[test]
fn kernel_account_reads_ncu_csv_and_tells_forwards_apart() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kernel_account.py");
    let out = Command::new("python3").args([script, "--self-test"]).output().expect("python3 (the build needs it)");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("self-test: ok"), "{text}");
}
