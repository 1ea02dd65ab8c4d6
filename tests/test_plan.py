"""Planning on named devices: every head dim x dtype x causal fits, layouts add up."""

import pytest

from cupyattn.device import NAMED_DEVICES, named_device, smem_limit_from_env
from cupyattn.layout import align
from cupyattn.plan import (
    FAMILIES,
    FWD_MMA_TILES,
    MAX_ACCUMULATORS_PER_LANE,
    AttentionProblem,
    FwdSimtConfig,
    FwdWgmmaConfig,
    MmaConfig,
    PlanError,
    Policy,
    blocks_per_sm,
    plan_backward,
    plan_forward,
)

DTYPES = ("float16", "bfloat16", "float32")


def test_named_devices_have_the_documented_limits():
    expect = {
        "v100": ((7, 0), 98304),
        "t4": ((7, 5), 65536),
        "a100": ((8, 0), 166912),
        "rtx3090": ((8, 6), 101376),
        "rtx4090": ((8, 9), 101376),
        "l4": ((8, 9), 101376),
        "rtx6000ada": ((8, 9), 101376),
        "h100": ((9, 0), 232448),
        "h200": ((9, 0), 232448),
        "b200": ((10, 0), 232448),
        "rtx5090": ((12, 0), 101376),
    }
    for name, (cc, optin) in expect.items():
        spec = named_device(name)
        assert spec.compute_capability == cc and spec.smem_per_block_optin == optin, name
        assert spec.smem_per_block == 49152
        assert spec.smem_per_sm >= spec.smem_per_block_optin
    assert named_device("sm_89") is NAMED_DEVICES["rtx6000ada"]
    assert named_device("RTX-6000-Ada") is NAMED_DEVICES["rtx6000ada"]
    with pytest.raises(ValueError, match="unknown device name 'gtx480'"):
        named_device("gtx480")


@pytest.mark.parametrize("device", sorted(NAMED_DEVICES))
def test_every_head_dim_dtype_and_causal_has_a_fitting_forward_plan(device):
    spec = named_device(device)
    for dtype in DTYPES:
        for d in range(1, 257):
            for causal in (False, True):
                plan = plan_forward(AttentionProblem(dtype, d, d, causal), spec)
                assert plan.smem_bytes <= spec.smem_per_block_optin
                assert plan.config.head_dim_pad >= d and plan.config.head_dim_pad % 8 == 0
                assert plan.blocks_per_sm_by_smem >= 1


@pytest.mark.parametrize("limit", [101376, 65536, 49152])
def test_smem_limit_plans_as_if_the_device_were_smaller(limit):
    spec = named_device("h200").with_smem_limit(limit)
    assert spec.smem_per_block_optin == limit
    for dtype in DTYPES:
        for d in (64, 128, 200, 256):
            plan = plan_forward(AttentionProblem(dtype, d, d, True), spec)
            assert plan.smem_bytes <= limit


def test_float32_head_dim_128_on_rtx6000ada_opts_in_past_48k():
    # Past the 48 KiB default: the tiles that the opt-in limit allows.
    plan = plan_forward(AttentionProblem("float32", 128, 128, True, 4, 4, 4, 4096, 4096), named_device("rtx6000ada"))
    assert 49152 < plan.smem_bytes <= 101376
    assert isinstance(plan.config, MmaConfig) and plan.precision == "fp32"  # 3xTF32 on sm_89
    assert (plan.config.block_m, plan.config.block_n) == (64, 32)
    # Sized for the 48 KiB default instead, the tiles would have to shrink.
    small = plan_forward(plan.problem, named_device("rtx6000ada").with_smem_limit(49152))
    assert small.smem_bytes <= 49152 and small.rejected


def test_layout_buffers_are_ordered_aligned_and_sum_to_total():
    cfg = FwdSimtConfig("float16", 40, 24, 32, 64, 4, True)
    lay = cfg.layout
    assert [b.name for b in lay] == ["q_tile", "k_tile", "v_tile"]
    assert lay["q_tile"].bytes == 32 * 40 * 2
    assert lay["k_tile"].shape == (64, 42)  # one 4-byte word (2 halves) of padding per row
    assert lay["v_tile"].bytes == 64 * 24 * 2
    end = 0
    for buf in lay:
        assert buf.offset == align(end) and buf.offset % 16 == 0
        end = buf.end
    assert lay.total == end
    assert "k_tile" in lay.table() and str(lay.total) in lay.table()


def test_name_expression_is_the_template_instantiation():
    cfg = FwdSimtConfig("bfloat16", 128, 64, 64, 32, 8, False)
    assert cfg.name_expression == "cupyattn::attn_fwd_simt<__nv_bfloat16, 128, 64, 64, 32, 8, false>"


def test_no_fit_error_lists_every_candidate_and_the_limit():
    spec = named_device("t4").with_smem_limit(4096)
    with pytest.raises(PlanError) as info:
        plan_forward(AttentionProblem("float32", 256, 256, False), spec)
    msg = str(info.value)
    assert "4096" in msg and "float32 head_dim=256" in msg
    assert msg.count("cupyattn::attn_fwd_simt<") >= 4
    for line in msg.splitlines()[1:]:
        assert line.strip().endswith("bytes")


def test_short_queries_get_short_tiles_and_small_grids_more_blocks():
    for dtype, device in (("float16", "h100"), ("float32", "h100"), ("float32", "v100")):  # mma and SIMT
        spec = named_device(device)
        simt = device == "v100"
        decode = plan_forward(AttentionProblem(dtype, 128, 128, False, 1, 8, 1, 1, 4096), spec)
        assert decode.config.block_m == (8 if simt else 16)
        big = plan_forward(AttentionProblem(dtype, 128, 128, False, 8, 16, 16, 8192, 8192), spec)
        assert big.config.block_m == (64 if simt else 128)
        small = plan_forward(AttentionProblem(dtype, 64, 64, False, 1, 2, 2, 512, 512), spec)
        assert small.config.block_m < big.config.block_m  # big tiles would leave most SMs idle


def test_blocks_per_sm_counts_reserved_shared_memory():
    spec = named_device("a100")
    assert blocks_per_sm(82944, 128, spec) == 2  # 2 x (82944 + 1024) = 167936
    assert blocks_per_sm(82945, 128, spec) == 1


def test_smem_limit_env_parsing(monkeypatch):
    monkeypatch.setenv("CUPYATTN_SMEM_LIMIT", "99K")
    assert smem_limit_from_env() == 101376
    monkeypatch.setenv("CUPYATTN_SMEM_LIMIT", "65536")
    assert smem_limit_from_env() == 65536
    monkeypatch.setenv("CUPYATTN_SMEM_LIMIT", "lots")
    with pytest.raises(ValueError, match="CUPYATTN_SMEM_LIMIT"):
        smem_limit_from_env()


def test_problem_validation():
    with pytest.raises(ValueError, match="head_dim: expected 1..256, got 257"):
        AttentionProblem("float16", 257, 257, False)
    with pytest.raises(ValueError, match="dtype"):
        AttentionProblem("float64", 64, 64, False)


@pytest.mark.parametrize("device", sorted(NAMED_DEVICES))
def test_every_head_dim_dtype_and_causal_has_a_fitting_backward_plan(device):
    """Planned on its own: float32 at head dim 256 fits 101376- and 65536-byte GPUs too."""
    from cupyattn.plan import plan_backward

    spec = named_device(device)
    for dtype in DTYPES:
        for d in range(1, 257):
            for causal in (False, True):
                bplan = plan_backward(AttentionProblem(dtype, d, d, causal), spec)
                for plan in bplan.plans:
                    assert plan.smem_bytes <= spec.smem_per_block_optin
                    if isinstance(plan.config, MmaConfig):
                        assert plan.config.fits_registers(spec.compute_capability)
                    else:
                        assert plan.config.accumulators_per_lane <= MAX_ACCUMULATORS_PER_LANE
                    assert getattr(plan.config, "valid", True)


def test_backward_is_planned_apart_from_the_forward():
    from cupyattn.plan import plan_backward

    problem = AttentionProblem("float32", 128, 128, True, 4, 4, 4, 4096, 4096)
    spec = named_device("v100")  # CUDA cores: FFMA
    fwd = plan_forward(problem, spec)
    bwd = plan_backward(problem, spec)
    assert (fwd.config.block_m, fwd.config.block_n) == (64, 32)  # not shrunk to the backward's needs
    assert fwd.smem_bytes > max(p.smem_bytes for p in bwd.plans) - 1024
    names = [b.name for b in bwd.dkdv.layout]
    assert names == ["k_tile", "v_tile", "q_tile", "do_tile"]
    assert [b.name for b in bwd.dq.layout] == ["q_tile", "do_tile", "k_tile", "v_tile"]
    assert "attn_bwd_delta" in bwd.describe() and "attn_bwd_dkdv_simt" in bwd.describe()


def test_tensor_core_forward_is_chosen_only_where_it_can_run():
    from cupyattn.plan import FwdMmaConfig, FwdWgmmaHalfConfig

    def cfg(dtype="float16", d=128, dv=None, device="h100", aligned=True):
        problem = AttentionProblem(dtype, d, dv or d, True, 4, 16, 16, 4096, 4096, aligned=aligned)
        return plan_forward(problem, named_device(device)).config

    # sm_90: the wgmma forward on TMA-loaded tiles; mma.sync elsewhere (test_wgmma_half_* below).
    assert isinstance(cfg(), FwdWgmmaHalfConfig) and isinstance(cfg("bfloat16", 256), FwdWgmmaHalfConfig)
    assert isinstance(cfg(device="a100"), FwdMmaConfig) and isinstance(
        cfg("bfloat16", 256, device="a100"), FwdMmaConfig
    )
    assert cfg(device="rtx3090").block_m < 128 or cfg(device="rtx3090").block_n < 64  # 104448 > 101376 bytes
    assert isinstance(cfg(d=40, device="a100"), FwdMmaConfig)  # 40 pads to 48
    assert isinstance(cfg("float32"), FwdMmaConfig) and cfg("float32").precision == "fp32"  # 3xTF32
    assert isinstance(cfg("float32", device="v100"), FwdSimtConfig)  # FFMA before sm_80
    assert isinstance(cfg(device="t4"), FwdSimtConfig)  # m16n8k16 needs sm_80
    assert isinstance(cfg(d=100), FwdSimtConfig)  # rows not a multiple of 16 bytes
    assert isinstance(cfg(d=128, dv=64), FwdSimtConfig)
    assert isinstance(cfg(aligned=False), FwdSimtConfig)


def test_tensor_core_backward_is_chosen_only_where_it_can_run():
    from cupyattn.plan import (
        BwdDkdvMmaConfig,
        BwdDkdvWgmmaHalfConfig,
        BwdDqMmaConfig,
        BwdDqWgmmaHalfConfig,
        plan_backward,
    )

    two_passes = Policy(ordered_fused_where=())  # (the fused pass has its own tests)

    def cfgs(dtype="float16", d=128, dv=None, device="h100", aligned=True):
        problem = AttentionProblem(dtype, d, dv or d, True, 4, 16, 16, 4096, 4096, aligned=aligned)
        bplan = plan_backward(problem, named_device(device), two_passes)
        return bplan.dkdv.config, bplan.dq.config

    for d in (64, 128, 256):
        dkdv, dq = cfgs(d=d, device="a100")
        assert isinstance(dkdv, BwdDkdvMmaConfig) and isinstance(dq, BwdDqMmaConfig)
        # sm_90: the float16 / bfloat16 wgmma passes (TMA-loaded tiles)
        dkdv, dq = cfgs(d=d)
        assert isinstance(dkdv, BwdDkdvWgmmaHalfConfig) and isinstance(dq, BwdDqWgmmaHalfConfig)
    assert cfgs(d=256, device="a100")[0].d_split == 2  # two warps share 16 keys: 128 dK/dV columns each
    assert cfgs(d=256)[0].d_split == 2  # two warpgroups share 64 keys: 128 dK/dV columns each
    # dK/dV at padded head dims 129-192: neither one warpgroup's accumulators nor a split of
    # whole 64-column chunks fits, so mma.sync's tiles; dQ still on wgmma
    dkdv, dq = cfgs(d=160)
    assert isinstance(dkdv, BwdDkdvMmaConfig) and isinstance(dq, BwdDqWgmmaHalfConfig)
    assert cfgs(dtype="float32")[0].precision == cfgs(dtype="float32")[1].precision == "fp32"
    for kwargs in (
        {"dtype": "float32", "device": "v100"},
        {"device": "t4"},
        {"d": 100},
        {"dv": 64},
        {"aligned": False},
    ):
        assert [type(c).__name__ for c in cfgs(**kwargs)] == ["BwdDkdvSimtConfig", "BwdDqSimtConfig"], kwargs


def test_backward_tensor_core_layout_has_its_staged_rows_and_statistics():
    from cupyattn.plan import BwdDkdvMmaConfig

    lay = BwdDkdvMmaConfig("float16", "fp16", 64, 64, 64, 4, True).layout
    assert [b.name for b in lay] == ["k_tile", "v_tile", "q_tile", "do_tile", "lse_tile", "delta_tile"]
    assert lay["q_tile"].shape == (2, 64, 72) and lay["lse_tile"].shape == (2, 64)
    assert lay.total == 2 * 64 * 72 * 2 + 2 * (2 * 64 * 72 * 2) + 2 * (2 * 64 * 4)


def test_tensor_core_layout_names_its_pipeline_stages_and_padding():
    from cupyattn.plan import FwdMmaConfig

    lay = FwdMmaConfig("bfloat16", "bf16", 128, 64, 64, 4, False).layout
    assert [b.name for b in lay] == ["q_tile", "k_tile", "v_tile"]
    assert lay["k_tile"].shape == (2, 64, 136) and "2 pipeline stages" in lay["k_tile"].note
    assert lay.total == 64 * 136 * 2 + 2 * (2 * 64 * 136 * 2)


def test_tiles_left_out_for_registers_are_named_with_the_reason():
    """The plan says which faster tensor-core tiles it did not consider and why."""
    from cupyattn.plan import plan_backward

    problem = AttentionProblem("float16", 128, 128, True, 4, 16, 16, 4096, 4096)
    plan = plan_forward(problem, named_device("h200"))
    skipped = dict(plan.register_skipped)
    name = "cupyattn::attn_fwd_mma<__half, cupyattn::MmaHalf<__half>, 128, 128, 64, 4, true>"
    why = skipped[name]
    assert "two 16-row m-tiles per warp: 256 accumulators" in why and "192" in why
    assert plan.config.name_expression not in skipped
    assert f"  skipped {name}: two 16-row" in plan.describe()
    bplan = plan_backward(AttentionProblem("bfloat16", 256, 256, False), named_device("rtx5090"))
    assert (
        "over the spill-free budget of 80 on sm_120"
        in dict(bplan.dkdv.register_skipped)[
            "cupyattn::attn_bwd_dkdv_mma<__nv_bfloat16, cupyattn::MmaHalf<__nv_bfloat16>, 256, 32, 32, 4, false>"
        ]
    )
    assert plan_forward(AttentionProblem("float32", 128, 128, True), named_device("v100")).register_skipped == ()


def test_precision_is_parsed_with_clear_errors():
    from cupyattn.plan import parse_precision

    assert parse_precision(None, "float32") == ("fp32",)
    assert parse_precision("tf32", "float32") == ("tf32",)
    assert parse_precision(["bf16", "fp32", "bf16"], "float32") == ("bf16", "fp32")
    assert parse_precision(None, "bfloat16") == ("bf16",) == parse_precision("bf16", "bfloat16")
    with pytest.raises(ValueError, match="precision: expected None, one of"):
        parse_precision("fp64", "float32")
    with pytest.raises(ValueError, match="precision: expected None"):
        parse_precision((), "float32")
    with pytest.raises(ValueError, match="float16 inputs compute with 'fp16' operands; got 'tf32'"):
        parse_precision("tf32", "float16")


@pytest.mark.parametrize("device", sorted(NAMED_DEVICES))
def test_every_precision_mode_has_a_fitting_plan_on_every_device(device):
    """Each float32 mode, forward and backward, head dims 1..256, fits; sm_80+
    runs it on tensor cores where the shape allows, older GPUs fall back to FFMA."""
    from cupyattn.plan import PRECISIONS, plan_backward

    spec = named_device(device)
    tensor_cores = spec.compute_capability >= (8, 0)
    for precision in PRECISIONS:
        for d in range(1, 257):
            for causal in (False, True):
                problem = AttentionProblem("float32", d, d, causal, precision=precision)
                plans = (plan_forward(problem, spec), *plan_backward(problem, spec).plans)
                for plan in plans:
                    assert plan.smem_bytes <= spec.smem_per_block_optin
                    on_tc = isinstance(plan.config, MmaConfig)
                    if tensor_cores and d % 8 == 0 and not on_tc:  # every tile would spill: said so
                        assert plan.register_skipped, (device, precision, d)
                    assert not on_tc or (tensor_cores and d % 8 == 0)
                    assert plan.precision == precision  # on CUDA cores: on operands rounded to it
                    if on_tc:
                        assert plan.config.fits_registers(spec.compute_capability)


def test_staged_half_precision_halves_the_operand_tiles():
    from cupyattn.plan import FwdMmaConfig

    fp32 = FwdMmaConfig("float32", "fp32", 128, 64, 64, 4, True).layout
    bf16 = FwdMmaConfig("float32", "bf16", 128, 64, 64, 4, True).layout
    assert fp32["q_tile"].shape == (64, 132) and fp32["q_tile"].dtype == "float32"  # +16 bytes = 4 floats
    assert bf16["q_tile"].shape == (64, 136) and bf16["q_tile"].dtype == "bfloat16"
    assert "float32 staged as bfloat16" in bf16["k_tile"].note
    rows = 64 + 2 * 2 * 64  # q, and two stages of k and v
    assert (fp32.total, bf16.total) == (rows * 132 * 4, rows * 136 * 2)


def test_a_sequence_of_modes_falls_through_to_the_first_that_gets_tensor_cores():
    h200 = named_device("h200")
    problem = AttentionProblem("float32", 128, 128, True, precision=("fp32", "bf16"))
    assert plan_forward(problem, h200).precision == "fp32"
    # 3xTF32 tiles at head dim 128 need more than 40 KiB; bfloat16-staged ones fit.
    small = plan_forward(problem, h200.with_smem_limit(40960))
    assert small.precision == "bf16" and small.rejected
    assert "MmaTf32<3>" in small.rejected[0].name_expression
    tiny = plan_forward(problem, h200.with_smem_limit(16384))  # neither: CUDA cores
    assert not isinstance(tiny.config, MmaConfig) and tiny.precision == "fp32"
    # At head dim 256 every 3xTF32 mma.sync forward tile would spill: on an A100 the next
    # allowed mode runs; an H200 has the wgmma kernel for 3xTF32 there.
    wide_problem = AttentionProblem("float32", 256, 256, True, precision=("fp32", "bf16"))
    wide = plan_forward(wide_problem, named_device("a100"))
    assert wide.precision == "bf16" and any("MmaTf32<3>" in name for name, _ in wide.register_skipped)
    wide = plan_forward(wide_problem, h200)
    assert wide.precision == "fp32" and isinstance(wide.config, FwdWgmmaConfig)
    assert any("attn_fwd_mma<float, cupyattn::MmaTf32<3>" in name for name, _ in wide.register_skipped)
    # No tensor cores: the first mode's FFMA fallback, float32 arithmetic.
    v100 = plan_forward(problem, named_device("v100"))
    assert not isinstance(v100.config, MmaConfig) and v100.precision == "fp32"
    assert "float32 arithmetic (FFMA) on CUDA cores" in v100.describe()


def _tile(plan):
    cfg = plan.config
    return (cfg.block_m, cfg.block_n, cfg.num_warps) if isinstance(cfg, MmaConfig) else None


def test_tf32_takes_its_own_measured_tile_order_and_other_modes_keep_theirs():
    spec = named_device("h100")

    def problem(precision, d):
        return AttentionProblem("float32", d, d, False, 4, 16, 16, 4096, 4096, precision=(precision,))

    a100 = named_device("a100")  # mma.sync's forward (the H100 takes the wgmma kernel)
    assert _tile(plan_forward(problem("tf32", 96), a100)) == (128, 64, 8)  # before (128, 32, 4)
    assert _tile(plan_forward(problem("tf32", 64), a100)) == (128, 64, 4)  # still first
    assert _tile(plan_backward(problem("tf32", 128), spec).dq) == (128, 64, 8)  # tiles.BWD_WGMMA_FIRST
    assert _tile(plan_backward(problem("tf32", 64), spec).dq) == (128, 32, 8)  # the list's order
    # 3xTF32 measured apart
    assert _tile(plan_forward(problem("fp32", 64), a100)) == (128, 32, 4)
    f16 = AttentionProblem("float16", 128, 128, False, 4, 16, 16, 4096, 4096)
    assert _tile(plan_backward(f16, a100).dq) == (64, 64, 4)


@pytest.mark.parametrize(
    "device,on_tensor_cores,why",
    [
        ("a100", False, "over the spill-free budget of 96 on sm_80"),
        ("h100", True, None),
        ("b200", False, "spills at every tile above head dim 160 on sm_100"),
    ],
)
def test_3xtf32_register_caps_follow_the_architecture(device, on_tensor_cores, why):
    """At head dim 192 the 3xTF32 forward's (16, 16, 1) compiles clean on sm_90 only
    (ptxas spills it on sm_80 and sm_100): tensor cores there, FFMA elsewhere, said so."""
    problem = AttentionProblem("float32", 192, 192, True, 1, 8, 8, 1024, 1024, precision=("fp32",))
    plan = plan_forward(problem, named_device(device))
    assert (_tile(plan) == (16, 16, 1)) == on_tensor_cores
    if why:
        assert any(why in reason for _, reason in plan.register_skipped), plan.register_skipped


def test_wgmma_forward_is_planned_on_sm_90_for_float32_tf32_modes_where_it_measured_faster():
    from cupyattn.plan import WGMMA_FORWARD_MIN_KEYS, FwdMmaConfig, FwdWgmmaConfig

    def cfg(precision, d, device="h200", dtype="float32", causal=False, batch=4, seqlen=4096):
        problem = AttentionProblem(
            dtype, d, d, causal, batch, 16, 16, seqlen, seqlen, precision=(precision,) if dtype == "float32" else ()
        )
        return plan_forward(problem, named_device(device)).config

    # tiles.FWD_WGMMA_FIRST: the fastest tile of each sweep, by mode, head dim and causality.
    assert _tile_of(cfg("tf32", 64)) == ("wgmma", (128, 64, 8))
    assert _tile_of(cfg("tf32", 128)) == ("wgmma", (192, 64, 12))
    assert _tile_of(cfg("tf32", 256)) == ("wgmma", (64, 64, 4))
    assert _tile_of(cfg("tf32", 256, causal=True)) == ("wgmma", (128, 32, 8))
    assert _tile_of(cfg("fp32", 64)) == ("wgmma", (192, 64, 12))
    # Q in registers from head dim 128 (64-key tiles fit); "fp32" 144-176 in the class of 128.
    assert _tile_of(cfg("fp32", 128)) == _tile_of(cfg("fp32", 144, causal=True)) == ("wgmma", (128, 64, 8))
    assert _tile_of(cfg("fp32", 160)) == _tile_of(cfg("fp32", 176)) == ("wgmma", (128, 32, 8))
    assert _tile_of(cfg("fp32", 192)) == _tile_of(cfg("fp32", 224)) == ("wgmma", (128, 32, 8))
    assert _tile_of(cfg("fp32", 256)) == _tile_of(cfg("fp32", 256, causal=True)) == ("wgmma", (128, 16, 8))
    # Head dims between the measured ones take the next measured one's order.
    assert _tile_of(cfg("tf32", 96)) == ("wgmma", (192, 64, 12))
    # Fewer keys than WGMMA_FORWARD_MIN_KEYS a block (half the sequence when causal): mma.sync
    # first, but "fp32" at head dim 256, where every mma.sync tile spills, still wgmma.
    assert WGMMA_FORWARD_MIN_KEYS == 512
    assert type(cfg("tf32", 128, seqlen=256)) is FwdMmaConfig
    assert type(cfg("tf32", 128, seqlen=512)) is FwdWgmmaConfig
    assert type(cfg("tf32", 128, seqlen=512, causal=True)) is FwdMmaConfig
    assert type(cfg("tf32", 128, seqlen=1024, causal=True)) is FwdWgmmaConfig
    assert type(cfg("fp32", 256, seqlen=256)) is FwdWgmmaConfig
    # A problem too small for the large tiles to fill the GPU takes the first wgmma tile that does.
    small = cfg("tf32", 128, batch=1, seqlen=1024)
    assert type(small) is FwdWgmmaConfig and 1024 // small.block_m * 16 >= 132
    # Never off sm_90 (wgmma is sm_90a's), never for half-precision operands.
    for device in ("a100", "rtx4090", "b200", "rtx5090"):
        assert not isinstance(cfg("tf32", 128, device), FwdWgmmaConfig)
    assert not isinstance(cfg("bf16", 128), FwdWgmmaConfig)
    assert not isinstance(cfg(None, 128, dtype="float16"), FwdWgmmaConfig)


def test_wgmma_forward_register_rule_keeps_out_the_tiles_that_spill():
    from cupyattn.plan import FwdWgmmaConfig

    assert FwdWgmmaConfig("float32", "fp32", 64, 256, 64, 16, False).register_reason((9, 0))
    assert FwdWgmmaConfig("float32", "tf32", 176, 256, 32, 16, False).register_reason((9, 0))  # 288 bytes
    assert not FwdWgmmaConfig("float32", "tf32", 144, 256, 32, 16, False).register_reason((9, 0))
    assert not FwdWgmmaConfig("float32", "tf32", 256, 128, 32, 8, True).register_reason((9, 0))
    # Q in registers ("fp32" from 128): 16 warps, and 12 where head dim + 2 x keys > 208.
    assert FwdWgmmaConfig("float32", "fp32", 128, 256, 32, 16, False).register_reason((9, 0))
    assert FwdWgmmaConfig("float32", "fp32", 128, 192, 64, 12, False).register_reason((9, 0))
    assert FwdWgmmaConfig("float32", "fp32", 160, 192, 32, 12, True).register_reason((9, 0))
    assert not FwdWgmmaConfig("float32", "fp32", 144, 192, 32, 12, True).register_reason((9, 0))
    assert not FwdWgmmaConfig("float32", "tf32", 128, 192, 64, 12, False).register_reason((9, 0))


def _tile_of(cfg):
    from cupyattn.plan import FwdWgmmaConfig

    kind = "wgmma" if isinstance(cfg, FwdWgmmaConfig) else type(cfg).__name__
    return kind, (cfg.block_m, cfg.block_n, cfg.num_warps)


def test_wgmma_forward_layout_holds_tf32_parts_and_staged_key_tiles():
    from cupyattn.compile import target_arch
    from cupyattn.plan import SM90_SMEM_PER_BLOCK, FwdWgmmaConfig

    fp32 = FwdWgmmaConfig("float32", "fp32", 128, 128, 32, 8, False)
    tf32 = FwdWgmmaConfig("float32", "tf32", 128, 128, 32, 8, False)
    lay = fp32.layout
    assert [b.name for b in lay] == ["q_tile", "kv_tiles", "barriers"]
    # "fp32" from head dim 128: Q once as float32 (64 KiB) in A-register order.
    assert lay["q_tile"].shape == (1, 128, 128) and "A-register order" in lay["q_tile"].note
    assert "K-major" in lay["kv_tiles"].note
    # Two stages of K and V^T (2 parts x 32 keys x 128) fit beside it, barriers for K and V^T.
    assert fp32.stages == 2 and lay["kv_tiles"].shape == (2, 2, 2, 32, 128)
    assert lay["barriers"].shape == (2, 2) and lay["barriers"].bytes == 32
    assert fp32.layout.total == 4 * (128 * 128 + 2 * 2 * 2 * 32 * 128) + 32 == 196640
    one = FwdWgmmaConfig("float32", "fp32", 128, 128, 64, 8, False)  # 64-key tiles: one stage
    assert one.stages == 1 and one.layout["barriers"].shape == (1, 2) and one.layout.total == 196624
    both_parts = FwdWgmmaConfig("float32", "fp32", 112, 128, 32, 8, False)
    assert both_parts.layout["q_tile"].shape == (2, 128, 112)
    assert tf32.stages == 2 and tf32.layout["q_tile"].shape == (1, 128, 128)
    assert tf32.layout.total == 4 * (128 * 128 + 2 * 2 * 32 * 128) + 32
    two = FwdWgmmaConfig("float32", "fp32", 128, 128, 16, 8, False)  # 16-key tiles: two stages fit
    assert two.stages == 2 and two.layout.total <= SM90_SMEM_PER_BLOCK
    # The staging launch writes each key tile as one stage holds it.
    assert 2 * fp32.staging.tile_bytes == lay["kv_tiles"].bytes
    assert fp32.staging.workspace_bytes(4, 2, 33) == 4 * 2 * 2 * fp32.staging.tile_bytes  # 2 tiles of 32 keys
    assert fp32.staging.name_expression == "cupyattn::stage_keys_tf32<cupyattn::MmaTf32<3>, 128, 32, false>"
    assert fp32.valid and not FwdWgmmaConfig("float32", "fp32", 128, 128, 32, 4, False).valid  # 64 rows a warpgroup
    assert not FwdWgmmaConfig("float32", "bf16", 128, 128, 32, 8, False).valid
    assert "attn_fwd_wgmma<float, cupyattn::MmaTf32<3>, 128, 128, 32, 8, false>" in fp32.name_expression
    assert target_arch(fp32, "sm_90") == "sm_90a" and target_arch(fp32, "sm_90a") == "sm_90a"
    assert FwdWgmmaConfig("float32", "fp32", 64, 256, 64, 16, False).register_reason((9, 0))
    plan = plan_forward(AttentionProblem("float32", 64, 64, False, 4, 16, 16, 4096, 4096), named_device("h200"))
    assert "warpgroup MMA (wgmma, sm_90a)" in plan.describe() and "kv_tiles" in plan.describe()
    # The staging launch and the global memory it takes: 4 x 16 heads x 4096 keys of K and
    # V in two TF32 parts ("fp32").
    assert (
        f"staged first by {plan.config.staging.name_expression}: {4 * 16 * 4096 * 64 * 4 * 2 * 2} bytes"
        in plan.describe()
    )


def test_wgmma_backward_is_planned_on_sm_90_for_float32_tf32_modes_where_it_measured_faster():
    from cupyattn.plan import BwdDkdvWgmmaConfig, BwdDqWgmmaConfig, BwdFusedWgmmaConfig, StagingConfig, WgmmaConfig

    def plans(precision, d, device="h200", dtype="float32", batch=4, seqlen=4096, causal=False):
        problem = AttentionProblem(
            dtype, d, d, causal, batch, 16, 16, seqlen, seqlen, precision=(precision,) if dtype == "float32" else ()
        )
        bwd = plan_backward(problem, named_device(device), Policy(ordered_fused_where=()))  # (the two passes)
        return bwd.dkdv.config, bwd.dq.config

    def tiles(cfgs):
        return [
            ("wgmma" if isinstance(c, WgmmaConfig) else type(c).__name__, (c.block_m, c.block_n, c.num_warps))
            for c in cfgs
        ]

    # The default policy: wgmma first wherever its tiles compile without spills and fit.
    assert tiles(plans("tf32", 64)) == [("wgmma", (32, 192, 12)), ("wgmma", (128, 32, 8))]
    # "fp32" at 64 (tiles.BWD_WGMMA_FIRST): 64-query tiles through the ring, K and V in two
    # TF32 parts each (no words below 128); products one at a time leave them the registers.
    # dQ's 64-key tiles (tiles.BWD_WGMMA_FIRST), S then dP: N=64 score products.
    assert tiles(plans("fp32", 64)) == [("wgmma", (64, 128, 8)), ("wgmma", (128, 64, 8))]
    dkdv, _ = plans("fp32", 64)
    assert dkdv.ring and not dkdv.kv_in_registers and dkdv.layout["k_tile"].shape == (2, 128, 64)
    assert "unless through the ring" in BwdDkdvWgmmaConfig("float32", "fp32", 64, 64, 64, 4, False).register_reason(
        (9, 0)
    )
    # "tf32" at 128 (tiles.BWD_WGMMA_FIRST): dK/dV's 64-query tiles through the ring (one
    # stage does not fit beside K and V), dQ's 64-key tiles.
    assert tiles(plans("tf32", 128)) == [("wgmma", (64, 128, 8)), ("wgmma", (128, 64, 8))]
    assert plans("tf32", 128)[0].ring and plans("tf32", 128)[1].block_n == 64
    assert tiles(plans("tf32", 160)[:1]) == [("wgmma", (32, 128, 8))] and plans("tf32", 160)[0].ring
    # One TF32 pass through the ring: its register rule.
    assert "> 192" in BwdDkdvWgmmaConfig("float32", "tf32", 160, 64, 64, 4, False).register_reason((9, 0))
    # "fp32" from head dim 128: dQ keeps Q and dO as float32 words, dK/dV K and V: 8-warp
    # tiles fit in both; dK/dV's 32-query tiles stream through the ring (one stage does not
    # fit beside the words), where S^T and dP^T, one at a time, leave the registers for them.
    assert tiles(plans("fp32", 128)) == [("wgmma", (32, 128, 8)), ("wgmma", (128, 32, 8))]
    dkdv, _ = plans("fp32", 128)
    assert dkdv.kv_in_registers and dkdv.layout["k_tile"].shape == (1, 128, 128) and dkdv.ring
    assert "A-register order" in dkdv.layout["v_tile"].note and dkdv.layout["barriers"].shape == (1, 3)
    split = BwdDkdvWgmmaConfig("float32", "fp32", 128, 16, 128, 8, False)  # one stage in two halves
    assert not split.ring and split.stages == 1 and split.layout["barriers"].shape == (1, 2)
    # The words' register rule, by schedule: both products at once (one stage) spilled at
    # (32,64,4) at 128; one at a time (the ring) takes 16-query tiles at 160, not 32 at 160.
    assert "> 160" in BwdDkdvWgmmaConfig("float32", "fp32", 128, 32, 64, 4, False).register_reason((9, 0))
    assert BwdDkdvWgmmaConfig("float32", "fp32", 160, 16, 128, 8, False).register_reason((9, 0)) is None
    assert "> 192" in BwdDkdvWgmmaConfig("float32", "fp32", 160, 32, 64, 4, False).register_reason((9, 0))
    assert not BwdDkdvWgmmaConfig("float32", "fp32", 112, 32, 128, 8, False).kv_in_registers
    assert not BwdDkdvWgmmaConfig("float32", "tf32", 128, 32, 128, 8, False).kv_in_registers
    assert not BwdFusedWgmmaConfig("float32", "fp32", 128, 32, 64, 4, False).kv_in_registers
    # At 192 (d_split 2) a 3xTF32 dK/dV tile fits only with K and V as words.
    dkdv, _ = plans("fp32", 192)
    assert tiles([dkdv]) == [("wgmma", (16, 64, 8))] and dkdv.d_split == 2 and dkdv.kv_in_registers
    # At head dim 256 two warpgroups share 64 keys, each with half of dK's and dV's columns.
    # "tf32": 32 query rows through the ring (tiles.BWD_WGMMA_FIRST).
    dkdv, dq = plans("tf32", 256)
    assert isinstance(dkdv, WgmmaConfig) and dkdv.d_split == 2 and isinstance(dq, BwdDqWgmmaConfig)
    assert tiles([dkdv]) == [("wgmma", (32, 64, 8))] and dkdv.ring and dkdv.layout["barriers"].shape == (1, 3)
    # (one TF32 pass: no producer warpgroup, which measured slower there)
    assert not dkdv.producer_warp and dkdv.threads == 256 and dkdv.layout_expression.endswith(", 64>")
    assert dkdv.layout.total == 2 * 64 * 256 * 4 + 3 * (32 * 256 * 4 + 2 * 32 * 4) + 24
    # "fp32" at 256: dK/dV streams its query tiles through a ring of three slots (a whole
    # staged tile does not fit beside K and V's words), dQ keeps Q and dO as words.
    dkdv, dq = plans("fp32", 256)
    assert tiles([dkdv, dq]) == [("wgmma", (16, 64, 8)), ("wgmma", (64, 16, 8))] and dkdv.ring
    # dQ: only 64 rows of Q and dO fit, so two warpgroups share them (d_split 2), each with
    # half of dQ's columns; "tf32" takes one warpgroup with 32-key tiles there (measured
    # faster than the pair: tiles.BWD_DQ_WGMMA_TILES).
    assert dq.d_split == 2 and tiles([plans("tf32", 256)[1]]) == [("wgmma", (64, 32, 4))]
    assert plans("tf32", 256)[1].d_split == 1
    # The same tile where it fits for "fp32" (up to 176) and takes 32-key tiles.
    assert tiles([plans("fp32", 176)[1]]) == [("wgmma", (64, 32, 4))]
    assert dkdv.layout["q_tiles"].shape == (3, 2 * 16 * 256 + 2 * 16) and dkdv.layout["barriers"].shape == (1, 6)
    assert "ring" in dkdv.layout["q_tiles"].note and dkdv.layout.total == 2 * 64 * 256 * 4 + 3 * 32896 + 48
    assert dkdv.producer_warp and dkdv.threads == 384 and dkdv.layout_expression.endswith(", true>")  # 6 mbarriers
    # Its staged query tiles hold Q, dO, their transposes, lse and delta, as the ring does;
    # Q's and dO's row tiles with their parts as rows: the B operands of n32 score products.
    assert dkdv.staging == StagingConfig("dkdv queries", "fp32", 256, 16, True)
    assert dkdv.score_parts_as_rows and dkdv.staging.name_expression.endswith("256, 16, true, true>")
    assert dkdv.staging.tile_bytes == dkdv.stage_bytes == 4 * 2 * 16 * 256 * 4 + 2 * 16 * 4 == 131200
    assert not plans("fp32", 192)[0].ring and not plans("tf32", 192)[0].ring
    # Where every other dK/dV tile spills, the d_split tile pads the head dim to 32:
    # 3xTF32 at 144 -> 160, 208 -> 224, 240 -> 256 (the ring); "tf32" at 240 -> 256.
    for precision, d, pad in (("fp32", 144, 160), ("fp32", 208, 224), ("fp32", 240, 256), ("tf32", 240, 256)):
        dkdv, _ = plans(precision, d)
        assert tiles([dkdv]) == [("wgmma", (16, 64, 8))] and dkdv.head_dim_pad == pad, (precision, d)
    assert BwdDkdvWgmmaConfig.head_dim_pad_for(144, 16, 128, 8) == 144  # d_split 1: the tensor cores' 16
    assert dq.q_in_registers and dq.layout["q_tile"].shape == (1, 64, 256) and dq.stages == 1
    # One stage: K and V | K^T land on a barrier each, freed on two more (the producer warpgroup).
    assert dq.layout["barriers"].shape == (1, 4) and "K, V | K^T" in dq.layout["barriers"].note
    assert dq.producer_warp and dq.threads == 384 and dq.layout_expression.endswith(", true>")
    assert dq.staging.tile_bytes == dq.stage_bytes == dq.layout["kv_tiles"].bytes
    assert dq.score_parts_as_rows and dq.staging.name_expression.endswith("256, 16, true, true, true>")
    # Not for one TF32 pass, nor 32-wide tiles.
    assert not plans("tf32", 256)[0].score_parts_as_rows and not plans("fp32", 128)[0].score_parts_as_rows
    assert not BwdDqWgmmaConfig("float32", "fp32", 112, 64, 16, 4, False).q_in_registers
    assert not BwdDqWgmmaConfig("float32", "tf32", 256, 64, 16, 4, False).q_in_registers
    # d_split dQ tiles: 64 rows shared by two warpgroups, whole 16-column halves of the head dim.
    assert BwdDqWgmmaConfig("float32", "fp32", 256, 64, 16, 8, False).valid
    assert not BwdDqWgmmaConfig("float32", "fp32", 144, 64, 16, 8, False).valid  # 72-column halves
    assert not BwdDqWgmmaConfig("float32", "fp32", 256, 32, 16, 8, False).valid  # a pair owns 64 rows
    assert BwdDqWgmmaConfig.head_dim_pad_for(144, 64, 16, 8) == 160
    assert BwdDqWgmmaConfig.head_dim_pad_for(144, 64, 16, 4) == 144
    assert BwdDqWgmmaConfig("float32", "fp32", 256, 64, 16, 8, False).accumulators_per_lane == (128 + 32) // 2
    # Blocks that stream fewer than Policy.wgmma_backward_min_rows (half when causal): mma.sync first.
    assert not any(isinstance(c, WgmmaConfig) for c in plans("tf32", 64, batch=1, seqlen=512))
    assert not any(isinstance(c, WgmmaConfig) for c in plans("tf32", 64, seqlen=512))
    assert all(isinstance(c, WgmmaConfig) for c in plans("tf32", 64, seqlen=1024))
    assert not any(isinstance(c, WgmmaConfig) for c in plans("tf32", 64, seqlen=1024, causal=True))
    assert all(isinstance(c, WgmmaConfig) for c in plans("tf32", 64, seqlen=2048, causal=True))
    # From head dim 128: from 256 rows (Policy.wgmma_backward_min_rows_from_128).
    for precision, d in (("tf32", 128), ("fp32", 128), ("fp32", 256), ("tf32", 256)):
        assert all(isinstance(c, WgmmaConfig) for c in plans(precision, d, seqlen=512, causal=True))
        if d == 128:  # (at 256 mma.sync's tiles spill or do not fit: wgmma's whatever the length)
            assert not any(isinstance(c, WgmmaConfig) for c in plans(precision, d, seqlen=256, causal=True))
    assert not any(isinstance(c, WgmmaConfig) for c in plans("tf32", 112, seqlen=1024, causal=True))
    # dK/dV streams the queries, dQ the keys: each pass by its own length.
    problem = AttentionProblem("float32", 64, 64, False, 4, 16, 16, 4096, 512, precision=("tf32",))
    bwd = plan_backward(problem, named_device("h200"))
    assert isinstance(bwd.dkdv.config, WgmmaConfig) and not isinstance(bwd.dq.config, WgmmaConfig)
    # delta: the dK/dV pass's staging launch computes it as it reads dO (no launch of its
    # own), for the dQ pass too; elsewhere its own launch.
    assert bwd.delta is None and "delta: computed by stage_queries_tf32" in bwd.describe()
    problem = AttentionProblem("float32", 64, 64, False, 4, 16, 16, 512, 4096, precision=("tf32",))
    bwd = plan_backward(problem, named_device("h200"))
    assert not isinstance(bwd.dkdv.config, WgmmaConfig) and bwd.delta is not None
    # Never off sm_90, never for half-precision operands.
    for device in ("a100", "rtx4090", "b200", "rtx5090"):
        assert not any(isinstance(c, WgmmaConfig) for c in plans("tf32", 64, device))
    assert not any(isinstance(c, WgmmaConfig) for c in plans("bf16", 64))
    assert not any(isinstance(c, WgmmaConfig) for c in plans(None, 64, dtype="float16"))


def test_wgmma_backward_layouts_and_register_rules():
    from cupyattn.plan import BwdDkdvWgmmaConfig, BwdDqWgmmaConfig, BwdFusedWgmmaConfig

    dkdv = BwdDkdvWgmmaConfig("float32", "fp32", 64, 32, 128, 8, False)
    assert [b.name for b in dkdv.layout] == ["k_tile", "v_tile", "q_tiles", "barriers"]
    assert dkdv.layout["k_tile"].shape == (2, 128, 64) and "Q^T" in dkdv.layout["q_tiles"].note
    # A staged query tile (Q, dO, Q^T, dO^T in two parts, lse and delta): two stages do not fit.
    assert dkdv.staging.tile_bytes == 4 * 2 * 32 * 64 * 4 + 2 * 32 * 4 == 65792
    assert dkdv.stages == 1 and dkdv.layout["q_tiles"].bytes == dkdv.staging.tile_bytes
    # One stage: its halves (Q, dO | Q^T, dO^T, lse, delta) land on a barrier each.
    assert dkdv.layout["barriers"].shape == (1, 2) and "Q, dO | Q^T" in dkdv.layout["barriers"].note
    assert dkdv.layout.total == 4 * 2 * 2 * 128 * 64 + 65792 + 16 == 196880
    two = BwdDkdvWgmmaConfig("float32", "tf32", 64, 32, 128, 8, False)
    assert two.stages == 2 and two.layout["barriers"].shape == (2, 1)
    assert dkdv.staging.name_expression == "cupyattn::stage_queries_tf32<cupyattn::MmaTf32<3>, 64, 32>"
    dq = BwdDqWgmmaConfig("float32", "tf32", 128, 128, 32, 8, True)
    assert [b.name for b in dq.layout] == ["q_tile", "do_tile", "kv_tiles", "barriers"]
    assert dq.stages == 2 and dq.layout["kv_tiles"].shape == (2, 3, 1, 32, 128)
    assert "dQ = dS K" in dq.layout["kv_tiles"].note and dq.layout["barriers"].shape == (2, 1)
    assert dq.layout.total == 2 * 128 * 128 * 4 + 2 * 3 * 32 * 128 * 4 + 16 == 229392
    assert dq.staging.name_expression == "cupyattn::stage_keys_tf32<cupyattn::MmaTf32<1>, 128, 32, true>"
    # 64 keys (dK/dV) or query rows (dQ) a warpgroup.
    assert dkdv.valid and not BwdDkdvWgmmaConfig("float32", "fp32", 64, 32, 64, 16, False).valid
    # ... or two warpgroups share 64 keys, each with half of the head dim (d_split 2).
    shared = BwdDkdvWgmmaConfig("float32", "tf32", 256, 16, 64, 8, False)
    assert shared.valid and shared.d_split == 2 and shared.accumulators_per_lane == 128 + 16
    assert (
        shared.register_reason((9, 0)) is None and shared.layout.total == 2 * 64 * 256 * 4 + 65664 + 16
    )  # one stage: two barriers
    assert not BwdFusedWgmmaConfig("float32", "tf32", 128, 16, 64, 8, False).valid  # dS of all its keys
    assert dq.valid and not BwdDqWgmmaConfig("float32", "tf32", 128, 32, 32, 8, True).valid
    assert BwdDqWgmmaConfig("float32", "tf32", 128, 64, 32, 8, True).d_split == 2  # two warpgroups, 64 rows
    assert not BwdDqWgmmaConfig("float32", "fp16", 128, 128, 32, 8, True).valid
    # The spills ptxas makes (every listed tile, head dims 16-256): the rules that keep them out.
    assert BwdDkdvWgmmaConfig("float32", "tf32", 224, 16, 64, 4, False).register_reason((9, 0))
    assert BwdDkdvWgmmaConfig("float32", "fp32", 32, 32, 256, 16, False).register_reason((9, 0))
    assert BwdDkdvWgmmaConfig("float32", "tf32", 80, 32, 256, 16, False).register_reason((9, 0))
    assert BwdDkdvWgmmaConfig("float32", "tf32", 64, 32, 256, 16, False).register_reason((9, 0))  # 44 bytes
    assert BwdDkdvWgmmaConfig("float32", "fp32", 64, 16, 192, 12, False).register_reason((9, 0))
    assert BwdDkdvWgmmaConfig("float32", "tf32", 192, 32, 64, 4, False).register_reason((9, 0))
    assert BwdDkdvWgmmaConfig("float32", "tf32", 176, 32, 64, 4, False).register_reason((9, 0)) is None
    assert BwdDkdvWgmmaConfig("float32", "tf32", 64, 32, 192, 12, False).register_reason((9, 0)) is None
    # Tiles the rules keep out at their edges (scripts/rule_audit.py --admitted): "tf32"
    # (16,256,16) at 80 causal and (64,64,4) at 144 (both products at once) spill; their
    # neighbours compile clean.
    assert BwdDkdvWgmmaConfig("float32", "tf32", 80, 16, 256, 16, True).register_reason((9, 0))
    assert BwdDkdvWgmmaConfig("float32", "tf32", 64, 16, 256, 16, True).register_reason((9, 0)) is None
    assert "64-query" in BwdDkdvWgmmaConfig("float32", "tf32", 144, 64, 64, 4, False).register_reason((9, 0))
    assert BwdDkdvWgmmaConfig("float32", "tf32", 128, 64, 64, 4, False).register_reason((9, 0)) is None
    # Causal instances that spill at the rules' edges (rule_audit.py --admitted --causal
    # yes): "tf32" (16,64,4) at 208; "fp32" 64-query tiles at 48, both products at once.
    assert "from head dim 208" in BwdDkdvWgmmaConfig("float32", "tf32", 208, 16, 64, 4, True).register_reason((9, 0))
    assert "from head dim 48" in BwdDkdvWgmmaConfig("float32", "fp32", 48, 64, 128, 8, True).register_reason((9, 0))
    problem = AttentionProblem("float32", 200, 200, True, 4, 16, 16, 4096, 4096, precision=("tf32",))
    dkdv = plan_backward(problem, named_device("h200")).dkdv.config
    assert (dkdv.block_m, dkdv.block_n, dkdv.num_warps, dkdv.d_split, dkdv.head_dim_pad) == (16, 64, 8, 2, 224)
    # 3xTF32 dQ with 64-key tiles computes S, then dP: no register rule (they fit up to 64).
    assert BwdDqWgmmaConfig("float32", "fp32", 48, 128, 64, 8, False).register_reason((9, 0)) is None
    assert BwdDqWgmmaConfig("float32", "fp32", 64, 64, 64, 4, False).register_reason((9, 0)) is None
    assert BwdDqWgmmaConfig("float32", "fp32", 48, 192, 32, 12, False).register_reason((9, 0))
    assert BwdDqWgmmaConfig("float32", "tf32", 64, 256, 32, 16, False).register_reason((9, 0)) is None
    problem = AttentionProblem("float32", 64, 64, False, 4, 16, 16, 4096, 4096, precision=("tf32",))
    text = plan_backward(problem, named_device("h200")).describe()
    assert "attn_bwd_dkdv_wgmma" in text and "attn_bwd_dq_wgmma" in text and "warpgroup MMA" in text


def test_fused_backward_is_planned_only_when_the_caller_gives_up_determinism_on_sm_90():
    from cupyattn.plan import BwdFusedWgmmaConfig, BwdFusedWgmmaHalfConfig

    def bwd(precision, d, deterministic=False, device="h200", seqlen=4096, causal=False):
        problem = AttentionProblem(
            "float32", d, d, causal, 4, 16, 16, seqlen, seqlen, precision=(precision,), deterministic=deterministic
        )
        return plan_backward(problem, named_device(device))

    fused = bwd("tf32", 64)
    assert fused.dq is None and isinstance(fused.dkdv.config, BwdFusedWgmmaConfig)
    assert fused.plans == (fused.dkdv,) and "attn_bwd_fused_wgmma" in fused.describe()
    assert "float32 atomics, not bitwise reproducible" in fused.dkdv.reason
    assert bwd("tf32", 64, deterministic=True).dq is not None  # the default: its own dQ pass
    # Only where it measured faster (BWD_FUSED_WHERE_FASTER): not where only 4-warp tiles
    # fit beside K^T ("tf32" 128, "fp32" 64), nor where none fits ("fp32" 128, 256), off
    # sm_90, or below the wgmma backward's rows.
    for precision, d in (("tf32", 128), ("fp32", 64), ("fp32", 128), ("tf32", 256)):
        assert bwd(precision, d).dq is not None
    assert bwd("tf32", 64, device="a100").dq is not None and bwd("tf32", 64, device="h100").dq is None
    assert bwd("tf32", 64, seqlen=512).dq is not None
    assert bwd("tf32", 64, seqlen=2048, causal=True).dq is None
    # Half-precision-staged modes never take it; float16 inputs take their own up to head dim
    # 128, deterministic (dQ in the key blocks' order) and not.
    assert bwd("bf16", 64).dq is not None
    for d, deterministic in ((64, False), (128, False), (128, True)):
        problem = AttentionProblem("float16", d, d, False, 4, 16, 16, 4096, 4096, deterministic=deterministic)
        cfg = plan_backward(problem, named_device("h200")).dkdv.config
        assert isinstance(cfg, BwdFusedWgmmaHalfConfig) and cfg.ordered == deterministic
    problem = AttentionProblem("float16", 192, 192, False, 4, 16, 16, 4096, 4096, deterministic=False)
    assert plan_backward(problem, named_device("h200")).dq is not None


def test_fused_half_backward_is_planned_where_the_policy_has_it_with_a_convert_launch():
    from cupyattn.plan import BwdDkdvWgmmaHalfConfig, BwdDqConvertConfig, BwdFusedWgmmaHalfConfig

    h100 = named_device("h100")

    def bwd(d, policy=None, dtype="bfloat16", device=h100, **kw):
        problem = AttentionProblem(dtype, d, d, True, 4, 16, 16, 4096, 4096, deterministic=False, **kw)
        return plan_backward(problem, device, policy)

    where = Policy(fused_where={("bf16", 64), ("bf16", 80), ("bf16", 128), ("fp16", 128), ("bf16", 192)})
    for d in (64, 72, 128):
        plan = bwd((d + 15) // 16 * 16, where)
        assert isinstance(plan.dkdv.config, BwdFusedWgmmaHalfConfig) and plan.dq is None
        assert plan.dq_convert == BwdDqConvertConfig("bfloat16") and plan.delta is not None
        text = plan.describe()
        assert "attn_bwd_dq_convert" in text and "ds_tiles" in text and "dq_tiles" in text
        assert "dQ added to a float32 accumulator in any order, not bitwise reproducible" in plan.dkdv.reason
    assert isinstance(bwd(128, where, dtype="float16").dkdv.config, BwdFusedWgmmaHalfConfig)
    # Not where its dK, dV and dQ chunk outgrow a warpgroup's registers (head dims past 128),
    # where TMA maps cannot describe the inputs, without the wgmma_half or fused family,
    # deterministic unless the policy's ordered_fused_where has it, or off sm_90.
    two = bwd(192, where)
    assert two.dq is not None and two.dq_convert is None
    assert bwd(128, where, tma=False).dq is not None
    assert bwd(128, Policy(families={"fused", "mma", "simt"}, fused_where=where.fused_where)).dq is not None
    only_half = Policy(families={"wgmma_half", "mma", "simt"}, fused_where=where.fused_where)
    assert isinstance(bwd(128, only_half).dkdv.config, BwdDkdvWgmmaHalfConfig)
    problem = AttentionProblem("bfloat16", 128, 128, True, 4, 16, 16, 4096, 4096)  # deterministic
    assert plan_backward(problem, h100, Policy(fused_where=where.fused_where, ordered_fused_where=())).dq is not None
    ordered = plan_backward(problem, h100, Policy(ordered_fused_where={("bf16", 128)}))
    assert ordered.dkdv.config.ordered and "adds its dQ to a float32 accumulator in turn" in ordered.dkdv.reason
    tiles = 4 * 16 * 4096 // 64  # the accumulator: 64-row tiles of 128 float32 columns, a turn counter each
    assert (
        f"({tiles * 64 * 128 * 4} bytes of global memory and {tiles * 4} bytes of turn counters)" in ordered.describe()
    )
    assert bwd(128, where, device=named_device("a100")).dq is not None


def test_fused_half_backward_layout_adds_two_swizzled_ds_tiles_and_two_dq_tiles():
    from cupyattn.plan import SM90_SMEM_PER_BLOCK, BwdDkdvWgmmaHalfConfig, BwdFusedWgmmaHalfConfig

    for d in (64, 128):
        fused = BwdFusedWgmmaHalfConfig("bfloat16", "bf16", d, 64, 128, 8, False)
        base = BwdDkdvWgmmaHalfConfig("bfloat16", "bf16", d, 64, 128, 8, False)
        names = [b.name for b in base.layout]
        assert [b.name for b in fused.layout] == [*names, "ds_tiles", "dq_tiles", "dq_barriers"]
        assert all(fused.layout[n].offset == base.layout[n].offset for n in names)
        ds, dq = fused.layout["ds_tiles"], fused.layout["dq_tiles"]
        assert ds.shape == (2, 128, 64) and ds.offset % 1024 == 0 and ds.offset >= base.layout.total
        assert dq.shape == (2, d // 64, 64, 64) and dq.offset == ds.offset + 2 * 128 * 64 * 2
        assert fused.layout.total == dq.offset + 2 * (d // 64) * 64 * 64 * 4 + 4 * 8 <= SM90_SMEM_PER_BLOCK
        assert fused.accumulators_per_lane == base.accumulators_per_lane <= 224
    assert not BwdFusedWgmmaHalfConfig("bfloat16", "bf16", 192, 64, 128, 8, False).valid  # three dQ chunks
    assert not BwdFusedWgmmaHalfConfig("bfloat16", "bf16", 64, 128, 128, 8, False).valid  # dS^T of 64 queries
    assert not BwdFusedWgmmaHalfConfig("bfloat16", "bf16", 64, 64, 64, 4, False).valid  # two key warpgroups


def test_fused_backward_layout_keeps_k_transposed_and_each_warpgroups_ds():
    from cupyattn.plan import SM90_SMEM_PER_BLOCK, BwdDkdvWgmmaConfig, BwdFusedWgmmaConfig

    fused = BwdFusedWgmmaConfig("float32", "tf32", 64, 32, 128, 8, False)
    assert [b.name for b in fused.layout] == ["k_tile", "v_tile", "kt_tile", "ds_tiles", "q_tiles", "barriers"]
    assert fused.layout["kt_tile"].shape == (1, 64, 128) and fused.layout["ds_tiles"].shape == (2, 1, 32, 64)
    assert fused.stages == 2 and fused.staging == BwdDkdvWgmmaConfig("float32", "tf32", 64, 32, 128, 8, False).staging
    assert fused.layout.total == 3 * 128 * 64 * 4 + 2 * 32 * 64 * 4 + 2 * (4 * 32 * 64 * 4 + 2 * 32 * 4) + 16
    fp32 = BwdFusedWgmmaConfig("float32", "fp32", 64, 32, 64, 4, True)
    assert fp32.stages == 1 and fp32.layout["ds_tiles"].shape == (1, 2, 32, 64)
    # dQ^T = K^T dS^T takes 64 head-dim rows a wgmma.
    assert fused.valid and not BwdFusedWgmmaConfig("float32", "tf32", 96, 32, 128, 8, False).valid
    assert BwdDkdvWgmmaConfig("float32", "tf32", 96, 32, 128, 8, False).valid
    # No ring beside K^T (BwdFusedWgmmaLayout::RING is false): where a whole stage does not
    # fit, the fused tile does not fit, though dK/dV's same tile streams through its ring.
    big = BwdFusedWgmmaConfig("float32", "tf32", 128, 16, 128, 8, False)
    assert not big.ring and big.layout.total > SM90_SMEM_PER_BLOCK and "ring" not in big.layout["q_tiles"].note
    assert BwdDkdvWgmmaConfig("float32", "tf32", 128, 64, 128, 8, False).ring


def test_3xtf32_forward_keeps_q_as_one_float32_copy_from_head_dim_128():
    """FwdWgmmaConfig.q_in_registers (kernels/attn_fwd_wgmma.cuh Q_IN_REGISTERS): Q as
    float32 once instead of two TF32 parts, so that the key tiles get the bytes."""
    from cupyattn.plan import FwdWgmmaConfig

    def q_bytes(precision, d, tile=(64, 16, 4)):
        cfg = FwdWgmmaConfig("float32", precision, d, *tile, False)
        return cfg.q_in_registers, cfg.layout["q_tile"].bytes, cfg.stages

    assert q_bytes("fp32", 112) == (False, 2 * 64 * 112 * 4, 2)
    assert q_bytes("fp32", 128, (128, 64, 8)) == (True, 128 * 128 * 4, 1)  # 64-key tiles fit
    assert q_bytes("fp32", 192) == (True, 64 * 192 * 4, 2)
    assert q_bytes("fp32", 256) == (True, 64 * 256 * 4, 2)  # K and V^T in two parts: 64 KiB a stage, two stages
    assert q_bytes("tf32", 256) == (False, 64 * 256 * 4, 2)  # one TF32 part anyway
    assert FwdWgmmaConfig("float32", "fp32", 256, 64, 32, 4, False).layout.total <= 232448


def _plans(problem, device, policy=None):
    bwd = plan_backward(problem, device, policy)
    return [plan_forward(problem, device, policy)] + list(bwd.plans)


def test_the_default_policy_plans_as_no_policy_does():
    from cupyattn.plan import DEFAULT_POLICY, Policy

    assert Policy() == DEFAULT_POLICY and hash(Policy()) == hash(DEFAULT_POLICY)
    for device in ("v100", "a100", "h200", "rtx5090"):
        spec = named_device(device)
        for dtype, precision in (("float16", None), ("float32", "fp32"), ("float32", "tf32")):
            for d, s, causal in ((64, 4096, False), (128, 512, True), (256, 1024, False), (72, 333, True)):
                for deterministic in (True, False):
                    problem = AttentionProblem(
                        dtype, d, d, causal, 4, 16, 16, s, s, precision=precision, deterministic=deterministic
                    )
                    want = _plans(problem, spec)
                    assert _plans(problem, spec, DEFAULT_POLICY) == want == _plans(problem, spec, Policy())


def test_a_policy_restricts_the_kernel_families():
    from cupyattn.plan import BwdFusedWgmmaConfig, FwdMmaConfig, Policy, SimtConfig, WgmmaConfig

    h200 = named_device("h200")
    problem = AttentionProblem("float32", 64, 64, False, 4, 16, 16, 4096, 4096, precision="tf32")
    assert all(isinstance(p.config, WgmmaConfig) for p in _plans(problem, h200))
    mma = _plans(problem, h200, Policy(families={"mma", "simt"}))
    assert all(isinstance(p.config, MmaConfig) and not isinstance(p.config, WgmmaConfig) for p in mma)
    assert all(isinstance(p.config, SimtConfig) for p in _plans(problem, h200, Policy(families={"simt"})))
    # Below the lengths where the wgmma kernels pay: mma.sync's, unless the policy lowers them.
    short = AttentionProblem("float32", 64, 64, False, 4, 16, 16, 256, 256, precision="tf32")
    assert type(plan_forward(short, h200).config) is FwdMmaConfig
    forced = Policy(families={"wgmma"}, wgmma_forward_min_keys=0, wgmma_backward_min_rows=0)
    assert all(isinstance(p.config, WgmmaConfig) for p in _plans(short, h200, forced))
    # The fused backward is a family of its own.
    fused = AttentionProblem("float32", 64, 64, False, 4, 16, 16, 4096, 4096, precision="tf32", deterministic=False)
    assert isinstance(plan_backward(fused, h200).dkdv.config, BwdFusedWgmmaConfig)
    two = plan_backward(fused, h200, Policy(families={"wgmma", "mma", "simt"}))
    assert two.dq is not None and not isinstance(two.dkdv.config, BwdFusedWgmmaConfig)
    # No allowed family fits: the error lists what was tried.
    with pytest.raises(
        PlanError, match="(?s)no forward configuration fits H200.*tried:\n  cupyattn::attn_fwd_mma<float"
    ):
        plan_forward(problem, h200.with_smem_limit(8192), Policy(families={"mma"}))
    assert plan_backward(problem, named_device("v100"), Policy(families={"simt"})).delta is not None


def test_a_policy_overrides_the_tiles_and_their_measured_order():
    from cupyattn.plan import BwdDqWgmmaConfig, FwdMmaConfig, Policy

    a100, h200 = named_device("a100"), named_device("h200")
    problem = AttentionProblem("float16", 64, 64, False, 4, 16, 16, 4096, 4096)
    assert _tile(plan_forward(problem, a100)) == (128, 64, 4)
    assert _tile(plan_forward(problem, a100, Policy(tiles={"fwd_mma": [(64, 32, 4), (128, 64, 4)]}))) == (64, 32, 4)
    # The override's order stands: "tf32" moves (128, 64, 8) ahead only in the measured list.
    tf32 = AttentionProblem("float32", 96, 96, False, 4, 16, 16, 4096, 4096, precision="tf32")
    assert _tile(plan_forward(tf32, a100)) == (128, 64, 8)
    assert _tile(plan_forward(tf32, a100, Policy(tiles={"fwd_mma": FWD_MMA_TILES}))) == (128, 32, 4)
    # So does the wgmma list's per-head-dim order; an emptied list leaves the other family.
    f32 = AttentionProblem("float32", 64, 64, False, 4, 16, 16, 4096, 4096, precision="tf32")
    policy = Policy(tiles={"bwd_dq_wgmma": [(64, 16, 4)], "fwd_wgmma": ()})
    bwd = plan_backward(f32, h200, policy)
    assert isinstance(bwd.dq.config, BwdDqWgmmaConfig) and _tile(bwd.dq) == (64, 16, 4)
    assert type(plan_forward(f32, h200, policy).config) is FwdMmaConfig
    simt = plan_backward(f32, named_device("v100"), Policy(tiles={"bwd_dkdv_simt": [(8, 8, 2)]})).dkdv.config
    assert (simt.block_m, simt.block_n, simt.num_warps) == (8, 8, 2)


def test_a_policy_moves_the_thresholds_and_where_the_fused_pass_runs():
    from cupyattn.plan import BwdFusedWgmmaConfig, FwdWgmmaConfig, Policy, WgmmaConfig

    h200 = named_device("h200")
    short = AttentionProblem("float32", 128, 128, False, 4, 16, 16, 256, 256, precision="tf32")
    assert not isinstance(plan_forward(short, h200).config, WgmmaConfig)
    assert isinstance(plan_forward(short, h200, Policy(wgmma_forward_min_keys=256)).config, FwdWgmmaConfig)
    mid = AttentionProblem("float32", 64, 64, False, 4, 16, 16, 512, 512, precision="tf32")
    assert not any(isinstance(p.config, WgmmaConfig) for p in plan_backward(mid, h200).plans)
    assert all(
        isinstance(p.config, WgmmaConfig) for p in plan_backward(mid, h200, Policy(wgmma_backward_min_rows=512)).plans
    )
    # From padded head dim 128 the lower of the two thresholds holds.
    wide = AttentionProblem("float32", 128, 128, True, 4, 16, 16, 256, 256, precision="tf32")
    assert not any(isinstance(p.config, WgmmaConfig) for p in plan_backward(wide, h200).plans)
    assert all(
        isinstance(p.config, WgmmaConfig)
        for p in plan_backward(wide, h200, Policy(wgmma_backward_min_rows_from_128=128)).plans
    )
    fused = AttentionProblem("float32", 128, 128, False, 4, 16, 16, 4096, 4096, precision="tf32", deterministic=False)
    assert plan_backward(fused, h200).dq is not None
    bwd = plan_backward(fused, h200, Policy(fused_where=[("tf32", 128)]))
    assert bwd.dq is None and isinstance(bwd.dkdv.config, BwdFusedWgmmaConfig)
    assert "as the planner policy's fused_where asks" in bwd.dkdv.reason
    assert plan_backward(fused, h200, Policy(fused_where=())).dq is not None


def test_policy_values_are_normalised_and_bad_ones_name_their_argument():
    from cupyattn.plan import Policy

    loose = Policy(families=["mma", "simt"], tiles={"fwd_mma": [[64, 64, 4]]}, fused_where=[["tf32", 64]])
    exact = Policy(
        families=frozenset({"simt", "mma"}), tiles=(("fwd_mma", ((64, 64, 4),)),), fused_where=frozenset({("tf32", 64)})
    )
    assert loose == exact and hash(loose) == hash(exact)
    assert Policy(families="mma").families == frozenset({"mma"})
    bad = [
        (dict(families={"tensor"}), "families: expected None or a non-empty set of"),
        (dict(families=()), "families: expected"),
        (dict(tiles={"fwd": [(64, 64, 4)]}), "tiles: expected keys among"),
        (dict(tiles=[("fwd_mma", ()), ("fwd_mma", ())]), "tiles: 'fwd_mma' given twice"),
        (dict(tiles={"fwd_mma": [(64, 64)]}), r"tiles\['fwd_mma'\]: expected \(block_m, block_n, num_warps\)"),
        (dict(tiles={"fwd_mma": [(64, 0, 4)]}), r"tiles\['fwd_mma'\]"),
        (dict(tiles={"fwd_mma": 64}), r"tiles\['fwd_mma'\]: expected a sequence"),
        (dict(tiles=[1, 2]), "tiles: expected a dict or"),
        (dict(wgmma_forward_min_keys=-1), "wgmma_forward_min_keys: expected an int >= 0, got -1"),
        (dict(wgmma_backward_min_rows=1.5), "wgmma_backward_min_rows: expected an int"),
        (dict(wgmma_backward_min_rows_from_128=True), "wgmma_backward_min_rows_from_128: expected"),
        (dict(fused_where={("fp64", 64)}), "fused_where: expected \\(precision, padded head dim\\) pairs"),
    ]
    for kwargs, message in bad:
        with pytest.raises(ValueError, match=message):
            Policy(**kwargs)
    problem = AttentionProblem("float16", 64, 64, False)
    with pytest.raises(TypeError, match="policy: expected a cupyattn.plan.Policy or None, got str"):
        plan_forward(problem, named_device("h200"), "mma")


# ---- The float16 / bfloat16 wgmma forward on TMA-loaded tiles (sm_90) ----


def _half_plan(dtype="bfloat16", d=128, causal=False, device="h100", sq=4096, sk=None, policy=None, **kw):
    problem = AttentionProblem(dtype, d, d, causal, 4, 16, 16, sq, sk or sq, **kw)
    return plan_forward(problem, named_device(device), policy)


@pytest.mark.parametrize("device", ["h100", "h200"])
def test_wgmma_half_forward_is_planned_first_for_half_inputs_on_sm_90(device):
    from cupyattn.plan import FwdWgmmaHalfConfig

    for dtype in ("float16", "bfloat16"):
        for d in range(8, 257, 8):
            for causal in (False, True):
                cfg = _half_plan(dtype, d, causal, device).config
                assert isinstance(cfg, FwdWgmmaHalfConfig), (dtype, d, causal, cfg.name_expression)
                assert cfg.head_dim_pad == (d + 15) // 16 * 16
                # Three consumer warpgroups (192 x 128) up to head dim 64, where they compile
                # without spills; then two: 192-key tiles up to head dim 128 (the fastest
                # measured), FlashAttention-3's 128 x 80 past it.
                if d <= 64:
                    assert (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.threads) == (192, 128, 12, 512)
                    assert not cfg.takes_turns
                else:
                    assert (cfg.block_m, cfg.num_warps, cfg.threads) == (128, 8, 384) and cfg.takes_turns
                    assert cfg.block_n == (192 if d <= 128 else 80)
                assert cfg.stages == (3 if d <= 64 else 2)
                assert cfg.layout.total <= 232448


def test_wgmma_half_forward_falls_back_to_mma_sync_where_tma_cannot_run():
    from cupyattn.plan import FwdMmaConfig, FwdSimtConfig, FwdWgmmaHalfConfig

    assert isinstance(_half_plan(tma=False).config, FwdMmaConfig)  # e.g. negative strides
    assert isinstance(_half_plan(aligned=False).config, FwdSimtConfig)  # rows not on 16 bytes
    for device in ("a100", "rtx4090", "b200"):  # wgmma and setmaxnreg: sm_90a only
        assert isinstance(_half_plan(device=device).config, FwdMmaConfig), device
    assert not isinstance(_half_plan("float32").config, FwdWgmmaHalfConfig)
    assert isinstance(
        plan_forward(AttentionProblem("float16", 128, 64, False), named_device("h100")).config, FwdSimtConfig
    )
    # A policy without the family plans mma.sync's forward.
    no_half = Policy(families={"simt", "mma", "wgmma", "fused"})
    assert isinstance(_half_plan(policy=no_half).config, FwdMmaConfig)


def test_wgmma_half_forward_goes_after_mma_sync_for_short_queries_unless_the_policy_asks():
    from cupyattn.plan import FwdMmaConfig, FwdWgmmaHalfConfig

    only = Policy(families={"wgmma_half"})
    for sq in (1, 17, 64):
        assert isinstance(_half_plan(sq=sq, sk=4096).config, FwdMmaConfig), sq
        cfg = _half_plan(sq=sq, sk=17, policy=only).config  # its 128-row tile, not capped to the queries
        assert isinstance(cfg, FwdWgmmaHalfConfig) and cfg.block_m == 128
    assert isinstance(_half_plan(sq=1000, sk=17).config, FwdWgmmaHalfConfig)
    with pytest.raises(PlanError):  # nothing else allowed where it cannot run
        _half_plan(tma=False, policy=only)


def test_wgmma_half_forward_layout_is_swizzle_aligned_with_its_barriers():
    from cupyattn.plan import FwdWgmmaHalfConfig

    for d, n in ((16, 128), (64, 128), (80, 128), (128, 128), (192, 80), (256, 80), (256, 64)):
        cfg = FwdWgmmaHalfConfig("float16", "fp16", d, 128, n, 8, True)
        lay = cfg.layout
        chunks, stages = -(-d // 64), cfg.stages
        assert [b.name for b in lay] == ["q_tile", "k_tiles", "v_tiles", "barriers"]
        assert all(b.offset % 1024 == 0 for b in lay)
        assert lay["q_tile"].shape == (chunks, 128, 64) and lay["q_tile"].bytes == chunks * 128 * 128
        assert lay["k_tiles"].shape == lay["v_tiles"].shape == (stages, chunks, n, 64)
        assert lay["barriers"].shape == (1 + 4 * stages,) and lay["barriers"].dtype == "uint64"
        assert lay.total == lay["barriers"].offset + 8 * (1 + 4 * stages)
    plan = _half_plan("float16", 256, True)
    text = plan.describe()
    assert "producer warpgroup" in text and "TMA" in text and "240 registers" in text
    assert "warpgroup MMA" in plan.precision_text


def test_wgmma_half_family_and_tiles_come_from_the_policy():
    from cupyattn.plan import TILE_KEYS, FwdWgmmaHalfConfig

    assert "wgmma_half" in FAMILIES and "fwd_wgmma_half" in TILE_KEYS
    cfg = _half_plan(d=64, policy=Policy(tiles={"fwd_wgmma_half": [(128, 64, 8)]})).config
    assert isinstance(cfg, FwdWgmmaHalfConfig) and cfg.block_n == 64


def test_tma_maps_take_only_views_a_map_can_describe():
    from types import SimpleNamespace

    from cupyattn import tma

    def view(ptr, shape, strides):
        return SimpleNamespace(data=SimpleNamespace(ptr=ptr), shape=shape, strides=strides)

    b = 2  # bytes a 16-bit element
    packed = (1000 * 8 * 64 * b, 8 * 64 * b, 64 * b, b)
    assert tma.describable(view(4096, (2, 1000, 8, 64), packed))
    assert not tma.describable(view(4098, (2, 1000, 8, 64), packed))  # base off 16 bytes
    assert not tma.describable(view(4096, (2, 1000, 8, 36), (1000 * 8 * 36 * b, 8 * 36 * b, 36 * b, b)))
    assert not tma.describable(view(4096, (2, 1000, 8, 64), (packed[0], -packed[1], packed[2], b)))  # reversed
    # A dim of length 1 is never stepped: its stride may be anything, and the driver gets a valid one.
    odd = (3, 8 * 64 * b, 64 * b, b)
    assert tma.describable(view(4096, (1, 1000, 8, 64), odd))
    s, h, bb = tma._strides_for_encoding((1, 1000, 8, 64), odd, b)
    assert (s, h) == odd[1:3] and bb % 16 == 0 and bb >= 1000 * 8 * 64 * b
    assert tma.TMA_MAPS.itemsize == 3 * 128
