// The wgmma backward's pipelines of staged tiles (attn_bwd_wgmma.cuh): each tile copied
// whole from its staging launch's output (cp.async.bulk) by one thread into shared
// memory and counted by an mbarrier, which its readers wait for. With a producer
// warpgroup, the consumer warps release a slot on its "free" mbarrier (one arrival a
// warp) and the producer fetches into it once every consumer warp has.
#pragma once

#include "wgmma.cuh"

namespace cupyattn {

// A block of consumer warpgroups and one producer warpgroup: registers move from the
// producer, which only issues copies, to the consumers (128 x 40 + 256 x 232 is the
// 384 x 168 that the launch gives).
__device__ __forceinline__ void producer_gives_registers() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
}
__device__ __forceinline__ void consumer_takes_registers() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
}

// The consumers meet: the whole block, or (PRODUCER) its first THREADS threads.
template <bool PRODUCER, int THREADS>
__device__ __forceinline__ void consumers_barrier() {
    if constexpr (PRODUCER)
        leading_threads_barrier(6, THREADS);
    else
        __syncthreads();
}

// A dK/dV block's work items, (query head of the GQA group, query tile), from the
// group's last head and tile down to its first head's first tile: blocks of a head
// dispatched together then read the same staged tile at about the same time. `tile`
// is the item's staged tile, counted from the block's first; `after` steps without a
// division (one at each fetch held the rest of the block at the next wgmma).
struct ItemAt {
    int head, m;
    long long tile;
};

struct QueryItems {
    int m_tiles, n_q_tiles;  // query tiles a head of this block sees, and a head has

    __device__ __forceinline__ ItemAt first(int group) const {
        return {group - 1, m_tiles - 1, (long long)(group - 1) * n_q_tiles + m_tiles - 1};
    }
    __device__ __forceinline__ ItemAt after(ItemAt at) const {
        return at.m > 0 ? ItemAt{at.head, at.m - 1, at.tile - 1}
                        : ItemAt{at.head - 1, m_tiles - 1, at.tile - 1 - (n_q_tiles - m_tiles)};
    }
};

// dK/dV's staged query tiles through STAGES whole stages (each on its barrier, one item
// ahead) or, where one stage fits (L::SPLIT_STAGE), through its two halves: Q and dO
// on barriers[0], Q^T, dO^T, lse and delta on barriers[1], so that the next item's half
// copies while this item's other half is in use. fetch*: thread 0 only.
template <typename L>
struct QueryStages {
    unsigned char* tiles;  // L::q_tiles in shared memory
    const unsigned char* staged;  // the block's first staged tile
    unsigned long long* barriers;  // L::barriers

    __device__ __forceinline__ unsigned char* stage(int item) const {
        return tiles + item % L::STAGES * L::STAGE_BYTES;
    }
    __device__ __forceinline__ void copy(int item, ItemAt at, int from, int to, unsigned long long* bar) const {
        bulk_copy_to_shared(stage(item) + from, staged + at.tile * L::STAGED_BYTES + from, to - from, bar);
    }
    __device__ __forceinline__ void fetch(int item, ItemAt at) const {
        copy(item, at, 0, L::STAGE_BYTES, &barriers[item % L::STAGES]);
    }
    __device__ __forceinline__ void fetch_rows(int item, ItemAt at) const {
        copy(item, at, 0, L::ROWS_HALF, &barriers[0]);
    }
    __device__ __forceinline__ void fetch_transposed(int item, ItemAt at) const {
        copy(item, at, L::ROWS_HALF, L::STAGE_BYTES, &barriers[1]);
    }
    // The item's stage, or (L::SPLIT_STAGE) its first half, has landed.
    __device__ __forceinline__ void wait(int item) const {
        mbarrier_wait(&barriers[L::SPLIT_STAGE ? 0 : item % L::STAGES], (item / L::STAGES) % 2);
    }
    __device__ __forceinline__ void wait_transposed(int item) const { mbarrier_wait(&barriers[1], item % 2); }
};

// dK/dV's staged query tiles through a ring of three slots of one operand tile each
// (L::RING): an item's tiles r = 0..3 (dO, Q, dO^T with lse and delta, Q^T) are the
// ring's tiles i = 4 item + r, tile i in slot i % 3 on that slot's barrier (phase i / 3),
// fetched once tile i - 3 is used. With a producer warpgroup, the slots' "free"
// barriers follow their "landed" ones.
template <typename L>
struct QueryRing {
    static constexpr int SLOTS = L::RING_SLOTS;
    unsigned char* slots;  // L::q_tiles in shared memory
    const unsigned char* staged;  // the block's first staged tile
    unsigned long long* barriers;  // L::barriers

    __device__ __forceinline__ unsigned char* slot(int i) const { return slots + i % SLOTS * L::RING_SLOT; }
    __device__ __forceinline__ unsigned char* tile(int item, int r) const { return slot(4 * item + r); }
    // One thread: tile r of item's staged tile (at `at`) into its slot.
    __device__ __forceinline__ void fetch(int item, ItemAt at, int r) const {
        constexpr int TILE_M = L::TILE_M;
        const int from = r == 0 ? TILE_M : r == 1 ? 0 : r == 2 ? 3 * TILE_M : 2 * TILE_M;  // in the staged tile
        const int i = 4 * item + r;
        bulk_copy_to_shared(slot(i), staged + at.tile * L::STAGED_BYTES + from,
                            r == 2 ? TILE_M + L::ROWWISE_BYTES : TILE_M, &barriers[i % SLOTS]);  // (lse, delta)
    }
    __device__ __forceinline__ void wait(int item, int r) const {
        const int i = 4 * item + r;
        mbarrier_wait(&barriers[i % SLOTS], i / SLOTS % 2);
    }
    // PRODUCER: this warp is done with tile r of item.
    __device__ __forceinline__ void release(int item, int r) const {
        mbarrier_arrive_warp(&barriers[SLOTS + (4 * item + r) % SLOTS]);
    }
    // The producer warpgroup's first lane: every tile, once the tile three before it is free.
    __device__ __forceinline__ void produce(const QueryItems& items, ItemAt at, int n_items) const {
        for (int item = 0; item < n_items; ++item, at = items.after(at))
            for (int r = 0; r < 4; ++r) {
                const int i = 4 * item + r;
                if (i >= SLOTS) mbarrier_wait(&barriers[SLOTS + i % SLOTS], (i / SLOTS - 1) % 2);
                fetch(item, at, r);
            }
    }
};

// dQ's staged key tiles through STAGES whole stages (each on its barrier, one tile
// ahead) or, where one stage fits (L::SPLIT_STAGE), through its two parts: K and V on
// barriers[0], K^T on barriers[1]; with a producer warpgroup, their "free" barriers on
// barriers[2] and [3]. fetch*: one thread.
template <typename L>
struct KeyStages {
    unsigned char* tiles;  // L::kv_tiles in shared memory
    const unsigned char* staged;  // the block's first staged tile
    unsigned long long* barriers;  // L::barriers

    __device__ __forceinline__ unsigned char* stage(int tile) const {
        return tiles + tile % L::STAGES * L::STAGE_BYTES;
    }
    __device__ __forceinline__ void copy(int tile, int from, int to, unsigned long long* bar) const {
        bulk_copy_to_shared(stage(tile) + from, staged + (long long)tile * L::STAGED_BYTES + from, to - from, bar);
    }
    __device__ __forceinline__ void fetch(int tile) const {
        copy(tile, 0, L::STAGE_BYTES, &barriers[tile % L::STAGES]);
    }
    __device__ __forceinline__ void fetch_kv(int tile) const { copy(tile, 0, L::KV_PART_BYTES, &barriers[0]); }
    __device__ __forceinline__ void fetch_kt(int tile) const {
        copy(tile, L::KV_PART_BYTES, L::STAGE_BYTES, &barriers[1]);
    }
    // The tile's stage, or (L::SPLIT_STAGE) its K and V, has landed.
    __device__ __forceinline__ void wait(int tile) const {
        mbarrier_wait(&barriers[L::SPLIT_STAGE ? 0 : tile % L::STAGES], (tile / L::STAGES) % 2);
    }
    __device__ __forceinline__ void wait_kt(int tile) const { mbarrier_wait(&barriers[1], tile % 2); }
    // PRODUCER: this warp is done with the tile's K and V (its S and dP swapped), its K^T.
    __device__ __forceinline__ void release_kv() const { mbarrier_arrive_warp(&barriers[2]); }
    __device__ __forceinline__ void release_kt() const { mbarrier_arrive_warp(&barriers[3]); }
    // The producer warpgroup's first lane: tile t's parts once tile t - 1's are free.
    __device__ __forceinline__ void produce(int n_tiles) const {
        for (int tile = 0; tile < n_tiles; ++tile) {
            if (tile > 0) mbarrier_wait(&barriers[2], (tile - 1) % 2);
            fetch_kv(tile);
            if (tile > 0) mbarrier_wait(&barriers[3], (tile - 1) % 2);
            fetch_kt(tile);
        }
    }
};

}  // namespace cupyattn
