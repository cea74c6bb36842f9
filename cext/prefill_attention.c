/* Causal prefill attention driver (the items are prefill_attention_body.h's): work items
 * over (sequence, KV head, range of query vectors), the costliest first, claimed
 * one at a time by the thread team (team.c). An item owns its output rows outright (it sees every key they attend to), so
 * no merge step follows, and a row's result does not depend on the thread count. */
#include "dp_internal.h"

typedef struct {
    int64_t cost;  /* vectors x keys the last one sees: the causal work, to order by */
    int b, h, v_lo, v_hi;
} pfa_item;

static int by_cost_desc(const void *x, const void *y) {
    const int64_t a = ((const pfa_item *)x)->cost, b = ((const pfa_item *)y)->cost;
    return a < b ? 1 : a > b ? -1 : 0;
}

typedef struct {
    const dp_pfa_args *a; dp_pfa_item_fn fn; const pfa_item *it; int64_t items; int D;
    int64_t next;  /* the next item to claim, costliest first */
    int oom;
} pfa_job;

static void pfa_task(void *p, int t, int nth) {
    (void)t; (void)nth;
    pfa_job *j = p;
    /* the thread's kept buffer (page faults of a fresh one per call were measurable) */
    float *ws = dp_thread_scratch(sizeof(float) * (size_t)dp_pfa_ws_floats(j->D));
    if (!ws) {
        __atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t i; (i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) < j->items;)
        j->fn(j->a, j->it[i].b, j->it[i].h, j->it[i].v_lo, j->it[i].v_hi, ws);
}

int dp_prefill_attention(const float *q, const void *k_cache, const void *v_cache,
                         int kv_dtype, const int32_t *block_tables, int max_blocks,
                         const int32_t *query_start, const int32_t *seq_lens, float *out,
                         int B, int Hq, int Hkv, int D, int BS, int num_blocks, float scale,
                         int isa, int num_threads) {
    const int disa = dp_dense_isa(isa);
    const dp_pfa_item_fn fn = disa == DP_ISA_AVX512 ? dp_pfa_item_avx512
                            : disa == DP_ISA_AVX2 ? dp_pfa_item_avx2 : NULL;
    if (!fn) return -1;
    if (B <= 0 || Hkv <= 0 || Hq % Hkv || D <= 0 || D % 16 || BS <= 0 || num_blocks <= 0 ||
        !q || !k_cache || !v_cache || !block_tables || !query_start || !seq_lens || !out)
        return -2;
    const int G = Hq / Hkv, nt = num_threads > 0 ? num_threads : 1;
    int64_t items = 0;
    for (int b = 0; b < B; b++) {
        const int ql = query_start[b + 1] - query_start[b], L = seq_lens[b];
        if (query_start[b] < 0 || ql < 0 || L < ql || (int64_t)L > (int64_t)max_blocks * BS)
            return -3;
        for (int i = 0; i < (L + BS - 1) / BS; i++) {
            const int32_t id = block_tables[(int64_t)b * max_blocks + i];
            if (id < 0 || id >= num_blocks) return -4;
        }
        items += (int64_t)Hkv * (((int64_t)ql * G + DP_PFA_ITEM_VECS - 1) / DP_PFA_ITEM_VECS);
    }
    if (items == 0) return 0;
    pfa_item *it = malloc(sizeof(pfa_item) * (size_t)items);
    if (!it) return -5;
    int64_t n = 0;
    for (int b = 0; b < B; b++) {
        const int ql = query_start[b + 1] - query_start[b], ctx = seq_lens[b] - ql;
        for (int v0 = 0; v0 < ql * G; v0 += DP_PFA_ITEM_VECS) {
            const int v1 = v0 + DP_PFA_ITEM_VECS < ql * G ? v0 + DP_PFA_ITEM_VECS : ql * G;
            for (int h = 0; h < Hkv; h++)
                it[n++] = (pfa_item){(int64_t)(v1 - v0) * (ctx + (v1 - 1) / G + 1), b, h, v0, v1};
        }
    }
    qsort(it, (size_t)items, sizeof(pfa_item), by_cost_desc);
    const dp_pfa_args a = {q, out, k_cache, v_cache, kv_dtype, block_tables, max_blocks,
                           query_start, seq_lens, Hq, Hkv, D, BS, G, scale};
    pfa_job j = {&a, fn, it, items, D, 0, 0};
    dp_team_run(nt, pfa_task, &j);
    free(it);
    return j.oom ? -5 : 0;
}
