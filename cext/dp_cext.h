/* DualPace C kernels: public declarations (also the cffi cdef, see build.py).
 * Shapes are run-time arguments; nothing about a model is compiled in. */
#ifndef DP_CEXT_H
#define DP_CEXT_H
#include <stdint.h>
#include <stddef.h>

/* element types of q / KV / outputs */
enum { DP_F32 = 0, DP_BF16 = 1, DP_F16 = 2 };

/* instruction-set paths. DP_ISA_AVX512_BF16 is AVX-512 plus the bf16 dot product: decode
 * attention over bf16 q and KV uses it, everything else runs the AVX-512 bodies.
 * DP_ISA_AMX is that plus AMX tiles, which the dense projections of bf16 weights take from
 * DP_AMX_MIN_ROWS rows (linear_amx.c); dp_amx_enable() must have returned 1. */
enum { DP_ISA_SCALAR = 0, DP_ISA_AVX2 = 1, DP_ISA_AVX512 = 2, DP_ISA_AVX512_BF16 = 3,
       DP_ISA_AMX = 4 };

/* feature bits reported by dp_cpu_features() */
enum {
    DP_FEAT_AVX2 = 1, DP_FEAT_FMA = 2, DP_FEAT_F16C = 4, DP_FEAT_AVX512 = 8,
    DP_FEAT_AVX512_BF16 = 16, DP_FEAT_AMX_BF16 = 32
};

uint32_t dp_cpu_features(void);

/* 1 when this process may use AMX tiles (asks Linux for the tile state once; inherited by
 * forked children), 0 when the CPU or the kernel does not offer them. */
int dp_amx_enable(void);

/* Paged decode attention over one layer of an HND KV pool.
 * q [B, Hq, D], k/v [num_blocks, Hkv, BS, D], block_tables [B, max_blocks], seq_lens [B],
 * out [B, Hq, D] (q's dtype). Returns 0, or a negative code for an argument the caller
 * should have rejected (the Python wrapper validates everything first). */
int dp_paged_decode_attention(
    const void *q, int q_dtype, const void *k_cache, const void *v_cache, int kv_dtype,
    const int32_t *block_tables, int max_blocks, const int32_t *seq_lens, void *out,
    int B, int Hq, int Hkv, int D, int BS, int num_blocks, float scale,
    int isa, int num_threads);

/* 1 when the AVX512_BF16 path runs decode attention of these dtypes and shape with bf16 dot
 * products (attention_avx512bf16.c), 0 when it runs the AVX-512 route. */
int dp_attn_bf16_dot(int q_dtype, int kv_dtype, int G, int D);
/* 1 when the AMX path runs decode attention of these dtypes and shape on tiles
 * (attention_amx.c; asks the OS for the tile state on first use), 0 otherwise. */
int dp_attn_amx_applies(int q_dtype, int kv_dtype, int G, int D, int BS);
void dp_set_bf16_dot(int on);
int dp_get_bf16_dot(void);
int64_t dp_bf16_dot_probe(int64_t iters, double *sink);

/* Decode-shaped dense linear: out[M,N] (fp32) = x[M,K] (fp32) @ W[N,K]^T + bias[N]
 * (bias may be NULL); W fp32, bf16 or fp16; K a multiple of 16. Bound by reading W. */
int dp_linear(const float *x, int M, int K, const void *w, int w_dtype, int N,
              const float *bias, float *out, int isa, int num_threads);
/* 1 when dp_linear on ``isa`` runs x[M,K] @ W^T of this weight dtype as AMX tile products
 * (bf16 W, DP_AMX_MIN_ROWS rows or more, K a multiple of 32), 0 when as vector FMAs. */
int dp_linear_uses_amx(int isa, int w_dtype, int M, int K);

/* Prefill-sized GEMM (gemm.c): out[M,N] = add[M,N] + x[M,K] @ W[N,K]^T + bias[N], fp32
 * but W, which is fp32, bf16 or fp16 (then K a multiple of 16; computed in fp32 on W
 * widened exactly), w_dtype its DP_* code (add and bias may be NULL; add may be out
 * itself). Bound by FMAs: x is packed into panels per call, fp32 W read in place, a narrow
 * W widened a tile at a time. isa: AVX2 or AVX-512 (and the paths built on it); -1 for the
 * scalar path, -2 bad sizes or dtype, -5 out of memory. */
int dp_gemm(const float *x, int M, int K, const void *w, int w_dtype, int N,
            const float *bias, const float *add, float *out, int isa, int num_threads);

/* Causal prefill attention over one layer of an HND KV pool (prefill_attention.c): the new
 * rows q[query_start[b] .. query_start[b + 1]) of sequence b sit at positions
 * seq_lens[b] - rows .. seq_lens[b] - 1, their KV already appended, and each attends to
 * the sequence's tokens up to its own. q, out [T, Hq, D] fp32; k/v [num_blocks, Hkv, BS, D]
 * of kv_dtype; block_tables [B, max_blocks]; query_start [B + 1]. isa: AVX2 or AVX-512
 * (and the paths built on it); -1 for the scalar path, -2 bad sizes, -3 a length out of
 * range, -4 a block id out of range, -5 out of memory. */
int dp_prefill_attention(const float *q, const void *k_cache, const void *v_cache,
                         int kv_dtype, const int32_t *block_tables, int max_blocks,
                         const int32_t *query_start, const int32_t *seq_lens, float *out,
                         int B, int Hq, int Hkv, int D, int BS, int num_blocks, float scale,
                         int isa, int num_threads);

/* One decoder layer's dense stages for decode-sized batches (layer.c). Weights are the
 * packed tensors of model/weights.py (W [N, K] row-major, w_dtype); norms and biases fp32,
 * NULL when the model has none. cos/sin: the RoPE tables [max_positions, head_dim] fp32. */
typedef struct {
    int hidden, num_heads, num_kv_heads, head_dim, intermediate, max_positions, w_dtype;
    float eps;
    const float *cos, *sin;
} dp_layer_dims;

typedef struct {
    const float *input_norm;
    const void *qkv; const float *qkv_bias;
    const float *q_norm, *k_norm;
    const void *o; const float *o_bias;
    const float *post_norm;
    const void *gate_up, *down;
} dp_layer_weights;

/* Pre-attention: hidden [T, hidden] -> q_out [T, num_heads, head_dim], this step's K/V
 * written at slots of the HND cache (kv_dtype). scratch: T * (hidden + qkv width) floats.
 * 0, or -3 (a position outside the RoPE table) / -4 (a slot outside the cache) before
 * anything is written. */
int dp_layer_pre(const dp_layer_dims *m, const dp_layer_weights *w, const float *hidden, int T,
                 const int64_t *positions, const int64_t *slots, void *k_cache, void *v_cache,
                 int kv_dtype, int64_t num_blocks, int BS, float *q_out, float *scratch,
                 int isa, int num_threads);

/* Post-attention: hidden_out [T, hidden] = the layer's output for hidden and attn
 * [T, num_heads * head_dim]. scratch: T * (2 * hidden + 3 * intermediate) floats. */
int dp_layer_post(const dp_layer_dims *m, const dp_layer_weights *w, const float *hidden,
                  const float *attn, int T, float *hidden_out, float *scratch, int isa,
                  int num_threads);

/* out [T, N] = RMSNorm(x [T, K]) @ W[N, K]^T. scratch: T * K floats. */
int dp_norm_linear(const float *x, int T, int K, const float *norm, float eps, const void *w,
                   int w_dtype, int N, float *out, float *scratch, int isa, int num_threads);

/* One model's layers over one KV cache, for dp_decode_layers: the layer weights
 * [n_layers], each layer's K and V cache (HND, kv_dtype), the attention scale. */
typedef struct {
    const dp_layer_dims *m;
    const dp_layer_weights *layers;
    int n_layers;
    void **k_caches, **v_caches;
    int kv_dtype;
    int64_t num_blocks;
    int BS;
    float scale;
    /* the final RMSNorm and LM head [vocab, hidden] (lm_dtype), for a call asked for
     * logits; NULL when the caller never asks */
    const float *final_norm;
    const void *lm_head;
    int lm_dtype, vocab;
    /* the embedding [embed_rows, hidden] (embed_dtype, the model's activation dtype), for a
     * call given input ids; NULL when the caller never gives them. With a bf16 or f16
     * embedding the hidden rows are rounded to that dtype before the head. */
    const void *embed;
    int embed_dtype;
    int64_t embed_rows;
} dp_decode_model;

/* Every layer of a decode step (decode_layers.c): hidden [T, hidden] in place, through each
 * layer's pre-attention, paged attention over block_tables / seq_lens and post-attention.
 * scratch: T * (2 * num_heads * head_dim + max(hidden + qkv width, 2 * hidden + 3 *
 * intermediate)) floats. Threads per layer: own_threads while *peer_busy (NULL: never),
 * else all_threads. attn_seconds (may be NULL): the time in attention. Runs layers from
 * layer_begin; after a layer with more to go, returns early when any of the n_pause words
 * holds pause_value. *layers_done (may be NULL): the layers done so far, begin included
 * (n_layers when it ran to the end). logits (may be NULL): when the last layer is done, also
 * logits [T, vocab] = the LM head of the final RMSNorm of every row (dp_norm_linear, in the
 * same call: no Python between the layers and the head; needs dm's final_norm and lm_head);
 * greedy (may be NULL; needs logits): then also each row's argmax, as dp_argmax_rows gives it.
 * input_ids (may be NULL; needs layer_begin 0 and dm's embed): hidden's rows are first set to
 * the embedding rows of these ids (widened to fp32), in the same call too.
 * 0, dp_layer_pre's, dp_layer_post's, dp_norm_linear's or dp_argmax_rows' codes,
 * dp_paged_decode_attention's minus 10, -7 (an input id outside the embedding) or -2 (bad
 * arguments). */
int dp_decode_layers(const dp_decode_model *dm, float *hidden, int T, const int64_t *positions,
                     const int64_t *slots, const int32_t *block_tables, int max_blocks,
                     const int32_t *seq_lens, float *scratch, const uint32_t *peer_busy,
                     int own_threads, int all_threads, int isa, double *attn_seconds,
                     int layer_begin, uint32_t *const *pause_words, int n_pause,
                     uint32_t pause_value, int *layers_done, float *logits,
                     int64_t *greedy, const int64_t *input_ids);

/* The elementwise phases of the stages above alone, for prefill chunks whose projections run
 * as GEMMs elsewhere (model/native_stages.py). out [T, H] = RMSNorm(x [T, H]) * w. */
int dp_rms_norm_rows(const float *x, int T, int H, const float *w, float eps, float *out,
                     int num_threads);

/* Pre-attention after the QKV projection: qkv [T, (Hq + 2 Hkv) D] (k is normed and rotated
 * in place) -> q_out [T, Hq, D], K/V written at slots; errors as dp_layer_pre's. */
int dp_qkv_rope_append(const dp_layer_dims *m, const dp_layer_weights *w, float *qkv, int T,
                       const int64_t *positions, const int64_t *slots, void *k_cache,
                       void *v_cache, int kv_dtype, int64_t num_blocks, int BS, float *q_out,
                       int num_threads);

/* act [T, I] = SiLU(gate_up[:, :I]) * gate_up[:, I:]. */
int dp_silu_mul_rows(const float *gate_up, int T, int I, float *act, int isa, int num_threads);

/* Sampling's exponential race (sampling.c): out[r] = argmax_v probs[r, v] / E(keys[r], v)
 * with E the SplitMix64 Exp(1) noise of dualpace/sampling/sampler.py, exactly as torch
 * computes it there. probs: [R, V] fp32, row-major. 0, or -5 when out of memory. */
int dp_exponential_race(const float *probs, int R, int64_t V, const int64_t *keys, int64_t *out,
                        int num_threads);

/* Greedy sampling (argmax.c): out[r] = torch.argmax(x[r]) for x [R, V] fp32 row-major: the
 * first index of the maximum, or of the first NaN. 0, or -5 when out of memory. */
int dp_argmax_rows(const float *x, int R, int64_t V, int64_t *out, int isa, int num_threads);

/* Write T tokens' K/V ([T, Hkv, D], same dtype as the cache) at flat slots of one layer. */
int dp_kv_append(void *k_cache, void *v_cache, const void *k, const void *v,
                 const int64_t *slots, int T, int Hkv, int BS, int D, int elem_size,
                 int64_t num_blocks);

/* Copy whole blocks src_ids[i] of src into dst_ids[i] of dst (block_bytes each). */
int dp_copy_blocks(const void *src, void *dst, const int64_t *src_ids, const int64_t *dst_ids,
                   int n, int64_t block_bytes, int64_t src_blocks, int64_t dst_blocks,
                   int num_threads);

/* Vector-FMA throughput probe for benches: runs iters x (chains) FMAs of *lanes floats on
 * the calling thread with isa's vector width (DP_ISA_AVX2: 8; the AVX-512 ones: 16) and
 * returns how many it ran; *sink takes their sum (so nothing is optimized away). -1: the
 * ISA has no vector FMAs (scalar); -2: iters <= 0 or a null pointer. */
int64_t dp_fma_probe(int isa, int64_t iters, int *lanes, double *sink);

/* Memory-read bandwidth probe: sums n floats with num_threads threads. */
double dp_stream_read(const float *buf, int64_t n, int num_threads);

/* The kernels' thread team (team.c). Its idle members spin 50 us, then on up to 5 ms while
 * *word (the other tier's occupancy word) is 0, yielding the core at each check, then
 * sleep; word NULL: no other tier on these cores, up to 5 ms. set_gate returns once no
 * member reads the old word. */
void dp_team_set_gate(const uint32_t *word);
/* The two spin budgets in ns; -2 unless 0 <= short_ns <= long_ns. */
int dp_team_set_spin(int64_t short_ns, int64_t long_ns);
/* How often a helper has gone to sleep idle, and how many helpers there are. */
uint64_t dp_team_parks(void);
int dp_team_helpers(void);

/* Futex on a 32-bit word in (possibly shared) memory. */
uint32_t dp_atomic_load(const uint32_t *addr);
uint64_t dp_atomic_load64(const uint64_t *addr);
void dp_atomic_store64(uint64_t *addr, uint64_t value);
uint32_t dp_atomic_add(uint32_t *addr, uint32_t delta);  /* returns the new value */
void dp_atomic_store(uint32_t *addr, uint32_t value);
int dp_atomic_cas(uint32_t *addr, uint32_t expected, uint32_t desired);
/* 0: woken or the value already differed; 1: timed out; -1: error (errno). timeout_ns<0: forever */
int dp_futex_wait(uint32_t *addr, uint32_t expected, int64_t timeout_ns);
int dp_futex_wake(uint32_t *addr, int n);
/* Wait until *addr != value: spin up to spin_iters pause loops, then futex-wait.
 * 0: changed; 1: timed out. */
int dp_wait_while_equal(uint32_t *addr, uint32_t value, int spin_iters, int64_t timeout_ns);
#endif
