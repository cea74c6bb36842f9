/* Every layer of a decode step as one call: per layer the three calls a Python layer makes
 * (dp_layer_pre, the paged attention, dp_layer_post), none of the Python between them, and
 * when asked the final norm and LM head behind them. At
 * batch 1 on the llama.cpp comparison model (8 layers, 167 MB of fp32 weights a step) that
 * Python, its wrappers and the waits of the other thread while it ran were about a quarter
 * of a step's samples. Taken where no stage boundary is needed inside the step: the GPU
 * worker's decode steps when no Dense Assist route is reachable and no migration waits on a
 * layer, the CPU worker's Full-CPU route (§4.2). The thread count is chosen per layer as
 * runtime/thread_share.py chooses it: the worker's own share while the other tier is in a
 * step (*peer_busy != 0), every core otherwise. */
#include <string.h>
#include <time.h>
#include "dp_internal.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int dp_decode_layers(const dp_decode_model *dm, float *hidden, int T, const int64_t *positions,
                     const int64_t *slots, const int32_t *block_tables, int max_blocks,
                     const int32_t *seq_lens, float *scratch, const uint32_t *peer_busy,
                     int own_threads, int all_threads, int isa, double *attn_seconds,
                     int layer_begin, uint32_t *const *pause_words, int n_pause,
                     uint32_t pause_value, int *layers_done, float *logits,
                     int64_t *greedy, const int64_t *input_ids) {
    const dp_layer_dims *m = dm->m;
    const int Hq = m->num_heads, Hkv = m->num_kv_heads, D = m->head_dim;
    if (T <= 0 || dm->n_layers <= 0 || own_threads <= 0 || all_threads < own_threads ||
        layer_begin < 0 || layer_begin >= dm->n_layers || n_pause < 0 || (n_pause && !pause_words)
        || (logits && (!dm->final_norm || !dm->lm_head || dm->vocab <= 0)) || (greedy && !logits)
        || (input_ids && (layer_begin != 0 || !dm->embed)))
        return -2;
    if (input_ids) {
        /* the embedding rows here rather than a torch call before: its Python ran on caches
         * the last step's weight stream had flushed (~0.1 ms a step on a 2-core Zen 4) */
        const int H = m->hidden;
        const size_t esz = dm->embed_dtype == DP_F32 ? 4 : 2;
        for (int r = 0; r < T; r++)
            if (input_ids[r] < 0 || input_ids[r] >= dm->embed_rows) return -7;
        for (int r = 0; r < T; r++) {
            const char *row = (const char *)dm->embed + (size_t)input_ids[r] * H * esz;
            float *h = hidden + (int64_t)r * H;
            if (dm->embed_dtype == DP_F32) memcpy(h, row, (size_t)H * 4);
            else if (dm->embed_dtype == DP_BF16)
                for (int i = 0; i < H; i++) h[i] = dp_bf16_to_f32(((const uint16_t *)row)[i]);
            else
                for (int i = 0; i < H; i++) h[i] = dp_f16_to_f32(((const uint16_t *)row)[i]);
        }
    }
    float *q = scratch, *attn = q + (int64_t)T * Hq * D, *work = attn + (int64_t)T * Hq * D;
    double t_attn = 0;
    int l = layer_begin;
    for (; l < dm->n_layers; l++) {
        const int nt = peer_busy && __atomic_load_n(peer_busy, __ATOMIC_ACQUIRE)
                     ? own_threads : all_threads;
        int rc = dp_layer_pre(m, &dm->layers[l], hidden, T, positions, slots, dm->k_caches[l],
                              dm->v_caches[l], dm->kv_dtype, dm->num_blocks, dm->BS, q, work,
                              isa, nt);
        if (rc) return rc;
        const double t0 = now_s();
        rc = dp_paged_decode_attention(q, DP_F32, dm->k_caches[l], dm->v_caches[l],
                                       dm->kv_dtype, block_tables, max_blocks, seq_lens, attn,
                                       T, Hq, Hkv, D, dm->BS, (int)dm->num_blocks, dm->scale,
                                       isa, nt);
        t_attn += now_s() - t0;
        if (rc) return rc - 10;
        rc = dp_layer_post(m, &dm->layers[l], hidden, attn, T, hidden, work, isa, nt);
        if (rc) return rc;
        /* a pause word raised (a Dense Assist request waiting, runtime/assist.py): back to
         * the caller at this layer boundary, which serves it and calls again from l + 1 */
        int raised = 0;
        for (int i = 0; i < n_pause && l + 1 < dm->n_layers; i++)
            raised |= __atomic_load_n(pause_words[i], __ATOMIC_ACQUIRE) == pause_value;
        if (raised) { l++; break; }
    }
    if (attn_seconds) *attn_seconds = t_attn;
    if (layers_done) *layers_done = l;
    if (logits && l == dm->n_layers) {
        /* the head right behind the last layer: the team is still awake (a Python return
         * and call in between let it fall asleep, and on shared cores its wake-up waited
         * for whichever process had taken the core meanwhile) */
        const int nt = peer_busy && __atomic_load_n(peer_busy, __ATOMIC_ACQUIRE)
                     ? own_threads : all_threads;
        /* a bf16/f16 model's hidden rows cross into the head in its dtype, as they do when
         * the head is a call of its own (and on the Dense Assist routes): the same logits */
        const int64_t n = (int64_t)T * m->hidden;
        if (dm->embed && dm->embed_dtype == DP_BF16)
            for (int64_t i = 0; i < n; i++) hidden[i] = dp_bf16_to_f32(dp_f32_to_bf16(hidden[i]));
        else if (dm->embed && dm->embed_dtype == DP_F16)
            for (int64_t i = 0; i < n; i++) hidden[i] = dp_f16_to_f32(dp_f32_to_f16(hidden[i]));
        const int rc = dp_norm_linear(hidden, T, m->hidden, dm->final_norm, m->eps,
                                      dm->lm_head, dm->lm_dtype, dm->vocab, logits, work, isa,
                                      nt);
        if (rc || !greedy) return rc;
        /* greedy rows' tokens here too: torch's checks and the call's Python cost more than
         * the pass over the logits on a cold cache */
        return dp_argmax_rows(logits, T, dm->vocab, greedy, isa, nt);
    }
    return 0;
}
