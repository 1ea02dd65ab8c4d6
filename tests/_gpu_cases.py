"""Shared pieces of the GPU tests: problem strategies, strided device inputs, planner policies."""

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from cupyattn import testing
from cupyattn.plan import Policy

DTYPES = ["float16", "bfloat16", "float32"]
HEAD_DIMS = [1, 3, 8, 31, 33, 64, 80, 96, 128, 160, 200, 256]
# Tile sizes are 8..64: 1, tile - 1, tile, tile + 1 for several of them.
SEQLENS = [1, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129, 200]
# The backward without mma.sync's dK/dV and dQ tiles: on sm_90, wgmma's wherever they fit.
NO_MMA_BACKWARD = Policy(tiles={"bwd_dkdv_mma": (), "bwd_dq_mma": ()})
SETTINGS = settings(
    max_examples=25,
    deadline=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def device_array(values: np.ndarray, dtype: str, strided: bool, rng):
    """``values`` on the device, either packed or as a view into a NaN-padded buffer."""
    if not strided:
        return testing.to_device(values, dtype)
    B, S, H, D = values.shape
    big = np.full((B, S + 1, H + 2, D + 3), np.nan, dtype=np.float32)
    h0 = int(rng.integers(0, 3))
    big[:, :S, h0 : h0 + H, :D] = values
    return testing.to_device(big, dtype)[:, :S, h0 : h0 + H, :D]


@st.composite
def problems(draw):
    hkv = draw(st.integers(1, 3))
    D = draw(st.sampled_from(HEAD_DIMS))
    return dict(
        B=draw(st.integers(1, 3)),
        Sq=draw(st.sampled_from(SEQLENS)),
        Sk=draw(st.sampled_from(SEQLENS)),
        Hkv=hkv,
        Hq=hkv * draw(st.integers(1, 3)),
        D=D,
        Dv=draw(st.sampled_from([D, D, D, 8, 72, 128])),
        scale=draw(st.one_of(st.none(), st.floats(0.05, 2.0))),
        layout=draw(st.sampled_from(["bshd", "bhsd"])),
        strided=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31)),
    )


def rising_keys(dtype, seed, B=1, Sq=300, Sk=1100, H=2, D=64):
    """Host q, k, v (float32 values of ``dtype``) whose keys grow along the sequence, so that
    rows' maxima rise tile after tile, past the online softmax's rescale threshold in some
    tiles and below it in others."""
    from cupyattn import testing

    rng = np.random.default_rng(seed)
    hq = testing.host_values((B, Sq, H, D), dtype, rng)
    hk, hv = (testing.host_values((B, Sk, H, D), dtype, rng) for _ in range(2))
    hk = testing.round_to(hk * np.linspace(0.2, 3.0, Sk, dtype=np.float32)[None, :, None, None], dtype)
    return hq, hk, hv
