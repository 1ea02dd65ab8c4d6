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
