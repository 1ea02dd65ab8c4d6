"""cupyattn.torch's custom operators without a GPU: their shape functions, autograd formula
and graph capture, traced on meta tensors; the SDPA-compatible call's argument checks.
Skipped without torch (the GPU runs are in test_torch_gpu.py)."""

import pytest

torch = pytest.importorskip("torch")

import cupyattn.torch as ct  # noqa: E402
from cupyattn.plan import Policy  # noqa: E402


def _meta(*shape, dtype=torch.bfloat16, grad=False):
    return torch.empty(shape, device="meta", dtype=dtype, requires_grad=grad)


def test_operators_are_registered_with_their_schemas():
    fwd = str(torch.ops.cupyattn.attention.default._schema)
    bwd = str(torch.ops.cupyattn.attention_backward.default._schema)
    assert fwd.startswith("cupyattn::attention(Tensor q, Tensor k, Tensor v, str causal, float? scale, str layout")
    assert fwd.endswith("bool deterministic) -> (Tensor, Tensor)")
    assert bwd.startswith("cupyattn::attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out")
    assert bwd.endswith("-> (Tensor, Tensor, Tensor)")


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_shape_functions_give_out_and_lse_as_the_kernels_do(layout):
    B, Hq, Hkv, Sq, Sk, D, Dv = 2, 8, 2, 100, 130, 64, 48
    seq_head = (lambda s, h: (h, s)) if layout == "bhsd" else (lambda s, h: (s, h))
    q, k, v = (_meta(B, *seq_head(s, h), d) for s, h, d in ((Sq, Hq, D), (Sk, Hkv, D), (Sk, Hkv, Dv)))
    out, lse = torch.ops.cupyattn.attention(q, k, v, "top_left", None, layout, None, None, True)
    assert out.shape == (B, *seq_head(Sq, Hq), Dv) and out.dtype == torch.bfloat16
    assert lse.shape == (B, Hq, Sq) and lse.dtype == torch.float32
    grads = torch.ops.cupyattn.attention_backward(out, q, k, v, out, lse, "none", 0.5, layout, None, None, False)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


def test_autograd_runs_the_backward_operator_with_the_forwards_options():
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(q, k, v):
        out = ct.attention(q, k, v, causal="top_left", scale=0.25, deterministic=False)
        return torch.autograd.grad(out.float().square().sum(), (q, k, v))

    q, k, v = _meta(2, 4, 40, 64, grad=True), _meta(2, 2, 70, 64, grad=True), _meta(2, 2, 70, 32, grad=True)
    assert [g.shape for g in step(q, k, v)] == [q.shape, k.shape, v.shape]
    graph = make_fx(step)(q, k, v).graph
    calls = [n for n in graph.nodes if str(n.target).startswith("cupyattn.")]
    assert [str(n.target) for n in calls] == ["cupyattn.attention.default", "cupyattn.attention_backward.default"]
    assert calls[0].args[3:] == ("top_left", 0.25, "bhsd", None, None, False)
    assert calls[1].args[6:] == ("top_left", 0.25, "bhsd", None, None, False)


def test_torch_compile_keeps_both_calls_in_one_graph():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def block(x, wq, wk, wv):
        B, S, _ = x.shape
        q, k, v = ((x @ w).view(B, S, 4, 16).transpose(1, 2) for w in (wq, wk, wv))
        a = ct.attention(q, k, v, causal=True)
        b = ct.scaled_dot_product_attention(q, k, v, is_causal=True)
        return (a + b).transpose(1, 2).reshape(B, S, 64)

    x = _meta(2, 33, 64)
    weights = [_meta(64, 64) for _ in range(3)]
    out = torch.compile(block, backend=backend, fullgraph=True)(x, *weights)
    assert out.shape == (2, 33, 64) and len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes]
    assert sum("cupyattn.attention" in t for t in targets) == 2


def test_traced_calls_raise_the_errors_of_a_call_that_runs():
    """Meta / fake tensors (torch.compile, make_fx) meet cupyattn's checks of q, k, v and of the
    backward's dout, out and lse, with the messages a call that runs gives."""
    q, kv = _meta(2, 4, 40, 64), _meta(2, 2, 70, 64)
    args = ("none", None, "bhsd", None, None, True)
    for (q_, k_, v_), exc, match in [
        ((q, _meta(2, 2, 70, 32), kv), ValueError, r"^k: expected head_dim 64 \(the head_dim of q\), got 32$"),
        ((q, _meta(2, 3, 70, 64), _meta(2, 3, 70, 64)), ValueError, "divides the 4 heads of q, got 3$"),
        ((q, kv, _meta(2, 2, 71, 64)), ValueError, "^k, v: expected the same seqlen and heads"),
        ((q, kv, kv.half()), TypeError, r"^v: expected dtype bfloat16 \(the dtype of q\), got float16$"),
        ((q.double(), kv.double(), kv.double()), TypeError, "^q: expected dtype float16, bfloat16 or float32"),
    ]:
        with pytest.raises(exc, match=match):
            torch.ops.cupyattn.attention(q_, k_, v_, *args)
    with pytest.raises(ValueError, match="^causal: expected the operators' 'none', 'bottom_right' or 'top_left'"):
        torch.ops.cupyattn.attention(q, kv, kv, "diagonal", *args[1:])
    out, lse = torch.ops.cupyattn.attention(q, kv, kv, *args)
    backward = torch.ops.cupyattn.attention_backward
    with pytest.raises(ValueError, match=r"^dout: expected shape \(2, 4, 40, 64\), got \(2, 4, 41, 64\)$"):
        backward(_meta(2, 4, 41, 64), q, kv, kv, out, lse, *args)
    with pytest.raises(TypeError, match="^out: expected dtype bfloat16, got float32$"):
        backward(out, q, kv, kv, out.float(), lse, *args)
    with pytest.raises(ValueError, match=r"^lse: expected shape \(2, 4, 40\), got \(2, 40, 4\)$"):
        backward(out, q, kv, kv, out, lse.transpose(1, 2), *args)


def test_torch_compile_with_dynamic_sizes_specializes_on_none():
    """The traced checks leave symbolic sizes unread: one graph serves two sequence lengths."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    call = torch.compile(lambda q, k, v: ct.attention(q, k, v, causal=True), backend=backend, dynamic=True)
    for S in (40, 57):
        q, kv = _meta(2, 4, S, 64), _meta(2, 2, S + 3, 64)
        assert call(q, kv, kv).shape == q.shape
    assert len(graphs) == 1


def test_options_travel_as_strings_and_come_back():
    assert [ct._causal_name(c) for c in (False, True, "bottom_right", "top_left")] == [
        "none",
        "bottom_right",
        "bottom_right",
        "top_left",
    ]
    assert [ct._CAUSAL[ct._causal_name(c)] for c in (False, None, True, "top_left")] == [False, False, True, "top_left"]
    for precision in (None, "tf32", ("fp32", "bf16")):
        assert ct._precision(ct._precision_name(precision)) == precision
    policy = Policy(families={"mma", "simt"})
    name = ct._policy_name(policy)
    assert ct._POLICIES[name] is policy and ct._policy_name(Policy(families={"simt", "mma"})) == name
    assert ct._policy_name(None) is None and ct._policy(None) is None and ct._policy(name) is policy
    with pytest.raises(ValueError, match="policy: 'f00' names no policy given to cupyattn.torch"):
        ct._policy("f00")


def test_backward_shape_function_gives_the_gradients_strides():
    # a view whose last dimension is not contiguous is copied first: its gradient is dense
    q = _meta(2, 64, 4, 16).transpose(1, 3)  # (2, 16, 4, 64), stride(-1) != 1
    out, lse = torch.ops.cupyattn.attention(q, q, q, "none", None, "bhsd", None, None, True)
    dq, _, _ = torch.ops.cupyattn.attention_backward(out, q, q, q, out, lse, "none", None, "bhsd", None, None, True)
    assert dq.stride() == ct._rows_contiguous(q).stride() and dq.stride(-1) == 1


def test_bad_options_are_refused_before_any_launch():
    q = _meta(1, 2, 16, 64)
    for kwargs, exc, match in [
        (dict(causal="diagonal"), ValueError, "causal: expected False, True, 'top_left' or 'bottom_right'"),
        (dict(precision=[]), ValueError, "precision: expected None, a mode name or a sequence"),
        (dict(precision=5), ValueError, "precision: expected None, a mode name or a sequence"),
        (dict(policy="mma"), TypeError, "policy: expected a cupyattn.plan.Policy or None, got str"),
        (dict(layout="sbhd"), ValueError, "layout: expected 'bhsd' or 'bshd', got 'sbhd'"),
        (dict(deterministic=1), TypeError, "deterministic: expected True or False, got 1"),
    ]:
        with pytest.raises(exc, match=match):
            ct.attention(q, q, q, **kwargs)
    with pytest.raises(ValueError, match="q: expected a CUDA tensor, got one on cpu"):
        ct.attention(torch.zeros(1, 2, 16, 64), q, q)


def test_sdpa_call_takes_sdpa_layouts_and_refuses_what_it_cannot_do():
    q, kv = _meta(3, 8, 20, 64), _meta(3, 2, 30, 64)
    assert ct.scaled_dot_product_attention(q, kv, kv, enable_gqa=True).shape == (3, 8, 20, 64)
    assert ct.scaled_dot_product_attention(q[0], kv[0], _meta(2, 30, 16), enable_gqa=True).shape == (8, 20, 16)
    with pytest.raises(ValueError, match="key: expected query's 8 heads \\(or enable_gqa=True"):
        ct.scaled_dot_product_attention(q, kv, kv)
    with pytest.raises(NotImplementedError, match="attn_mask: cupyattn takes no attention masks"):
        ct.scaled_dot_product_attention(q, q, q, attn_mask=_meta(20, 20, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="dropout_p: cupyattn has no dropout; expected 0.0, got 0.1"):
        ct.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="query, key, value: expected all \\(B, H, L, E\\) or all \\(H, L, E\\)"):
        ct.scaled_dot_product_attention(q, q[0], q)
    # The tensors' own errors name SDPA's arguments.
    with pytest.raises(ValueError, match="query: expected a CUDA tensor, got one on cpu"):
        ct.scaled_dot_product_attention(torch.zeros(3, 8, 20, 64), kv, kv, enable_gqa=True)
    with pytest.raises(TypeError, match="key: expected dtype float16, bfloat16 or float32, got torch.float64"):
        ct.scaled_dot_product_attention(q, _meta(3, 2, 30, 64, dtype=torch.float64), kv, enable_gqa=True)
    with pytest.raises(TypeError, match="value: expected a torch.Tensor, got builtins.list"):
        ct.scaled_dot_product_attention(q, kv, [kv], enable_gqa=True)


def _tiny_llama(attn_implementation, device):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=100,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    config._attn_implementation = attn_implementation
    with torch.device(device):
        return LlamaForCausalLM(config)


def test_transformers_models_call_cupyattn_once_registered():
    pytest.importorskip("transformers")
    from torch.fx.experimental.proxy_tensor import make_fx
    from transformers import AttentionInterface

    name = ct.register_transformers()
    assert name == "cupyattn" and AttentionInterface._global_mapping[name] is ct.transformers_attention
    model = _tiny_llama(name, "meta")
    ids = torch.zeros(2, 33, dtype=torch.long, device="meta")
    graph = make_fx(lambda x: model(x).logits)(ids).graph
    calls = [n for n in graph.nodes if str(n.target) == "cupyattn.attention.default"]
    assert len(calls) == 2 and calls[0].args[3] == "bottom_right"  # a layer each, causal
    assert calls[0].meta["val"][0].shape == (2, 4, 33, 32)  # GQA 4/2 heads: no repeated keys


def test_transformers_attention_refuses_masks_windows_and_dropout():
    q, kv = _meta(1, 4, 8, 32), _meta(1, 2, 8, 32)
    module = torch.nn.Module()
    with pytest.raises(NotImplementedError, match="attention_mask: cupyattn takes no padding masks"):
        ct.transformers_attention(module, q, kv, kv, _meta(1, 8, dtype=torch.bool))
    for name in ("sliding_window", "softcap", "cu_seq_lens_q"):
        with pytest.raises(NotImplementedError, match=f"{name}: cupyattn takes none"):
            ct.transformers_attention(module, q, kv, kv, None, **{name: 4})
    with pytest.raises(NotImplementedError, match="dropout: cupyattn has no dropout"):
        ct.transformers_attention(module, q, kv, kv, None, dropout=0.1)
    out, weights = ct.transformers_attention(module, q, kv, kv, None, scaling=0.5)
    assert out.shape == (1, 8, 4, 32) and weights is None
