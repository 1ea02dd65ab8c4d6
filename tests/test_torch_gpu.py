"""cupyattn from PyTorch and foreign arrays through the core API.

Reference rule as elsewhere: |got - ref64| <= factor * |same-precision ref - ref64| + floor,
with SDPA's math backend in float64 as ref64 and in the input dtype as the
same-precision reference. Skipped without a GPU or without torch.
"""

import numpy as np
import pytest

from cupyattn import testing
from cupyattn.reference import logit_bound

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

import cupyattn.torch as ca_torch  # noqa: E402

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def _sdpa(q, k, v, is_causal, scale=None):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    group = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
    with sdpa_kernel(SDPBackend.MATH):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)


def _grads(fn, inputs, dout):
    inputs = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*inputs)
    out.backward(dout)
    return [out.detach()] + [x.grad for x in inputs]


def _check(name, got, ref64, ref_same, dtype, seqlen, factor, bound):
    cmp = testing.compare(
        got.double().cpu().numpy(),
        ref64.cpu().numpy(),
        ref_same.double().cpu().numpy(),
        str(dtype).replace("torch.", ""),
        seqlen,
        factor=factor,
        logit_bound=bound,
    )
    assert cmp.ok, f"{name}: {cmp}"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("shape", [(2, 4, 2, 77, 77, 64), (1, 6, 3, 40, 129, 128), (2, 2, 2, 1, 33, 32)])
def test_outputs_and_gradients_match_sdpa_math_in_float64(dtype, layout, shape):
    B, Hq, Hkv, Sq, Sk, D = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (
        torch.randn(s, device="cuda", generator=g)
        for s in ((B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D), (B, Hq, Sq, D))
    )
    causal = Sq <= Sk  # top_left with Sq > Sk would leave rows that see no key
    to = (lambda x: x.transpose(1, 2)) if layout == "bshd" else (lambda x: x)

    def ours(q_, k_, v_):
        return to(ca_torch.attention(to(q_), to(k_), to(v_), causal="top_left" if causal else False, layout=layout))

    low = [x.to(dtype) for x in (q, k, v)]
    got = _grads(ours, low, dout.to(dtype))
    same = _grads(lambda a, b, c: _sdpa(a, b, c, causal), low, dout.to(dtype))
    ref = _grads(
        lambda a, b, c: _sdpa(a, b, c, causal), [x.to(dtype).double() for x in (q, k, v)], dout.to(dtype).double()
    )
    bound = logit_bound(*(x.to(dtype).float().transpose(1, 2).cpu().numpy() for x in (q, k)))
    for name, a, r, s, factor in zip(("out", "dq", "dk", "dv"), got, ref, same, (2.0, 3.0, 3.0, 3.0)):
        assert a.dtype == dtype and a.shape == r.shape
        _check(name, a, r, s, dtype, max(Sq, Sk, D) * (Hq // Hkv), factor, bound)


def test_tensors_reach_the_kernels_without_a_copy_and_outputs_are_torch_memory():
    q, k, v = (torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    assert ca_torch._as_cupy(q).data.ptr == q.data_ptr()
    b = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
    assert ca_torch._as_cupy(b).data.ptr == b.data_ptr()
    before = torch.cuda.memory_allocated()
    out = ca_torch.attention(q, k, v)
    assert isinstance(out, torch.Tensor) and out.is_cuda
    assert torch.cuda.memory_allocated() - before >= out.numel() * out.element_size()  # torch's allocator


def test_runs_on_torchs_current_stream():
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = ca_torch.attention(q, k, v, causal=True)
        out.sum().backward()
    side.synchronize()
    ref = _sdpa(*(x.detach().double() for x in (q, k, v)), True)
    assert (out.double() - ref).abs().max().item() < 2e-2
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


def test_core_api_takes_torch_tensors_without_copies():
    import cupyattn

    q, k, v = (torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.empty_like(q)
    got = cupyattn.attention(q, k, v, out=out)
    assert got.data.ptr == out.data_ptr()  # written into the caller's tensor
    with pytest.raises(TypeError, match="q: could not view torch.Tensor as a GPU array without copying"):
        cupyattn.attention(q.cpu(), k, v)


class _Block(torch.nn.Module):
    """A pre-norm transformer block whose attention is SDPA or cupyattn."""

    def __init__(self, dim, heads, use_cupyattn):
        super().__init__()
        self.heads, self.use_cupyattn = heads, use_cupyattn
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        B, S, C = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, S, 3, self.heads, C // self.heads).unbind(2)
        if self.use_cupyattn:
            a = ca_torch.attention(q, k, v, causal="top_left", layout="bshd")
        else:
            a = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            ).transpose(1, 2)
        x = x + self.proj(a.reshape(B, S, C))
        return x + self.mlp(self.norm2(x))


@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-3), (torch.bfloat16, 3e-2)])
def test_a_transformer_block_trains_like_sdpa_for_20_steps(dtype, rtol):
    losses = {}
    for use in (False, True):
        torch.manual_seed(0)
        model = _Block(128, 4, use).cuda().to(dtype)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        g = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(8, 96, 128, device="cuda", generator=g).to(dtype)
        target = torch.randn(8, 96, 128, device="cuda", generator=g).to(dtype)
        curve = []
        for _ in range(20):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x).float(), target.float())
            loss.backward()
            opt.step()
            curve.append(loss.item())
        losses[use] = np.array(curve)
    assert losses[True][-1] < losses[True][0]  # it learns
    np.testing.assert_allclose(losses[True], losses[False], rtol=rtol)


@pytest.mark.parametrize("precision", ["tf32", ("bf16", "fp32")])
def test_precision_reaches_the_forward_and_the_backward(precision):
    import cupy

    import cupyattn

    gen = torch.Generator(device="cuda").manual_seed(8)
    q, k, v, dout = (torch.randn(1, 2, 70, 64, device="cuda", generator=gen) for _ in range(4))
    got = _grads(lambda a, b, c: ca_torch.attention(a, b, c, causal=True, precision=precision), (q, k, v), dout)
    cq, ck, cv, cdo = (cupy.from_dlpack(x) for x in (q, k, v, dout))
    out, lse = cupyattn.attention(cq, ck, cv, causal=True, layout="bhsd", precision=precision, return_lse=True)
    want = [
        out,
        *cupyattn.attention_backward(cdo, cq, ck, cv, out, lse, causal=True, layout="bhsd", precision=precision),
    ]
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        assert torch.equal(g, torch.from_dlpack(w)), name
    assert not torch.equal(got[0], ca_torch.attention(q, k, v, causal=True)), "the default mode's result"


def test_the_policy_reaches_the_forward_and_the_backward_planner():
    """A policy without any forward family fails the forward; one without any dK/dV tile
    lets the forward run and fails the backward: both passes plan with it."""
    from cupyattn.plan import PlanError, Policy

    q, k, v = (torch.randn(1, 2, 40, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    with pytest.raises(PlanError, match="no forward configuration fits"):
        ca_torch.attention(q, k, v, policy=Policy(families={"wgmma"}))  # wgmma runs float32 alone
    out = ca_torch.attention(
        q, k, v, policy=Policy(tiles={"bwd_dkdv_wgmma_half": (), "bwd_dkdv_mma": (), "bwd_dkdv_simt": ()})
    )
    with pytest.raises(PlanError, match="no backward dK/dV configuration fits"):
        out.sum().backward()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_the_operators_pass_opcheck(dtype):
    """torch.library.opcheck: schema, shape functions against the real outputs, autograd
    registration, and the operators' behaviour under torch's tracing modes."""
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v, dout = (
        torch.randn(s, device="cuda", generator=g).to(dtype)
        for s in ((2, 4, 70, 64),) + ((2, 2, 90, 64),) * 2 + ((2, 4, 70, 64),)
    )
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))
    options = ("top_left", None, "bhsd", None, None, True)
    torch.library.opcheck(torch.ops.cupyattn.attention.default, (q, k, v, *options))
    out, lse = torch.ops.cupyattn.attention(q.detach(), k.detach(), v.detach(), *options)
    args = (dout, *(x.detach() for x in (q, k, v)), out, lse, *options)
    torch.library.opcheck(torch.ops.cupyattn.attention_backward.default, args)


def test_torch_compile_fullgraph_gives_eagers_results_bit_for_bit():
    torch.manual_seed(0)
    model = _Block(128, 4, True).cuda().to(torch.bfloat16)
    x = torch.randn(2, 96, 128, device="cuda", dtype=torch.bfloat16)

    def step(m):
        m.zero_grad()
        out = m(x)
        out.float().square().mean().backward()
        return [out.detach()] + [p.grad.clone() for p in m.parameters()]

    eager = step(model)
    compiled = torch.compile(model, fullgraph=True)
    got = step(compiled)
    # (the compiled graph fuses the surrounding ops differently; the attention calls are the
    # same kernels, so only rounding elsewhere may differ)
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=lambda d: str(d).replace("torch.", ""))
def test_a_forward_and_backward_step_captures_into_a_cuda_graph(dtype):
    """After a first call (kernels compiled), forward + backward capture under
    torch.cuda.graph with no host synchronization and no allocation outside torch's
    allocator; replays on new inputs give eager's results bit for bit."""
    shapes = ((2, 4, 200, 64), (2, 2, 300, 64), (2, 2, 300, 64), (2, 4, 200, 64))
    static = [torch.randn(s, device="cuda", dtype=dtype) for s in shapes]
    q, k, v, dout = static
    for x in (q, k, v):
        x.requires_grad_(True)

    def step():
        for x in (q, k, v):
            x.grad = None
        out = ca_torch.attention(q, k, v, causal=True)
        out.backward(dout)
        return out, q.grad, k.grad, v.grad

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compiles every kernel of the step, off the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for seed in (5, 6):
        g = torch.Generator(device="cuda").manual_seed(seed)
        fresh = [torch.randn(s, device="cuda", generator=g).to(dtype) for s in shapes]
        with torch.no_grad():
            for x, y in zip(static, fresh):
                x.copy_(y)
        graph.replay()
        want = _grads(lambda a, b, c: ca_torch.attention(a, b, c, causal=True), fresh[:3], fresh[3])
        for name, a, b in zip(("out", "dq", "dk", "dv"), captured, want):
            assert torch.equal(a, b), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=lambda d: str(d).replace("torch.", ""))
def test_eager_calls_skip_the_operator_and_give_its_bits(dtype):
    """Eager calls go straight to the kernels (the operator's Python dispatch costs more host
    time than a small launch): out and gradients are the operator's bit for bit, and a
    repeated forward at other addresses repeats the remembered launch."""
    from cupyattn import api

    g = torch.Generator(device="cuda").manual_seed(13)
    shapes = ((2, 4, 200, 64), (2, 2, 333, 64), (2, 2, 333, 64), (2, 4, 200, 64))
    q, k, v, dout = (torch.randn(s, device="cuda", generator=g, dtype=dtype) for s in shapes)
    for x in (q, k, v):
        x.requires_grad_(True)
    through_op = torch.ops.cupyattn.attention(q, k, v, "top_left", None, "bhsd", None, None, True)[0]
    eager = ca_torch.attention(q, k, v, causal="top_left")
    assert type(eager.grad_fn).__name__ == "_EagerAttentionBackward"
    assert torch.equal(eager, through_op)
    grads = [torch.autograd.grad(out, (q, k, v), dout) for out in (eager, through_op)]
    for name, a, b in zip("qkv", *grads):
        assert torch.equal(a, b), f"d{name}"
    fresh = [x.detach().clone() for x in (q, k, v)]
    with torch.no_grad():
        again = ca_torch.attention(*fresh, causal="top_left")
    assert again.grad_fn is None and torch.equal(again, eager)
    if dtype != torch.float32:  # (float32 launches that read staged tiles are planned every call)
        options = dict(causal="top_left", scale=None, layout="bhsd", smem_limit=None, precision=None, policy=None)
        key = api.forward_key(*(ca_torch._describe(x) for x in fresh), None, None, **options)
        assert api.known_forward(key) is not None


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("batched", [True, False])
def test_the_sdpa_compatible_call_matches_sdpa(is_causal, batched):
    g = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(2, 8, 100, 64, device="cuda", generator=g, dtype=torch.float16)
    k, v = (torch.randn(2, 2, 130, 64, device="cuda", generator=g, dtype=torch.float16) for _ in range(2))
    if not batched:
        q, k, v = q[0], k[0], v[0]
    got = ca_torch.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=0.2, enable_gqa=True)
    want = torch.nn.functional.scaled_dot_product_attention(
        *(x.double() for x in (q, k, v)), is_causal=is_causal, scale=0.2, enable_gqa=True
    )
    assert got.shape == want.shape and got.dtype == torch.float16
    assert (got.double() - want).abs().max().item() < 5e-3


def test_deterministic_false_reaches_the_backward():
    """bfloat16 at head dim 64 on sm_90: deterministic=False plans the fused pass; its
    gradients agree with the deterministic ones to rounding."""
    g = torch.Generator(device="cuda").manual_seed(12)
    q, k, v, dout = (torch.randn(2, 4, 300, 64, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(4))
    det = _grads(lambda a, b, c: ca_torch.attention(a, b, c, causal=True), (q, k, v), dout)
    nondet = _grads(lambda a, b, c: ca_torch.attention(a, b, c, causal=True, deterministic=False), (q, k, v), dout)
    assert torch.equal(det[0], nondet[0])
    for name, a, b in zip(("dq", "dk", "dv"), det[1:], nondet[1:]):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2, msg=name)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-3), (torch.bfloat16, 5e-2)])
def test_a_transformers_llama_gives_sdpas_logits_and_gradients(dtype, tol):
    """A small random Llama (GQA 4/2 heads, no weights downloaded) with
    attn_implementation="cupyattn" against the same weights with "sdpa"."""
    pytest.importorskip("transformers")
    from test_torch_ops import _tiny_llama

    name = ca_torch.register_transformers()
    torch.manual_seed(0)
    ours = _tiny_llama(name, "cuda").to(dtype)
    sdpa = _tiny_llama("sdpa", "cuda").to(dtype)
    sdpa.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 100, (2, 96), device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    results = []
    for model in (ours, sdpa):
        out = model(ids, labels=ids)
        out.loss.backward()
        results.append([out.logits.detach().float()] + [p.grad.float() for p in model.parameters()])
    for i, (a, b) in enumerate(zip(*results)):
        err = (a - b).abs().max().item() / max(b.abs().max().item(), 1e-6)
        assert err < tol, f"tensor {i} (0: logits, then parameter gradients): relative error {err:.3g}"
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    with pytest.raises(NotImplementedError, match="attention_mask: cupyattn takes no padding masks"):
        ours(ids, attention_mask=mask)
    # Two documents a row; transformers looks for packing only without a KV cache (training).
    packed = torch.cat([torch.arange(40), torch.arange(56)]).to("cuda").expand(2, 96)
    with pytest.raises(NotImplementedError, match="attention_mask: cupyattn takes no padding masks"):
        ours(ids, position_ids=packed, use_cache=False)
