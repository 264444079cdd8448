//! The FP8 schemes a `config.json` declares, in both `quantization_config` forms vLLM serves (`quant_method:
//! "fp8"` and `"compressed-tensors"`): each declared scheme parses to its weight and activation scales, every
//! combination outside the table of `checkpoint::fp8_scheme` is an error naming its key, and `Fp8Config` (the
//! block scheme the layer runs) refuses the others by name instead of reading them as blocks.

use moe_gemm::checkpoint::{ActivationScales, Fp8Config, Fp8Scheme, SchemeSource, WeightScales};
use moe_gemm::quant::{BlockShape, ScaleFormat};
use moe_gemm::Error;

fn config(qc: &str) -> String {
    format!(r#"{{"architectures": ["MixtralForCausalLM"], "quantization_config": {qc}}}"#)
}

fn scheme(qc: &str) -> Fp8Scheme {
    Fp8Scheme::from_config_json(&config(qc)).unwrap_or_else(|e| panic!("{qc}: {e}")).expect("a scheme")
}

fn refusal(qc: &str) -> String {
    match Fp8Scheme::from_config_json(&config(qc)) {
        Err(Error::InvalidProblem(m)) => m,
        other => panic!("{qc}: expected InvalidProblem, got {other:?}"),
    }
}

/// The compressed-tensors form of one group: weights and input activations as llm-compressor writes them.
fn ct(weights: &str, activations: &str) -> String {
    format!(
        r#"{{"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head", "re:.*block_sparse_moe.gate"],
            "config_groups": {{"group_0": {{"targets": ["Linear"], "weights": {weights},
                                            "input_activations": {activations}}}}}}}"#
    )
}

const W_TENSOR: &str = r#"{"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": true, "dynamic": false}"#;
const W_CHANNEL: &str =
    r#"{"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true, "dynamic": false}"#;
const A_STATIC: &str = r#"{"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": true, "dynamic": false}"#;
const A_TOKEN: &str = r#"{"num_bits": 8, "type": "float", "strategy": "token", "symmetric": true, "dynamic": true}"#;

#[test]
fn the_fp8_form_declares_blocks_or_per_tensor_scales() {
    let block = scheme(r#"{"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}"#);
    assert_eq!(block.weights(), WeightScales::Block(BlockShape { rows: 128, cols: 128 }));
    assert_eq!(block.activations(), ActivationScales::DynamicGroup { cols: 128 });
    assert_eq!((block.scale_format(), block.source()), (ScaleFormat::F32, SchemeSource::Fp8));
    let v31 = scheme(r#"{"quant_method": "fp8", "weight_block_size": [128, 128], "scale_fmt": "ue8m0"}"#);
    assert_eq!(v31.scale_format(), ScaleFormat::Ue8m0);

    // vLLM's per-tensor FP8 (e.g. Mixtral-8x7B-Instruct FP8): no weight_block_size.
    let st = scheme(r#"{"quant_method": "fp8", "activation_scheme": "static"}"#);
    assert_eq!((st.weights(), st.activations()), (WeightScales::Tensor, ActivationScales::StaticTensor));
    let dy = scheme(r#"{"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": null}"#);
    assert_eq!((dy.weights(), dy.activations()), (WeightScales::Tensor, ActivationScales::DynamicTensor));
    assert_eq!(
        st.to_string(),
        "per-tensor weight scales, static per-tensor activation scales (input_scale) (quant_method fp8)"
    );
    assert_eq!(Fp8Scheme::from_config_json(r#"{"hidden_size": 8}"#).unwrap(), None);
}

#[test]
fn the_compressed_tensors_form_declares_tensor_channel_and_block_scales() {
    let s = scheme(&ct(W_TENSOR, A_STATIC));
    assert_eq!((s.weights(), s.activations()), (WeightScales::Tensor, ActivationScales::StaticTensor));
    assert_eq!(s.source(), SchemeSource::CompressedTensors);
    let dynamic_tensor = A_STATIC.replace(r#""dynamic": false"#, r#""dynamic": true"#);
    assert_eq!(scheme(&ct(W_TENSOR, &dynamic_tensor)).activations(), ActivationScales::DynamicTensor);
    // FP8-dynamic releases and Llama-4-style rowwise FP8: per-channel weights, per-token activations.
    let s = scheme(&ct(W_CHANNEL, A_TOKEN));
    assert_eq!((s.weights(), s.activations()), (WeightScales::Channel, ActivationScales::DynamicToken));
    assert_eq!(s.to_string(), "per-channel weight scales, dynamic per-token activation scales (compressed-tensors)");
    let s = scheme(&ct(W_CHANNEL, A_STATIC));
    assert_eq!(s.activations(), ActivationScales::StaticTensor);
    // Block weights with per-token groups of the block's columns (DeepSeek's recipe, written by llm-compressor).
    let wb = r#"{"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}"#;
    let ag = r#"{"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128, "dynamic": true}"#;
    let s = scheme(&ct(wb, ag));
    assert_eq!(s.weights(), WeightScales::Block(BlockShape { rows: 128, cols: 128 }));
    assert_eq!(s.activations(), ActivationScales::DynamicGroup { cols: 128 });
    // Two groups of one scheme (attention and experts listed apart) are one scheme.
    let two = format!(
        r#"{{"quant_method": "compressed-tensors", "config_groups": {{
            "group_0": {{"targets": ["Linear"], "weights": {W_CHANNEL}, "input_activations": {A_TOKEN}}},
            "group_1": {{"targets": ["MoE"], "weights": {W_CHANNEL}, "input_activations": {A_TOKEN}}}}}}}"#
    );
    assert_eq!(scheme(&two).weights(), WeightScales::Channel);
}

#[test]
fn schemes_outside_the_table_name_their_key() {
    let int8 = W_CHANNEL.replace(r#""type": "float""#, r#""type": "int""#);
    let four = W_CHANNEL.replace(r#""num_bits": 8"#, r#""num_bits": 4"#);
    let asym = W_CHANNEL.replace(r#""symmetric": true"#, r#""symmetric": false"#);
    let dyn_w = W_CHANNEL.replace(r#""dynamic": false"#, r#""dynamic": true"#);
    let group_w = W_CHANNEL.replace(r#""channel""#, r#""group""#);
    let static_token = A_TOKEN.replace(r#""dynamic": true"#, r#""dynamic": false"#);
    let no_size = r#"{"num_bits": 8, "type": "float", "strategy": "group", "dynamic": true}"#;
    let block_no_structure = r#"{"num_bits": 8, "type": "float", "strategy": "block"}"#;
    let block_w = r#"{"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}"#;
    let group_64 = r#"{"num_bits": 8, "type": "float", "strategy": "group", "group_size": 64, "dynamic": true}"#;
    let cases: Vec<(String, &str)> = vec![
        (ct(&int8, A_TOKEN), "config_groups.group_0.weights.type: \"int\": only \"float\""),
        (ct(&four, A_TOKEN), "config_groups.group_0.weights.num_bits: 4"),
        (ct(&asym, A_TOKEN), "weights.symmetric: false"),
        (ct(&dyn_w, A_TOKEN), "weights.dynamic: true"),
        (ct(&group_w, A_TOKEN), "weights.strategy: \"group\""),
        (ct(W_CHANNEL, &static_token), "strategy \"token\" with dynamic false"),
        (ct(W_CHANNEL, no_size), "input_activations.group_size: null"),
        (ct(block_no_structure, A_TOKEN), "weights.block_structure: missing"),
        // Block weights want activation groups of the block's columns; channel weights want no groups.
        (ct(block_w, A_TOKEN), "block weights take dynamic activation groups"),
        (ct(block_w, group_64), "block weights take dynamic activation groups"),
        (ct(W_CHANNEL, group_64), "per-tensor and per-channel weights take per-tensor or per-token"),
        (ct(W_CHANNEL, "null"), "input_activations: missing: weight-only FP8"),
        (ct(W_CHANNEL, A_TOKEN).replace("float-quantized", "pack-quantized"), "format: \"pack-quantized\""),
        (r#"{"quant_method": "compressed-tensors"}"#.into(), "config_groups"),
        (r#"{"quant_method": "compressed-tensors", "config_groups": {}}"#.into(), "config_groups"),
        (
            format!(
                r#"{{"quant_method": "compressed-tensors", "config_groups": {{
                    "a": {{"weights": {W_CHANNEL}, "input_activations": {A_TOKEN}}},
                    "b": {{"weights": {W_TENSOR}, "input_activations": {A_STATIC}}}}}}}"#
            ),
            "one FP8 scheme per checkpoint",
        ),
        (r#"{"quant_method": "fp8", "activation_scheme": "sometimes"}"#.into(), "activation_scheme: \"sometimes\""),
        (r#"{"quant_method": "fp8", "scale_fmt": "ue8m0"}"#.into(), "UE8M0 scales are read for block weights only"),
        (r#"{"quant_method": "awq"}"#.into(), "quant_method: \"awq\""),
    ];
    for (qc, want) in cases {
        let m = refusal(&qc);
        assert!(m.contains(want) && m.starts_with("config.json quantization_config"), "{qc}\n→ {m}\nwant {want}");
    }
}

/// The layer's block config refuses the other schemes by name instead of reading per-tensor scales as blocks.
#[test]
fn fp8_config_refuses_per_tensor_and_per_channel_schemes_by_name() {
    for (qc, named) in [
        (r#"{"quant_method": "fp8", "activation_scheme": "static"}"#.to_string(), "per-tensor weight scales, static"),
        (ct(W_CHANNEL, A_TOKEN), "per-channel weight scales, dynamic per-token"),
    ] {
        match Fp8Config::from_config_json(&config(&qc)) {
            Err(Error::InvalidProblem(m)) => assert!(m.contains(named) && m.contains("block-scaled"), "{m}"),
            other => panic!("{qc}: {other:?}"),
        }
    }
    // The compressed-tensors block scheme is the layer's block config, with the non-DeepSeek activation eps.
    let wb = r#"{"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}"#;
    let ag = r#"{"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128, "dynamic": true}"#;
    assert_eq!(Fp8Config::from_config_json(&config(&ct(wb, ag))).unwrap(), Some(Fp8Config::QWEN3));
}
