//! vLLM-format tuned-config files: names, reading, writing, diffing (CPU).

use std::path::Path;

use moe_gemm::layer::WeightFormat;
use moe_gemm::tuning::{ConfigFile, ConfigName, TunedBackends};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/configs");

#[test]
fn names_parse_and_format_like_vllm() {
    let plain = "E=8,N=14336,device_name=NVIDIA_H200.json";
    let n = ConfigName::parse(plain).unwrap();
    assert_eq!(
        (n.experts, n.n, n.device_name.as_str(), n.dtype.as_deref(), n.block_shape),
        (8, 14336, "NVIDIA_H200", None, None)
    );
    assert_eq!(n.to_string(), plain);
    let fp8 = "E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json";
    let n = ConfigName::parse(&format!("/some/dir/{fp8}")).unwrap();
    assert_eq!((n.dtype.as_deref(), n.block_shape), (Some("fp8_w8a8"), Some([128, 128])));
    assert_eq!(n.to_string(), fp8);
    assert_eq!(ConfigName::device("NVIDIA H100 80GB HBM3"), "NVIDIA_H100_80GB_HBM3");
}

#[test]
fn malformed_names_say_what_is_wrong() {
    let msg = |s: &str| ConfigName::parse(s).unwrap_err().to_string();
    assert!(msg("E=8,N=14336,device_name=X").contains(".json"));
    assert!(msg("N=14336,device_name=X.json").contains("no E="));
    assert!(msg("E=eight,N=1,device_name=X.json").contains("E is not a number"));
    assert!(msg("E=8,N=1,device_name=X,block_shape=[128].json").contains("two sizes"));
    assert!(msg("E=8,N=1,device_name=X,tp=2.json").contains("unknown field"));
}

#[test]
fn fixtures_read_with_their_token_buckets() {
    let f = ConfigFile::read(&Path::new(FIXTURES).join("E=8,N=14336,device_name=NVIDIA_H200.json")).unwrap();
    assert_eq!(f.buckets.keys().copied().collect::<Vec<_>>(), vec![1, 8, 64, 256, 4096]);
    assert_eq!(f.buckets[&4096]["BLOCK_SIZE_N"], 256);
    let g = ConfigFile::read(
        &Path::new(FIXTURES).join("E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"),
    )
    .unwrap();
    assert_eq!(g.name.block_shape, Some([128, 128]));
}

#[test]
fn ours_write_in_the_same_format_and_diff_bucket_by_bucket() {
    let theirs = ConfigFile::read(&Path::new(FIXTURES).join("E=8,N=14336,device_name=NVIDIA_H200.json")).unwrap();
    let mut name = theirs.name.clone();
    name.dtype = Some("bf16".into());
    let ours = ConfigFile {
        name,
        buckets: [1usize, 64, 16384]
            .into_iter()
            .map(|t| (t, serde_json::json!({"backend": "Grouped", "w13": {"config": "pingpong-64x128x64"}})))
            .collect(),
    };
    let dir = std::env::temp_dir().join(format!("moe-gemm-tuning-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = ours.write(&dir).unwrap();
    assert!(path.ends_with("E=8,N=14336,device_name=NVIDIA_H200,dtype=bf16.json"));
    let back = ConfigFile::read(&path).unwrap();
    assert_eq!(back, ours);
    let common: Vec<usize> = back.common_buckets(&theirs).iter().map(|c| c.0).collect();
    assert_eq!(common, vec![1, 64]);
    std::fs::write(dir.join("E=1,N=1,device_name=X.json"), "{\"one\": {}}").unwrap();
    let err = ConfigFile::read(&dir.join("E=1,N=1,device_name=X.json")).unwrap_err();
    assert!(err.to_string().contains("not a token count"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The config-file entry of a Qwen3-30B-A3B-shaped layer (E 128, H 2048, I 768, k 8) at `tokens`.
fn qwen3_30b_choice(
    backend: moe_gemm::Backend,
    tokens: usize,
    fused_tile: Option<moe_gemm::kernels::fused::FusedTile>,
) -> serde_json::Value {
    moe_gemm::tuning::LayerChoice {
        backend,
        auto: moe_gemm::Backend::Grouped,
        format: WeightFormat::Dense,
        experts: 128,
        hidden: 2048,
        inter: 768,
        top_k: 8,
        tokens,
        sm_count: 132,
        fused_tile,
        median_us: Some(1.0),
    }
    .entry()
}

/// A written bucket names the kernels its backend really runs: no grouped-GEMM tile for the batched decode
/// kernels, the fused tile for Fused, the grouped GEMM's heuristic tile for the layout backends.
#[test]
fn layer_choices_name_the_kernels_each_backend_runs() {
    use moe_gemm::kernels::fused::FusedTile;
    use moe_gemm::Backend;
    let choice = qwen3_30b_choice;
    let b = choice(Backend::Batched, 1, None);
    assert_eq!((b["backend"].as_str(), b["auto_pick"].as_str()), (Some("Batched"), Some("Grouped")));
    assert_eq!(b["w13"]["config"], "batched-decode");
    assert!(b["w13"].get("tile").is_none());
    let f = choice(Backend::Fused, 16, None); // 1 row per expert
    assert_eq!(f["w13"]["config"], "fused-decode-16");
    assert_eq!(f["w2"]["schedule"], "SwapAbStreaming");
    let f = choice(Backend::Fused, 256, None); // 16 rows per expert
    assert_eq!(f["w13"]["config"], "fused-decode-merged");
    assert_eq!(f["w2"]["tile"], serde_json::json!([64, 32, 64]));
    let f = choice(Backend::Fused, 512, None); // 32 rows per expert
    assert_eq!(f["w13"]["config"], "fused-64x128x64");
    assert_eq!(f["w2"]["tile"], serde_json::json!([64, 128, 64]));
    let f = choice(Backend::Fused, 64, Some(FusedTile::M128N256K64));
    assert_eq!(f["w13"]["config"], "fused-128x256x64");
    let g = choice(Backend::Grouped, 4096, None);
    let want = moe_gemm::kernels::TileConfig::heuristic(128, 2 * 768, 4096 * 8, 132);
    assert_eq!(g["w13"]["config"], want.name());
    assert_eq!(g["median_us"], 1.0);
}

/// Tuned backends: the nearest bucket (the smaller on a tie, as vLLM's `min` over |key - M|), every bad table
/// refused by name, files written by `--write-configs` read back, a vLLM kernel config refused.
#[test]
fn tuned_backends_pick_the_nearest_bucket_and_refuse_bad_tables() {
    use moe_gemm::tuning::LayerChoice;
    use moe_gemm::Backend::*;
    let t = TunedBackends::new(8, 14336, &[(1024, Grouped), (1, Batched), (64, Fused)]).unwrap();
    assert_eq!(t.buckets(), &[(1, Batched), (64, Fused), (1024, Grouped)]);
    for (tokens, want) in [(1, Batched), (32, Batched), (33, Fused), (544, Fused), (545, Grouped), (1 << 20, Grouped)] {
        assert_eq!(t.pick(tokens), want, "T = {tokens}");
    }
    let err = |b: &[(usize, moe_gemm::Backend)]| TunedBackends::new(8, 14336, b).unwrap_err().to_string();
    assert!(err(&[]).contains("0 buckets"));
    assert!(err(&[(4, Grouped), (4, Fused)]).contains("token count 4 given twice"));
    assert!(err(&[(0, Grouped)]).contains("token count 0"));
    assert!(err(&[(8, Auto)]).contains("Auto is not a backend"));
    let many: Vec<_> = (1..=33).map(|t| (t, Grouped)).collect();
    assert!(err(&many).contains("33 buckets"));
    // A file as --write-configs writes it reads back to the measured backends.
    let dir = std::env::temp_dir().join(format!("moe-gemm-tuned-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let name = ConfigName::parse("E=8,N=14336,device_name=NVIDIA_H200,dtype=bf16.json").unwrap();
    let entry = |backend, tokens| {
        LayerChoice {
            backend,
            auto: Grouped,
            format: WeightFormat::Dense,
            experts: 8,
            hidden: 4096,
            inter: 14336,
            top_k: 2,
            tokens,
            sm_count: 132,
            fused_tile: None,
            median_us: Some(1.0),
        }
        .entry()
    };
    let file = ConfigFile { name: name.clone(), buckets: [(1, entry(Batched, 1)), (256, entry(Fused, 256))].into() };
    let path = file.write(&dir).unwrap();
    let back = TunedBackends::read(&path).unwrap();
    assert_eq!((back.shape(), back.buckets()), ((8, 14336), &[(1, Batched), (256, Fused)][..]));
    let vllm = TunedBackends::from_json(&name, r#"{"1": {"BLOCK_SIZE_M": 16, "num_warps": 4}}"#).unwrap_err();
    assert!(vllm.to_string().contains("bucket 1 has no \"backend\""), "{vllm}");
    let unknown = TunedBackends::from_json(&name, r#"{"1": {"backend": "Tiled"}}"#).unwrap_err();
    assert!(unknown.to_string().contains("unknown backend \"Tiled\""), "{unknown}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A plan with tuned backends makes room for them and sizes each for the batches the table sends it; a tuned
/// backend that cannot run (Eager, which a batch never runs under Auto; Batched past its rows) falls back to the
/// cost model.
#[test]
fn tuned_sizing_gives_room_to_the_tuned_backends() {
    use moe_gemm::dtype::DType;
    use moe_gemm::layer::{LayerShape, WeightFormat};
    use moe_gemm::Backend::*;
    use moe_gemm::{Backends, LayerSizing};
    let mixtral = LayerShape {
        experts: 8,
        global_experts: 8,
        top_k: 2,
        shared_groups: 0,
        hidden: 4096,
        inter: 14336,
        gated: true,
    };
    let size = |format, t: usize, tuned| {
        LayerSizing::for_format_tuned(mixtral, DType::BF16, format, t, Auto, None, None, None, false, 132, tuned)
            .unwrap()
    };
    let tuned = TunedBackends::new(8, 14336, &[(1, Masked), (48, Grouped)]).unwrap();
    let s = size(WeightFormat::Dense, 64, Some(tuned));
    assert!(s.backends().contains(Masked) && s.backends().contains(Grouped), "{}", s.backends());
    let passes = s.pass_tokens();
    let of = |b| passes.iter().find(|p| p.0 == b).map(|p| p.1);
    // Masked for T <= 24 (nearest bucket 1), Grouped from 25 (nearest 48) to 64.
    assert_eq!((of(Masked), of(Grouped)), (Some(24), Some(64)));
    assert_eq!(size(WeightFormat::Dense, 64, None).backends(), Backends::AUTO, "untuned: Auto's three");
    // A 16-bit table is no FP8 one: an FP8 plan refuses it; Eager synchronises and has no FP8 form, so a table
    // naming it cannot become an FP8 one.
    let eager = TunedBackends::new(8, 14336, &[(1, Eager)]).unwrap();
    let fp8 = LayerSizing::for_format_tuned(
        mixtral,
        DType::BF16,
        WeightFormat::Fp8Block,
        64,
        Auto,
        None,
        None,
        None,
        false,
        132,
        Some(eager),
    );
    assert!(fp8.unwrap_err().to_string().contains("measured over dense experts"));
    assert!(eager.with_format(WeightFormat::Fp8Block).unwrap_err().to_string().contains("bucket 1: eager"));
    assert_eq!(size(WeightFormat::Fp8Block, 64, None).backends(), Backends::FP8_AUTO);
}

/// Fused tiles in a tuned table: read from each bucket's `"fused_tile"`, taken by a 16-bit layer's Fused passes
/// at the nearest bucket (the rule where that bucket names none), never over a tile the layer fixes, and not
/// by FP8 layers; kept by `restricted_to`; a bad name or a tile for no bucket refused by name.
#[test]
fn tuned_fused_tiles_follow_the_nearest_bucket() {
    use moe_gemm::dtype::DType;
    use moe_gemm::kernels::fused::FusedTile::{self, *};
    use moe_gemm::layer::{LayerShape, WeightFormat};
    use moe_gemm::Backend::*;
    use moe_gemm::{Backends, LayerSizing};
    let name = ConfigName::parse("E=128,N=768,device_name=NVIDIA_H200,dtype=bf16.json").unwrap();
    let entry =
        |backend, tokens, fused_tile| format!("\"{tokens}\": {}", qwen3_30b_choice(backend, tokens, fused_tile));
    let text = format!(
        "{{{}, {}, {}, {}}}",
        entry(Batched, 1, None),
        entry(Fused, 32, Some(Decode16)),
        entry(Grouped, 64, Some(DecodeMerged)),
        entry(Fused, 256, Some(M64N128K64))
    );
    let t = TunedBackends::from_json(&name, &text).unwrap();
    let tiles: Vec<_> = [1, 20, 32, 48, 49, 64, 160, 161, 4096].iter().map(|&n| t.fused_tile(n)).collect();
    let want = [None, Some(Decode16), Some(Decode16), Some(Decode16), Some(DecodeMerged), Some(DecodeMerged)];
    assert_eq!(tiles[..6], want);
    assert_eq!(tiles[6..], [Some(DecodeMerged), Some(M64N128K64), Some(M64N128K64)]);
    // Restricted to Fused and Batched: bucket 64 (Grouped) goes, with its tile.
    let r = t.restricted_to(Backends::of(Fused).union(Backends::of(Batched))).unwrap();
    assert_eq!((r.fused_tile(64), r.fused_tile(200)), (Some(Decode16), Some(M64N128K64)));

    let qwen = LayerShape {
        experts: 128,
        global_experts: 128,
        top_k: 8,
        shared_groups: 0,
        hidden: 2048,
        inter: 768,
        gated: true,
    };
    let size = |format, fixed: Option<FusedTile>, tuned| {
        LayerSizing::for_format_tuned(qwen, DType::BF16, format, 256, Auto, None, None, fixed, false, 132, tuned)
            .unwrap()
    };
    let s = size(WeightFormat::Dense, None, Some(t));
    // T = 64 is 4 rows per expert: the rule's merged tile; the table names Decode16 at bucket 32.
    assert_eq!(FusedTile::for_rows(64 * 8, 128), DecodeMerged);
    assert_eq!(
        (s.fused_tile(40), s.fused_tile(1), s.fused_tile(300)),
        (Decode16, FusedTile::for_rows(8, 128), M64N128K64)
    );
    assert_eq!(size(WeightFormat::Dense, Some(M128N256K64), Some(t)).fused_tile(40), M128N256K64, "a fixed tile wins");
    let fp8 = size(WeightFormat::Fp8Block, None, Some(t.with_format(WeightFormat::Fp8Block).unwrap()));
    assert_eq!(fp8.fused_tile(40), FusedTile::for_rows_fp8(40 * 8, 128), "FP8 keeps its rule");

    let bad = TunedBackends::from_json(&name, r#"{"1": {"backend": "Fused", "fused_tile": "fused-16x16"}}"#);
    let bad = bad.unwrap_err().to_string();
    assert!(
        bad.contains("\"fused_tile\" \"fused-16x16\" is not a tile") && bad.contains("fused-decode-merged"),
        "{bad}"
    );
    let t1 = TunedBackends::new(128, 768, &[(1, Fused)]).unwrap();
    let stray = t1.with_fused_tiles(&[(2, Decode16)]).unwrap_err().to_string();
    assert!(stray.contains("token count 2, which is no bucket"), "{stray}");
}

/// The shipped tables (`configs/<gpu>/`, compiled in): each parses, names its format, covers the suite's token
/// buckets 1 ... 16384, is found by its own GPU, format and shape (as the driver names the GPU), and by nothing
/// else; every bucket's backend is the one its file says (a table compiled from the wrong file, or read with the
/// wrong key, fails). The H200's 16-bit tables cover every suite model.
#[test]
fn shipped_tables_cover_the_suite_models() {
    use moe_gemm::tuning::{table_format, SHIPPED};
    let suite = [(8, 14336), (128, 768), (128, 1536), (128, 2880), (256, 2048)];
    let gpus = [("NVIDIA_H200", "NVIDIA H200"), ("NVIDIA_H100_80GB_HBM3", "NVIDIA H100 80GB HBM3")];
    for (file, text) in SHIPPED {
        let name = ConfigName::parse(file).unwrap();
        let format = table_format(&name).unwrap();
        assert!(suite.contains(&(name.experts, name.n)), "{file}: not a suite model's E, N");
        let &(_, gpu) = gpus.iter().find(|g| g.0 == name.device_name).unwrap_or_else(|| panic!("{file}: GPU"));
        let t = TunedBackends::shipped(gpu, format, name.experts, name.n).unwrap_or_else(|| panic!("{file}"));
        assert_eq!((t.shape(), t.format(), t.shipped_file()), ((name.experts, name.n), format, Some(file)));
        let json: serde_json::Value = serde_json::from_str(text).unwrap();
        let tokens: Vec<usize> = t.buckets().iter().map(|b| b.0).collect();
        assert_eq!(tokens, (0..15).map(|i| 1usize << i).collect::<Vec<_>>(), "{file}: buckets");
        for (tokens, backend) in t.buckets() {
            let named = json[tokens.to_string()]["backend"].as_str().unwrap();
            assert!(backend.name().eq_ignore_ascii_case(named), "{file}: bucket {tokens}: {backend:?} vs {named}");
        }
        for &(_, other) in gpus.iter().filter(|g| g.1 != gpu) {
            let found = TunedBackends::shipped(other, format, name.experts, name.n);
            assert!(found.is_none_or(|o| o.shipped_file() != Some(file)), "{file} found for {other}");
        }
        let other_format = if format == WeightFormat::Dense { WeightFormat::Fp8Block } else { WeightFormat::Dense };
        let found = TunedBackends::shipped(gpu, other_format, name.experts, name.n);
        assert!(found.is_none_or(|o| o.shipped_file() != Some(file)), "{file} found for {other_format}");
        assert!(TunedBackends::shipped(gpu, format, name.experts, name.n + 128).is_none(), "{file}");
        assert!(TunedBackends::shipped(gpu, WeightFormat::Mxfp4, name.experts, name.n).is_none(), "{file}");
    }
    for (e, n) in suite {
        assert!(TunedBackends::shipped("NVIDIA H200", WeightFormat::Dense, e, n).is_some(), "H200 bf16 E={e} N={n}");
    }
}

/// Block-FP8 tables: the name says the format (vLLM's `dtype=fp8_w8a8,block_shape=[128, 128]`) and the table
/// keeps it; a bf16 table is not an FP8 one; formats no table is tuned for, and a bucket whose backend has no FP8
/// kernels, are refused by name; an FP8 entry names the FP8 blockwise GEMM's tile, not the bf16 GEMM's.
#[test]
fn fp8_tables_carry_their_format_and_refuse_what_fp8_does_not_run() {
    use moe_gemm::tuning::{table_format, LayerChoice};
    use moe_gemm::Backend::{Batched, Eager, Grouped};
    let name = ConfigName::for_table("NVIDIA H100 80GB HBM3", WeightFormat::Fp8Block, 256, 2048).unwrap();
    assert_eq!(
        name.to_string(),
        "E=256,N=2048,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128].json"
    );
    assert_eq!(ConfigName::parse(&name.to_string()).unwrap(), name);
    assert_eq!(table_format(&name).unwrap(), WeightFormat::Fp8Block);
    let text = r#"{"1": {"backend": "Batched"}, "64": {"backend": "Grouped"}}"#;
    let t = TunedBackends::from_json(&name, text).unwrap();
    assert_eq!(
        (t.format(), t.pick(2), t.pick(100), t.shipped_file()),
        (WeightFormat::Fp8Block, Batched, Grouped, None)
    );
    let bf16 = ConfigName::for_table("NVIDIA H200", WeightFormat::Dense, 256, 2048).unwrap();
    assert_eq!(TunedBackends::from_json(&bf16, text).unwrap().format(), WeightFormat::Dense);
    // vLLM's bf16 files carry no dtype.
    let plain = ConfigName::parse("E=8,N=14336,device_name=NVIDIA_H200.json").unwrap();
    assert_eq!(table_format(&plain).unwrap(), WeightFormat::Dense);
    for file in [
        "E=8,N=14336,device_name=NVIDIA_H200,dtype=fp8_w8a8.json",
        "E=8,N=14336,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[64, 128].json",
        "E=8,N=14336,device_name=NVIDIA_H200,dtype=int8_w8a16.json",
    ] {
        let err = table_format(&ConfigName::parse(file).unwrap()).unwrap_err().to_string();
        assert!(err.contains("dtype") && err.contains("block_shape"), "{file}: {err}");
    }
    let err = ConfigName::for_table("NVIDIA H200", WeightFormat::Mxfp4, 128, 2880).unwrap_err().to_string();
    assert!(err.contains("mxfp4"), "{err}");
    let eager = TunedBackends::from_json(&name, r#"{"1": {"backend": "Eager"}}"#).unwrap_err().to_string();
    assert!(eager.contains("bucket 1: eager") && eager.contains("fp8 block"), "{eager}");
    assert!(TunedBackends::new(256, 2048, &[(1, Eager)]).unwrap().with_format(WeightFormat::Fp8Block).is_err());
    assert!(TunedBackends::new(256, 2048, &[(1, Grouped)]).unwrap().with_format(WeightFormat::Fp8Channel).is_err());
    let entry = |fp8: bool| {
        LayerChoice {
            backend: Grouped,
            auto: Grouped,
            format: if fp8 { WeightFormat::Fp8Block } else { WeightFormat::Dense },
            experts: 256,
            hidden: 7168,
            inter: 2048,
            top_k: 8,
            tokens: 64,
            sm_count: 132,
            fused_tile: None,
            median_us: Some(1.0),
        }
        .entry()
    };
    assert!(entry(true)["w13"]["config"].as_str().unwrap().starts_with("fp8-"), "{}", entry(true));
    assert!(!entry(false)["w13"]["config"].as_str().unwrap().starts_with("fp8-"), "{}", entry(false));
}
