"""moe-gemm's MoE layer as a PyTorch op, with the signature and semantics of vLLM's ``fused_experts``.

    from moe_gemm_torch import fused_experts
    y = fused_experts(x, w1, w2, topk_weights, topk_ids)                        # bf16
    y = fused_experts(x, w1q, w2q, topk_weights, topk_ids, use_fp8_w8a8=True,   # block FP8
                      w1_scale=s1, w2_scale=s2, block_shape=[128, 128])

``x [T, H]`` bf16; ``w1 [E, 2I, H]`` (gate rows, then up rows) and ``w2 [E, H, I]``, bf16 or float8_e4m3fn with
float32 scales per 128 x 128 block (``w1_scale [E, 2I/128, H/128]``, ``w2_scale [E, H/128, I/128]``);
``topk_weights`` float32 and ``topk_ids`` int32 ``[T, k]``. SiLU(gate) * up, each slot's output scaled by its
weight, summed per token. The call runs on torch's current stream: no copy of the inputs, no host
synchronisation, capturable by ``torch.cuda.graph``. The first call for a set of weights (or a batch larger than
any before) plans the layer and sizes the scratch of the stream, which allocates: do it before capturing, as
vLLM's own warm-up does. Every tensor is checked before anything is queued; a wrong dtype, device, shape or
layout raises ``TypeError`` / ``ValueError`` naming the argument.
"""

import torch

from . import _native

__all__ = ["fused_experts", "fused_topk", "grouped_topk", "check_device_status", "plan_for"]

# Plans by weights (device, addresses, shapes, kind), scratches by (device, stream). A plan holds no copy of the
# weights, only their addresses: keep the weight tensors alive (a model's parameters are) while it is used.
_plans = {}
_scratches = {}
_routers = {}

_UNSUPPORTED = {
    "use_int8_w8a8": False, "use_int8_w8a16": False, "use_int4_w4a16": False, "use_mxfp4_w4a4": False,
    "per_channel_quant": False, "apply_router_weight_on_input": False, "expert_map": None, "w1_zp": None,
    "w2_zp": None, "a1_scale": None, "a2_scale": None, "w1_bias": None, "w2_bias": None,
}


def _check(name, t, dtype, shape, device=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be on a CUDA device, got {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, hidden_states on {device}")
    if tuple(t.shape) != tuple(shape):
        want = "[" + ", ".join(str(s) for s in shape) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (strides {t.stride()})")


def _max_tokens(tokens):
    # Plans grow in powers of two from 256, so that a server's batches settle on a few plans.
    m = 256
    while m < tokens:
        m *= 2
    return m


def plan_for(w1, w2, top_k, tokens, w1_scale=None, w2_scale=None, stream=None):
    """The layer's plan for these weights with room for ``tokens``, and the scratch of the stream (made or grown
    here if needed). Call it before ``torch.cuda.graph`` capture for the largest batch the graph will see."""
    kind = "fp8" if w1.dtype == torch.float8_e4m3fn else "bf16"
    e, n13, h = w1.shape
    i = w2.shape[2]
    dev = w1.device
    stream = stream if stream is not None else torch.cuda.current_stream(dev)
    key = (dev.index, kind, w1.data_ptr(), w2.data_ptr(), e, n13, h, i, top_k,
           w1_scale.data_ptr() if w1_scale is not None else 0, w2_scale.data_ptr() if w2_scale is not None else 0)
    layer = _plans.get(key)
    if layer is None or layer.max_tokens < tokens:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"moe_gemm_torch: no plan for {tokens} tokens of these weights while a CUDA graph "
                               "is being captured: call fused_experts (or plan_for) with the largest batch first")
        layer = _native.Layer(dev.index, stream.cuda_stream, kind, e, h, i, top_k, _max_tokens(tokens),
                              w1.data_ptr(), w2.data_ptr(),
                              w1_scale.data_ptr() if w1_scale is not None else 0,
                              w2_scale.data_ptr() if w2_scale is not None else 0)
        _plans[key] = layer
    skey = (dev.index, stream.cuda_stream)
    scratch = _scratches.get(skey)
    if scratch is None or not scratch.covers(layer):
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("moe_gemm_torch: the stream's scratch must grow while a CUDA graph is being "
                               "captured: call fused_experts (or plan_for) with the largest batch first")
        scratch = _native.Scratch(layer, stream.cuda_stream, scratch)
        _scratches[skey] = scratch
    return layer, scratch


def fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, inplace=False, activation="silu",
                  use_fp8_w8a8=False, global_num_experts=-1, w1_scale=None, w2_scale=None, block_shape=None,
                  **kwargs):
    """vLLM's ``fused_experts`` for bf16 and block FP8 (see the module's docs). Arguments of vLLM's signature
    that select something else (int8/int4/mxfp4 weights, an expert map, static activation scales, biases,
    zero points, the router weight applied on the input) raise ``NotImplementedError`` naming them."""
    for name, value in kwargs.items():
        if name not in _UNSUPPORTED:
            raise TypeError(f"fused_experts() got an unexpected keyword argument {name!r}")
        if value is not None and value is not False:
            raise NotImplementedError(f"moe_gemm_torch.fused_experts: {name}={value!r} is not supported "
                                      "(bf16 and block FP8 with dynamic per-token-group activation scales only)")
    if activation != "silu":
        raise NotImplementedError(f"moe_gemm_torch.fused_experts: activation={activation!r} (only 'silu')")
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 2:
        raise ValueError("hidden_states must be a 2-D torch.Tensor [T, H]")
    dev = hidden_states.device
    t, h = hidden_states.shape
    if not isinstance(w1, torch.Tensor) or w1.dim() != 3 or not isinstance(w2, torch.Tensor) or w2.dim() != 3:
        raise ValueError("w1 and w2 must be 3-D tensors [E, 2I, H] and [E, H, I]")
    e, n13, _ = w1.shape
    if n13 % 2:
        raise ValueError(f"w1 must be [E, 2I, H] (gate rows, then up rows): its dim 1 is {n13}, odd")
    i = n13 // 2
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dim() != 2:
        raise ValueError("topk_ids must be a 2-D torch.Tensor [T, k]")
    k = topk_ids.shape[1]
    if global_num_experts not in (-1, e):
        raise NotImplementedError(f"global_num_experts={global_num_experts} with {e} local experts "
                                  "(expert parallelism) is not supported")
    _check("hidden_states", hidden_states, torch.bfloat16, (t, h))
    wdtype = torch.float8_e4m3fn if use_fp8_w8a8 else torch.bfloat16
    _check("w1", w1, wdtype, (e, 2 * i, h), dev)
    _check("w2", w2, wdtype, (e, h, i), dev)
    _check("topk_ids", topk_ids, torch.int32, (t, k), dev)
    _check("topk_weights", topk_weights, torch.float32, (t, k), dev)
    if use_fp8_w8a8:
        if block_shape is None or list(block_shape) != [128, 128]:
            raise NotImplementedError(f"use_fp8_w8a8 with block_shape={block_shape!r}: only [128, 128] "
                                      "(DeepSeek-V3's blocks) is supported")
        if h % 128 or i % 128:
            raise ValueError(f"block FP8 needs H and I multiples of 128, got H = {h}, I = {i}")
        if w1_scale is None or w2_scale is None:
            raise ValueError("use_fp8_w8a8=True needs w1_scale and w2_scale")
        _check("w1_scale", w1_scale, torch.float32, (e, 2 * i // 128, h // 128), dev)
        _check("w2_scale", w2_scale, torch.float32, (e, h // 128, i // 128), dev)
    elif w1_scale is not None or w2_scale is not None or block_shape is not None:
        raise ValueError("w1_scale, w2_scale and block_shape are for use_fp8_w8a8=True")
    out = torch.empty_like(hidden_states)
    if t == 0:
        return hidden_states if inplace else out
    stream = torch.cuda.current_stream(dev)
    with torch.cuda.device(dev):
        layer, scratch = plan_for(w1, w2, k, t, w1_scale, w2_scale, stream)
        layer.forward(scratch, t, hidden_states.data_ptr(), topk_ids.data_ptr(), topk_weights.data_ptr(),
                      out.data_ptr())
    if inplace:
        hidden_states.copy_(out)
        return hidden_states
    return out


def _route(kind, gating_output, topk, renormalize, bias=None, n_group=1, topk_group=1, scaling=1.0):
    if not isinstance(gating_output, torch.Tensor) or gating_output.dim() != 2:
        raise ValueError("gating_output must be a 2-D torch.Tensor [T, E]")
    t, e = gating_output.shape
    dev = gating_output.device
    _check("gating_output", gating_output, torch.float32, (t, e))
    if bias is not None:
        _check("e_score_correction_bias", bias, torch.float32, (e,), dev)
    topk_weights = torch.empty(t, topk, dtype=torch.float32, device=dev)
    topk_ids = torch.empty(t, topk, dtype=torch.int32, device=dev)
    if t == 0:
        return topk_weights, topk_ids
    stream = torch.cuda.current_stream(dev)
    key = (dev.index, kind, e, topk, bool(renormalize), n_group, topk_group, float(scaling))
    with torch.cuda.device(dev):
        router = _routers.get(key)
        if router is None:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("moe_gemm_torch: no router of this configuration while a CUDA graph is being "
                                   "captured: route once before capturing")
            router = _native.Router(dev.index, stream.cuda_stream, kind, e, topk, bool(renormalize), n_group,
                                    topk_group, float(scaling))
            _routers[key] = router
        router.route(stream.cuda_stream, t, gating_output.data_ptr(), 0 if bias is None else bias.data_ptr(),
                     topk_ids.data_ptr(), topk_weights.data_ptr())
    return topk_weights, topk_ids


def fused_topk(hidden_states, gating_output, topk, renormalize, indices_type=None):
    """vLLM's ``fused_topk``: softmax over the experts, the ``topk`` largest, renormalised to sum to 1 if
    ``renormalize``; returns ``(topk_weights float32 [T, k], topk_ids int32 [T, k])``. ``gating_output`` must be
    float32 ``[T, E]`` (``E <= 1024``, ``k <= 32``); ``hidden_states`` is not read (vLLM's signature)."""
    if indices_type not in (None, torch.int32):
        raise NotImplementedError(f"moe_gemm_torch.fused_topk: indices_type={indices_type} (int32 ids only)")
    return _route("softmax", gating_output, topk, renormalize)


def grouped_topk(hidden_states, gating_output, topk, renormalize, num_expert_group=0, topk_group=0,
                 scoring_func="softmax", routed_scaling_factor=1.0, e_score_correction_bias=None):
    """vLLM's ``grouped_topk`` with ``scoring_func="sigmoid"`` (DeepSeek-V3, Kimi-K2): sigmoid scores, the
    correction bias for the choice only, ``num_expert_group`` groups of which the ``topk_group`` best (by the sum
    of their two best biased scores) are kept, ``topk`` of their experts, weights from the unbiased scores,
    renormalised if ``renormalize``, times ``routed_scaling_factor``. ``gating_output`` and
    ``e_score_correction_bias`` float32."""
    if scoring_func != "sigmoid":
        raise NotImplementedError(f"moe_gemm_torch.grouped_topk: scoring_func={scoring_func!r} (only 'sigmoid', "
                                  "DeepSeek-V3's grouped router)")
    if e_score_correction_bias is None:
        raise ValueError("grouped_topk with scoring_func='sigmoid' needs e_score_correction_bias [E] (float32)")
    return _route("grouped_sigmoid", gating_output, topk, renormalize, e_score_correction_bias,
                  num_expert_group, topk_group, routed_scaling_factor)


def check_device_status(device=None):
    """Reads the device status word of every scratch and router on ``device`` (synchronises their streams): a
    ``RuntimeError`` naming what the kernels found (an expert id out of range, clamped; non-finite router logits)
    since the last check."""
    dev = torch.device("cuda", torch.cuda.current_device() if device is None else torch.device(device).index)
    for (index, _), scratch in list(_scratches.items()):
        if index == dev.index:
            scratch.check()
    for key, router in list(_routers.items()):
        if key[0] == dev.index:
            router.check()
