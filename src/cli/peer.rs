//! Running a Python peer script of benches/peers/ on a JSON spec and reading its JSON result.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Per point name: the peer's median µs, or why it has none.
pub type Medians = HashMap<String, Result<f64, String>>;

/// Per point name, the other peers the script measured (name, µs or why not), in the script's order.
pub type Extras = HashMap<String, Vec<(String, Result<f64, String>)>>;

/// What a peer script's headline (its points' `median_us`) is.
#[derive(Clone, Debug, Default)]
pub struct Headline {
    /// An identifier for columns (the document's `headline_id`, e.g. `torch_grouped_mm`), where it gives one.
    pub id: Option<String>,
    /// For people: the document's `headline`, else the identifier, else "the peer".
    pub text: String,
}

impl Headline {
    fn of(doc: &serde_json::Value) -> Headline {
        let id = doc["headline_id"].as_str().map(str::to_string);
        let text = doc["headline"].as_str().map(str::to_string).or_else(|| id.clone()).unwrap_or("the peer".into());
        Headline { id, text }
    }
}

/// What a peer script reported: the headline peer's medians and any other peers.
pub struct Report {
    pub headline: Headline,
    pub medians: Medians,
    pub extras: Extras,
    /// The whole document, for top-level fields (e.g. `fp8_dense_tflops`).
    pub doc: serde_json::Value,
}

/// Runs `python script --spec <file> --out <file>`; `script` is found under the working directory's
/// benches/peers/ first (the GPU host runs from a copy of the repository), then the crate's.
pub fn run(python: &str, script: &str, explicit: Option<&Path>, spec: &serde_json::Value) -> Result<Report, String> {
    if python == "none" {
        return Err("peer skipped (--peer none)".into());
    }
    let script = explicit.map(Path::to_path_buf).unwrap_or_else(|| {
        let local = PathBuf::from("benches/peers").join(script);
        if local.is_file() {
            local
        } else {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers").join(script)
        }
    });
    let dir = std::env::temp_dir();
    let tag = format!("{}-{}", std::process::id(), script.file_stem().unwrap_or_default().to_string_lossy());
    let (spec_path, out_path) =
        (dir.join(format!("moe-gemm-spec-{tag}.json")), dir.join(format!("moe-gemm-out-{tag}.json")));
    std::fs::write(&spec_path, spec.to_string()).map_err(|e| e.to_string())?;
    eprintln!("running the PyTorch peer: {python} {}", script.display());
    let status = Command::new(python)
        .arg(&script)
        .arg("--spec")
        .arg(&spec_path)
        .arg("--out")
        .arg(&out_path)
        .status()
        .map_err(|e| format!("could not run {python}: {e}"))?;
    if !status.success() {
        return Err(format!("peer exited with {status}"));
    }
    let text = std::fs::read_to_string(&out_path).map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    eprintln!("peer: torch {} on {}", v["torch"], v["device"]);
    let points = v["points"].as_array().cloned().unwrap_or_default();
    let name = |p: &serde_json::Value| p["name"].as_str().unwrap_or_default().to_string();
    let medians = points
        .iter()
        .map(|p| {
            (name(p), p["median_us"].as_f64().ok_or_else(|| p["error"].as_str().unwrap_or("no result").to_string()))
        })
        .collect();
    let extras = points
        .iter()
        .map(|p| {
            let peers = p["peers"].as_object().map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_f64().ok_or_else(|| v.as_str().unwrap_or("no result").to_string())))
                    .collect()
            });
            (name(p), peers.unwrap_or_default())
        })
        .collect();
    Ok(Report { headline: Headline::of(&v), medians, extras, doc: v })
}

#[cfg(test)]
mod tests {
    use super::Headline;

    #[test]
    fn the_headline_is_named_by_the_document_not_assumed_to_be_torch() {
        let h = Headline::of(&serde_json::json!({"headline_id": "torch_grouped_mm"}));
        assert_eq!((h.id.as_deref(), h.text.as_str()), (Some("torch_grouped_mm"), "torch_grouped_mm"));
        let h = Headline::of(&serde_json::json!({"headline": "vLLM 0.33.0 Triton fused_moe (bf16)"}));
        assert_eq!((h.id, h.text.as_str()), (None, "vLLM 0.33.0 Triton fused_moe (bf16)"));
        assert_eq!(Headline::of(&serde_json::json!({})).text, "the peer");
    }
}
