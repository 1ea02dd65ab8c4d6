"""scripts/rule_audit.py's choice of tiles and verdicts (its compiles are test_compile's kind)."""

import sys
from pathlib import Path

from cupyattn.device import named_device

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from rule_audit import audited_tiles, verdict  # noqa: E402


def _tiles(found):
    return {(c.precision, c.head_dim_pad, (c.block_m, c.block_n, c.num_warps)): why for c, why in found}


def test_the_audit_takes_the_tiles_a_rule_keeps_out_that_fit():
    h200 = named_device("h200")
    found = _tiles(audited_tiles(h200, [128], (False,), ("dkdv",)))
    # The split stage's words rule keeps (32,64,4) out; the ring's (32,128,8) is planned.
    assert "K and V words" in found[("fp32", 128, (32, 64, 4))]
    assert ("fp32", 128, (32, 128, 8)) not in found
    assert all(why for why in found.values())
    # --admitted: the rest of the fitting tiles too, with no reason.
    every = _tiles(audited_tiles(h200, [128], (False,), ("dkdv",), admitted=True))
    assert every[("fp32", 128, (32, 128, 8))] is None and set(found) < set(every)


def test_a_tile_that_does_not_fit_is_not_audited():
    h200 = named_device("h200")
    found = _tiles(audited_tiles(h200, [256], (False, True), ("dq",), admitted=True))
    assert ("fp32", 256, (64, 32, 8)) not in found  # 327 KB of shared memory
    assert ("fp32", 256, (64, 16, 8)) in found


def test_verdicts():
    assert verdict("a rule", 0) == "RULE TOO STRICT"
    assert verdict(None, 28) == "RULE TOO LOOSE"
    assert verdict("a rule", 28) == verdict(None, 0) == "ok"
    assert verdict(None, 0, empty_hgmmas=6) == verdict("a rule", 28, 2) == "EMPTY HGMMA"
