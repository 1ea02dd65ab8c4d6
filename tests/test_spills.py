"""scripts/spills.py rules --list: the wgmma tiles its audit compiles (the compiles
themselves are test_compile's kind)."""

import re

from _script_runs import script


def _listed(*args):
    res = script("spills.py", "rules", "--list", *args)
    assert res.returncode == 0, res.stdout + res.stderr
    tiles = {}
    for line in res.stdout.splitlines():
        found = re.fullmatch(r"(\w+) (\d+) (\d+)x(\d+)x(\d+) (causal|full): \S.* \| rule: (.+)", line)
        assert found, line
        precision, d, m, n, w, _, why = found.groups()
        tiles[(precision, int(d), (int(m), int(n), int(w)))] = why
    return tiles


def test_the_audit_takes_the_tiles_a_rule_keeps_out_that_fit():
    found = _listed("--dims", "128", "--causal", "no", "--families", "dkdv")
    # The split stage's words rule keeps (32,64,4) out; the ring's (32,128,8) is planned.
    assert "K and V words" in found[("fp32", 128, (32, 64, 4))]
    assert ("fp32", 128, (32, 128, 8)) not in found
    assert "admitted" not in found.values()
    # --admitted: the rest of the fitting tiles too.
    every = _listed("--dims", "128", "--causal", "no", "--families", "dkdv", "--admitted")
    assert every[("fp32", 128, (32, 128, 8))] == "admitted" and set(found) < set(every)


def test_a_tile_that_does_not_fit_is_not_audited():
    found = _listed("--dims", "256", "--families", "dq", "--admitted")
    assert ("fp32", 256, (64, 32, 8)) not in found  # 327 KB of shared memory
    assert ("fp32", 256, (64, 16, 8)) in found


def test_a_device_without_wgmma_and_an_unknown_family_are_usage_errors():
    res = script("spills.py", "rules", "--list", "--device", "a100")
    assert res.returncode == 2 and "--device: expected a named sm_90 GPU" in res.stderr and "sm_80" in res.stderr
    res = script("spills.py", "rules", "--list", "--families", "dkdv,bwd")
    assert res.returncode == 2 and "--families" in res.stderr and "dkdv,bwd" in res.stderr
