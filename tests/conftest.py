import pytest

from cupyattn.testing import gpu_unavailable_reason

GPU_SKIP_REASON = gpu_unavailable_reason()
HAS_GPU = GPU_SKIP_REASON is None


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_env_smem_limit(monkeypatch):
    # Tests set limits explicitly; a stray CUPYATTN_SMEM_LIMIT must not change them.
    monkeypatch.delenv("CUPYATTN_SMEM_LIMIT", raising=False)


@pytest.fixture
def mma_backward_tiles_taken_away(monkeypatch):
    """The backward planned without mma.sync's dK/dV and dQ tiles (on sm_90, wgmma's where
    they fit), with the plan cache cleared before and after."""
    from cupyattn import plan as P

    monkeypatch.setattr(P, "BWD_DKDV_MMA_TILES", ())
    monkeypatch.setattr(P, "BWD_DQ_MMA_TILES", ())
    P.plan_backward.cache_clear()
    yield
    P.plan_backward.cache_clear()
