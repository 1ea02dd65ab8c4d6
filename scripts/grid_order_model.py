"""Why causal grids hand out their blocks by groups of heads (kernels/simt_tiles.cuh,
grid_slot): a list-scheduling model of one causal launch.

Block i of a head's T tiles has i + 1 units of work (the query tile sees i + 1 key
tiles, or the key tile is seen by T - i query tiles); each of `slots` resident blocks
(SMs x blocks per SM) takes the next block in grid order when it finishes. Prints the
finish time of each order relative to an even split of the work.

    python scripts/grid_order_model.py [--heads 64] [--slots 132,264] [--tiles 16,32,64,128,256]
"""

import argparse
import heapq


def finish_time(works, slots):
    free = [0.0] * slots
    for w in works:
        heapq.heappush(free, heapq.heappop(free) + w)
    return max(free)


def grid_blocks(heads, tiles, group):
    """(head, rank) of each block in grid_slot's order: groups of ``group`` heads in turn,
    each handing out its ranks heaviest (0) first, heads fastest."""
    order = []
    for first in range(0, heads, group):
        n = min(group, heads - first)
        order += [(h, r) for r in range(tiles) for h in range(first, first + n)]
    return order


def orders(tiles, heads):
    """Work of each block in grid order: heads-major with the heaviest tile first (the
    order before grid_slot), and grid_slot's groups of max(1, min(32, 256 // tiles)) heads."""
    by_head = [tiles - r for _ in range(heads) for r in range(tiles)]
    group = max(1, min(32, 256 // tiles))
    grouped = [tiles - r for _, r in grid_blocks(heads, tiles, group)]
    return {"one head after another": by_head, f"groups of {group} heads": grouped}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--slots", default="132,264")
    parser.add_argument("--tiles", default="16,32,64,128,256")
    args = parser.parse_args()
    print("| tiles per head | resident blocks | " + " | ".join(["one head after another", "grouped"]) + " |")
    print("|---|---|---|---|")
    for slots in (int(s) for s in args.slots.split(",")):
        for tiles in (int(t) for t in args.tiles.split(",")):
            results = orders(tiles, args.heads)
            even = sum(next(iter(results.values()))) / slots
            cells = [f"{finish_time(w, slots) / even - 1:+.1%} ({name})" if "groups" in name
                     else f"{finish_time(w, slots) / even - 1:+.1%}" for name, w in results.items()]
            print(f"| {tiles} | {slots} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
