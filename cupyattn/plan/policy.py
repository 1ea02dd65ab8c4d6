"""The planner's policy: the kernel families it may choose from, their candidate tiles,
and the problem sizes from which the wgmma kernels go first. ``DEFAULT_POLICY`` plans
with the tile tables as measured; tests, benchmarks and the tile tuner pass another to
select kernels without touching the planner."""

from __future__ import annotations

import dataclasses
import numbers

from . import tiles as T
from .problem import PRECISIONS

# "simt": CUDA-core kernels (the delta launch is always allowed); "mma": mma.sync
# tensor-core kernels; "wgmma": Hopper warpgroup kernels; "fused": the fused dK/dV/dQ
# wgmma backward passes, float32's and float16 / bfloat16's (deterministic=False only);
# "wgmma_half": the float16 / bfloat16 wgmma forward and backward passes with TMA-loaded
# tiles (sm_90).
FAMILIES = ("simt", "mma", "wgmma", "fused", "wgmma_half")

# Each family's candidate tiles by the key a policy overrides them with.
TILE_KEYS = {
    "fwd_simt": T.FWD_SIMT_TILES,
    "bwd_dkdv_simt": T.BWD_DKDV_SIMT_TILES,
    "bwd_dq_simt": T.FWD_SIMT_TILES,
    "fwd_mma": T.FWD_MMA_TILES,
    "bwd_dkdv_mma": T.BWD_DKDV_MMA_TILES,
    "bwd_dq_mma": T.BWD_DQ_MMA_TILES,
    "fwd_wgmma": T.FWD_WGMMA_TILES,
    "bwd_dkdv_wgmma": T.BWD_DKDV_WGMMA_TILES,
    "bwd_dq_wgmma": T.BWD_DQ_WGMMA_TILES,
    "bwd_fused_wgmma": T.BWD_FUSED_WGMMA_TILES,
    "fwd_wgmma_half": T.FWD_WGMMA_HALF_TILES,
    "bwd_dkdv_wgmma_half": T.BWD_DKDV_WGMMA_HALF_TILES,
    "bwd_dq_wgmma_half": T.BWD_DQ_WGMMA_HALF_TILES,
    "bwd_fused_wgmma_half": T.BWD_FUSED_WGMMA_HALF_TILES,
}

_THRESHOLDS = ("wgmma_forward_min_keys", "wgmma_backward_min_rows", "wgmma_backward_min_rows_from_128")


def _tile(key: str, tile) -> tuple[int, int, int]:
    t = tuple(tile) if isinstance(tile, (tuple, list)) else ()
    if len(t) != 3 or not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) and x > 0 for x in t):
        raise ValueError(
            f"tiles[{key!r}]: expected (block_m, block_n, num_warps) triples of positive ints, got {tile!r}"
        )
    return tuple(int(x) for x in t)


@dataclasses.dataclass(frozen=True)
class Policy:
    """What the planner may choose from (hashable: the planners are cached per policy).

    families: None (all) or a set of FAMILIES. tiles: overrides of candidate tiles, a dict
    (or pairs) {TILE_KEYS key: [(block_m, block_n, num_warps), ...]}; an override replaces
    the family's list and its measured per-mode / head-dim order: its tiles are tried in
    the order given. wgmma_forward_min_keys, wgmma_backward_min_rows (and from padded head
    dim 128, the lower of it and wgmma_backward_min_rows_from_128): the keys a forward
    block sees, the rows a backward block streams, from which the wgmma tiles go before
    mma.sync's. fused_where: the (precision, padded head dim) pairs where the fused
    dK/dV/dQ pass is planned (deterministic=False, on sm_90); ordered_fused_where: those
    where its deterministic form is (dQ added in the key blocks' order; float16 / bfloat16).
    """

    families: frozenset | None = None
    tiles: tuple = ()
    wgmma_forward_min_keys: int = T.WGMMA_FORWARD_MIN_KEYS
    wgmma_backward_min_rows: int = T.WGMMA_BACKWARD_MIN_ROWS
    wgmma_backward_min_rows_from_128: int = T.WGMMA_BACKWARD_MIN_ROWS_FROM_128
    fused_where: frozenset = T.BWD_FUSED_WHERE_FASTER
    ordered_fused_where: frozenset = T.BWD_ORDERED_FUSED_WHERE_FASTER

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)
        if self.families is not None:
            families = (self.families,) if isinstance(self.families, str) else self.families
            try:
                families = frozenset(families)
            except TypeError:
                families = None
            if not families or not families <= set(FAMILIES):
                raise ValueError(f"families: expected None or a non-empty set of {FAMILIES}, got {self.families!r}")
            set_("families", families)
        pairs = self.tiles.items() if isinstance(self.tiles, dict) else self.tiles
        overrides = {}
        for pair in pairs:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ValueError(f"tiles: expected a dict or (key, tiles) pairs, got {self.tiles!r}")
            key, tiles = pair
            if key not in TILE_KEYS:
                raise ValueError(f"tiles: expected keys among {sorted(TILE_KEYS)}, got {key!r}")
            if key in overrides:
                raise ValueError(f"tiles: {key!r} given twice")
            if isinstance(tiles, (str, bytes)) or not hasattr(tiles, "__iter__"):
                raise ValueError(f"tiles[{key!r}]: expected a sequence of (block_m, block_n, num_warps), got {tiles!r}")
            overrides[key] = tuple(_tile(key, t) for t in tiles)
        set_("tiles", tuple(sorted(overrides.items())))
        for name in _THRESHOLDS:
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {value!r}")
            set_(name, int(value))
        for name in ("fused_where", "ordered_fused_where"):
            value, where = getattr(self, name), set()
            for pair in value if not isinstance(value, str) else (value,):
                ok = (
                    isinstance(pair, (tuple, list))
                    and len(pair) == 2
                    and pair[0] in PRECISIONS
                    and isinstance(pair[1], numbers.Integral)
                    and not isinstance(pair[1], bool)
                )
                if not ok:
                    raise ValueError(
                        f"{name}: expected (precision, padded head dim) pairs, precision one of "
                        f"{PRECISIONS}, got {value!r}"
                    )
                where.add((pair[0], int(pair[1])))
            set_(name, frozenset(where))

    def allows(self, family: str) -> bool:
        return self.families is None or family in self.families

    def candidates(self, key: str) -> tuple[tuple, bool]:
        """The candidate tiles of ``key`` and whether the policy overrides them (the
        override's order then stands, no measured order moves its tiles)."""
        override = dict(self.tiles).get(key)
        return (TILE_KEYS[key], False) if override is None else (override, True)

    def wgmma_backward_min_rows_at(self, head_dim_pad: int) -> int:
        """Rows a block streams from which the backward plans its wgmma tiles first, at this
        padded head dim (lowering wgmma_backward_min_rows lowers both thresholds)."""
        if head_dim_pad >= 128:
            return min(self.wgmma_backward_min_rows, self.wgmma_backward_min_rows_from_128)
        return self.wgmma_backward_min_rows


DEFAULT_POLICY = Policy()


def resolve_policy(policy) -> Policy:
    """``policy``, or DEFAULT_POLICY for None; anything else is refused."""
    if policy is None:
        return DEFAULT_POLICY
    if not isinstance(policy, Policy):
        raise TypeError(f"policy: expected a cupyattn.plan.Policy or None, got {type(policy).__name__}")
    return policy
