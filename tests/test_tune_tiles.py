"""scripts/tune_tiles.py's --tiles option (the timing itself runs on a device)."""

from _script_runs import script


def test_a_malformed_tile_names_the_option_and_what_it_got():
    for text in ("16-128-8", "16x128", ","):
        res = script("tune_tiles.py", "--tiles", text)
        assert res.returncode == 2, res.stdout + res.stderr
        assert "argument --tiles: expected block_m x block_n x warps" in res.stderr and repr(text) in res.stderr
