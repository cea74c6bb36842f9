/* KV writes for the CPU tier: per-token append at slot ids, and whole-block copies between
 * two pools (swap staging). Bounds are re-checked here so no call can write out of range. */
#include <string.h>
#include "dp_internal.h"

int dp_kv_append(void *k_cache, void *v_cache, const void *k, const void *v,
                 const int64_t *slots, int T, int Hkv, int BS, int D, int elem_size,
                 int64_t num_blocks) {
    const int64_t row = (int64_t)D * elem_size;
    for (int t = 0; t < T; t++)
        if (slots[t] < 0 || slots[t] >= num_blocks * BS) return -1;
    for (int t = 0; t < T; t++) {
        const int64_t blk = slots[t] / BS, off = slots[t] % BS;
        for (int h = 0; h < Hkv; h++) {
            const int64_t dst = ((blk * Hkv + h) * BS + off) * row;
            const int64_t src = ((int64_t)t * Hkv + h) * row;
            memcpy((char *)k_cache + dst, (const char *)k + src, (size_t)row);
            memcpy((char *)v_cache + dst, (const char *)v + src, (size_t)row);
        }
    }
    return 0;
}

typedef struct {
    const void *src; void *dst; const int64_t *src_ids, *dst_ids; int n; int64_t block_bytes;
} copy_job;

static void copy_task(void *p, int t, int nth) {
    const copy_job *j = p;
    for (int i = (int)((int64_t)j->n * t / nth); i < (int64_t)j->n * (t + 1) / nth; i++)
        memcpy((char *)j->dst + j->dst_ids[i] * j->block_bytes,
               (const char *)j->src + j->src_ids[i] * j->block_bytes, (size_t)j->block_bytes);
}

int dp_copy_blocks(const void *src, void *dst, const int64_t *src_ids, const int64_t *dst_ids,
                   int n, int64_t block_bytes, int64_t src_blocks, int64_t dst_blocks,
                   int num_threads) {
    for (int i = 0; i < n; i++)
        if (src_ids[i] < 0 || src_ids[i] >= src_blocks || dst_ids[i] < 0 ||
            dst_ids[i] >= dst_blocks)
            return -1;
    copy_job j = {src, dst, src_ids, dst_ids, n, block_bytes};
    dp_team_run(n > 4 && num_threads > 0 ? num_threads : 1, copy_task, &j);
    return 0;
}
