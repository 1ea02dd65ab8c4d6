"""How often a causal dK/dV launch's staged query tiles are still in L2 when a block reads
them: a list-scheduling model (scripts/grid_order_model.py's) with an LRU cache.

Grid order as kernels/simt_tiles.cuh grid_slot (grid_order_model.grid_blocks): groups of
heads in turn, each handing out its key tiles heaviest first, heads fastest. Each of
`slots` SMs takes the next block when it finishes; a block spends `prologue` time units,
then one unit an item, reading staged tile (head, m) for m from q_per_k * rank (its first
query tile that sees a key) to the last, ascending (before the twenty-fourth session) or descending (after). Every read is
looked up in an LRU cache of `l2_tiles` tiles in time order. Prints the share of reads
that miss (the distinct bytes fetched again from memory) and the makespan over an even
split. A model: it knows nothing of the other traffic, of L2's two partitions or of the
dQ pass; in the twenty-fourth session it put the old order at 57% misses and the new at
16%, while the whole backward gained only 2% (BENCHMARKS.md).

    python scripts/l2_reuse_model.py [--heads 64] [--tiles 64] [--q-per-k 4] [--slots 132]
        [--l2-mb 50] [--tile-kb 128] [--groups 1,2,4,8]
"""

import argparse
import heapq
from collections import OrderedDict

from grid_order_model import grid_blocks  # (scripts/ is this script's own directory)


def simulate(heads=64, tiles=64, q_per_k=4, slots=132, group=4, descending=True, l2_tiles=400, prologue=3):
    """(misses, reads, makespan / even split) of one causal dK/dV launch."""
    last = q_per_k * tiles
    free = [(0, s) for s in range(slots)]
    heapq.heapify(free)
    reads, makespan, work = [], 0, 0
    for head, rank in grid_blocks(heads, tiles, group):
        t, sm = heapq.heappop(free)
        t += prologue
        items = range(q_per_k * rank, last)
        for m in (reversed(items) if descending else items):
            reads.append((t, sm, head, m))
            t += 1
        work += prologue + len(items)
        makespan = max(makespan, t)
        heapq.heappush(free, (t, sm))
    reads.sort()
    cache, misses = OrderedDict(), 0
    for _, _, head, m in reads:
        if (head, m) in cache:
            cache.move_to_end((head, m))
        else:
            misses += 1
            cache[(head, m)] = None
            if len(cache) > l2_tiles:
                cache.popitem(last=False)
    return misses, len(reads), makespan / (work / slots)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--tiles", type=int, default=64, help="key tiles a head")
    parser.add_argument("--q-per-k", type=int, default=4, help="query tiles a key tile (BLOCK_N / BLOCK_M)")
    parser.add_argument("--slots", type=int, default=132)
    parser.add_argument("--l2-mb", type=float, default=50)
    parser.add_argument("--tile-kb", type=float, default=128, help="a staged query tile's bytes")
    parser.add_argument("--groups", default="1,2,4,8")
    args = parser.parse_args()
    l2_tiles = int(args.l2_mb * 1024 / args.tile_kb)
    print(f"| heads a group | order | reads that miss | makespan over an even split |  ({l2_tiles} tiles in L2)")
    print("|---|---|---|---|")
    for group in (int(g) for g in args.groups.split(",")):
        for descending in (False, True):
            misses, reads, over = simulate(args.heads, args.tiles, args.q_per_k, args.slots, group, descending,
                                           l2_tiles)
            print(f"| {group} | {'descending' if descending else 'ascending'} | {misses / reads:.1%} | {over - 1:+.1%} |")


if __name__ == "__main__":
    main()
