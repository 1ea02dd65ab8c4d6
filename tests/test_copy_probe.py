"""scripts/copy_probe.py without a GPU: each variant rewrites bulk_copy_to_shared's mark
in kernels/wgmma.cuh, and a probed copy's planned D=256 backward kernels compile."""

import sys
from pathlib import Path

import pytest
from _script_runs import assert_copy_compiles_without_spills, script

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import copy_probe  # noqa: E402


def test_each_variant_replaces_the_one_mark_in_bulk_copy_to_shared():
    source = (ROOT / "kernels" / copy_probe.HEADER).read_text()
    assert source.count(copy_probe.MARK) == 1
    body = source[source.index("void bulk_copy_to_shared("):]
    assert body.index(copy_probe.MARK) < body.index("mbarrier.arrive.expect_tx")  # before the barrier is armed
    for variant in copy_probe.VARIANTS:
        probed = copy_probe.probe(source, variant)
        assert copy_probe.MARK not in probed and f"// copy probe: {variant}" in probed
        assert len(probed) > len(source)
    same = copy_probe.probe(source, "same-source")
    assert same.count("cp.async.bulk.shared::cluster.global") == source.count("cp.async.bulk.shared::cluster.global") + 2
    with pytest.raises(ValueError):
        copy_probe.probe(source.replace(copy_probe.MARK, ""), "half")


def test_a_probed_copy_compiles_for_sm_90a_without_spills():
    assert_copy_compiles_without_spills("copy_probe.py", "--variants", "same-source", "--cases", "fp32:256")


def test_unknown_variants_are_named():
    res = script("copy_probe.py", "--compile-only", "--variants", "half,quarter")
    assert res.returncode == 2 and "quarter" in res.stderr
