/* The C kernels' thread team: helper threads of our own instead of OpenMP's, for every
 * parallel call of the library (a decode step's dp_layer_pre, paged attention, dp_layer_post,
 * norm + linear head and argmax; the prefill GEMM and attention; block copies; issue 14
 * item 3).
 *
 * Why not OpenMP: a team member that finishes a region spins for a count libgomp fixes at
 * start-up (GOMP_SPINCOUNT), then sleeps on a futex. With no GPU both tiers compute on the
 * same cores, and neither count serves: a long spin (libgomp's default, ~8 ms on a Zen 4)
 * bridges the engine's ~0.65 ms between one stream's decode steps, worth 8% served single
 * stream on 2 cores (bench/serve_ab.py, 7 of 8 pairs), but under load it takes the core the
 * other tier's step needs (bench/compare_policies.py: dualpace's sustainable rate 6.78 ->
 * 5.09 req/s); the short spin the supervisor sets (~85 us) lets the second thread fall
 * asleep between every two steps of a single stream, and on a VM its wake-up waits for the
 * hypervisor. Here an idle member spins for short_ns always, and on up to long_ns only while
 * the gate word (the other tier's occupancy word, runtime/thread_share.py) says the other
 * tier is not in a step, yielding the core at each check (spin_policy); with no gate (cores
 * this process owns) up to long_ns. Then it parks on a futex, woken by the next dispatch.
 * Measured on a 2-core Zen 5 against OpenMP with the short spin (bench/compare_policies.py
 * --policies dualpace,gated --rates 2,8 --num-requests 60, two sweeps each, interleaved):
 * dualpace's normalized latency at 8 req/s 0.0027-0.0037 -> 0.0021-0.0024 s/token, gated's
 * 0.021-0.023 -> 0.008-0.012; without the yield gated's went to 0.028-0.030 (a worker woken
 * on the spinner's core waited out its time slice). Served single stream: the same within
 * noise there (bench/serve_ab.py, 1.01-1.02x).
 *
 * One dispatcher at a time: a call made while another thread (or the team's own task)
 * holds the team runs on its caller alone (nth = 1). Every kernel's result is independent
 * of its thread count (dp_claim_rows' 16-row units), so that changes nothing but speed. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "dp_internal.h"

#define NTH_BITS 10
#define NTH_MASK ((1u << NTH_BITS) - 1)
#define SPIN_CHECK 32  /* pause iterations between clock reads (~1 us on Zen 4) */

typedef struct __attribute__((aligned(64))) { uint32_t v; } line_u32;

static struct {
    pthread_mutex_t lock;
    int helpers;                    /* started helpers, ids 1 .. helpers */
    uint32_t seen0[DP_TEAM_MAX];    /* the dispatch word each helper starts from */
    line_u32 word;                  /* generation << NTH_BITS | team size */
    line_u32 sleepers;              /* helpers parked on word */
    line_u32 pending;               /* members of the running task not yet done */
    line_u32 main_sleeping;         /* the dispatcher parked on pending */
    line_u32 bar_count, bar_gen, bar_sleepers;
    line_u32 gate_users;            /* members reading *gate right now */
    dp_team_fn fn;
    void *arg;
    const uint32_t *gate;
    int64_t short_ns, long_ns;
    uint64_t parks;                 /* helpers' parks in the idle wait */
    int atfork_set;
} T = {PTHREAD_MUTEX_INITIALIZER, .short_ns = 50000, .long_ns = 5000000};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

enum { PARK, SPIN, SPIN_YIELDING };

/* What a waiter that has spun `ns` does next (the policy above). Past short_ns it yields at
 * each check: a thread that has just been woken on its core (the other tier's worker before
 * it can mark itself busy, the engine) runs at once instead of waiting out the spinner's
 * time slice, which the kernel's scheduler (EEVDF) does not cut short for a waking task. */
static int spin_policy(int64_t ns) {
    if (ns < __atomic_load_n(&T.short_ns, __ATOMIC_RELAXED)) return SPIN;
    if (ns >= __atomic_load_n(&T.long_ns, __ATOMIC_RELAXED)) return PARK;
    __atomic_add_fetch(&T.gate_users.v, 1, __ATOMIC_SEQ_CST);
    const uint32_t *g = __atomic_load_n(&T.gate, __ATOMIC_SEQ_CST);
    const int other_busy = g && __atomic_load_n(g, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&T.gate_users.v, 1, __ATOMIC_SEQ_CST);
    return other_busy ? PARK : SPIN_YIELDING;
}

/* Until *w != v: spin while spin_policy says so, then park on the futex, counted in *sleepers so
 * that the waker knows to wake (the store and the count are seq_cst on both sides), and in
 * *parks when given. */
static void team_wait(uint32_t *w, uint32_t v, uint32_t *sleepers, uint64_t *parks) {
    int64_t t0 = 0;
    for (unsigned i = 1;; i++) {
        if (__atomic_load_n(w, __ATOMIC_ACQUIRE) != v) return;
        __builtin_ia32_pause();
        if (i % SPIN_CHECK == 0) {
            const int64_t now = now_ns();
            if (!t0) {
                t0 = now;
                continue;
            }
            const int next = spin_policy(now - t0);
            if (next == PARK) break;
            if (next == SPIN_YIELDING) sched_yield();
        }
    }
    if (parks) __atomic_add_fetch(parks, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(w, __ATOMIC_SEQ_CST) == v)
        syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
    __atomic_sub_fetch(sleepers, 1, __ATOMIC_SEQ_CST);
}

/* After a seq_cst store to *w: wake its parked waiters, if any. */
static void team_signal(uint32_t *w, const uint32_t *sleepers) {
    if (__atomic_load_n(sleepers, __ATOMIC_SEQ_CST))
        syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void *helper_main(void *p) {
    const int id = (int)(intptr_t)p;
    uint32_t seen = T.seen0[id - 1];
    for (;;) {
        team_wait(&T.word.v, seen, &T.sleepers.v, &T.parks);
        /* a member of this generation: the dispatcher waits for it, so fn, arg and the word
         * stay as they are until it is done; not a member: it reads nothing else */
        seen = __atomic_load_n(&T.word.v, __ATOMIC_ACQUIRE);
        const int nth = (int)(seen & NTH_MASK);
        if (id >= nth) continue;
        T.fn(T.arg, id, nth);
        if (__atomic_sub_fetch(&T.pending.v, 1, __ATOMIC_SEQ_CST) == 0)
            team_signal(&T.pending.v, &T.main_sleeping.v);
    }
    return NULL;
}

/* A forked child has none of its parent's helpers (multiprocessing's fork start method). */
static void after_fork_child(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    T.lock = fresh;
    T.helpers = 0;
    T.sleepers.v = T.pending.v = T.main_sleeping.v = 0;
    T.bar_count.v = T.bar_sleepers.v = T.gate_users.v = 0;
}

/* Helpers up to n - 1; returns the team size it can have (fewer when a thread would not
 * start). Called with the lock held, so the word is stable. */
static int grow(int n) {
    if (!T.atfork_set) {
        pthread_atfork(NULL, NULL, after_fork_child);
        T.atfork_set = 1;
    }
    while (T.helpers < n - 1) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        T.seen0[T.helpers] = T.word.v;
        const int rc = pthread_create(&th, &attr, helper_main, (void *)(intptr_t)(T.helpers + 1));
        pthread_attr_destroy(&attr);
        if (rc) break;
        T.helpers++;
    }
    return T.helpers + 1 < n ? T.helpers + 1 : n;
}

void dp_team_run(int nt, dp_team_fn fn, void *arg) {
    if (nt > DP_TEAM_MAX) nt = DP_TEAM_MAX;
    if (nt <= 1 || pthread_mutex_trylock(&T.lock)) {
        fn(arg, 0, 1);
        return;
    }
    nt = grow(nt);
    if (nt <= 1) {
        pthread_mutex_unlock(&T.lock);
        fn(arg, 0, 1);
        return;
    }
    T.fn = fn;
    T.arg = arg;
    __atomic_store_n(&T.bar_count.v, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&T.pending.v, (uint32_t)(nt - 1), __ATOMIC_SEQ_CST);
    const uint32_t gen = (T.word.v >> NTH_BITS) + 1;
    __atomic_store_n(&T.word.v, (gen << NTH_BITS) | (uint32_t)nt, __ATOMIC_SEQ_CST);
    team_signal(&T.word.v, &T.sleepers.v);
    fn(arg, 0, nt);
    for (uint32_t p; (p = __atomic_load_n(&T.pending.v, __ATOMIC_ACQUIRE)) != 0;)
        team_wait(&T.pending.v, p, &T.main_sleeping.v, NULL);
    pthread_mutex_unlock(&T.lock);
}

void dp_team_barrier(int nth) {
    if (nth <= 1) return;
    const uint32_t g = __atomic_load_n(&T.bar_gen.v, __ATOMIC_SEQ_CST);
    if (__atomic_add_fetch(&T.bar_count.v, 1, __ATOMIC_SEQ_CST) == (uint32_t)nth) {
        __atomic_store_n(&T.bar_count.v, 0, __ATOMIC_SEQ_CST);
        __atomic_store_n(&T.bar_gen.v, g + 1, __ATOMIC_SEQ_CST);
        team_signal(&T.bar_gen.v, &T.bar_sleepers.v);
    } else {
        team_wait(&T.bar_gen.v, g, &T.bar_sleepers.v, NULL);
    }
}

void dp_team_set_gate(const uint32_t *word) {
    __atomic_store_n(&T.gate, word, __ATOMIC_SEQ_CST);
    /* a member that loaded the old pointer may still read through it: done when none is */
    while (__atomic_load_n(&T.gate_users.v, __ATOMIC_SEQ_CST)) __builtin_ia32_pause();
}

int dp_team_set_spin(int64_t short_ns, int64_t long_ns) {
    if (short_ns < 0 || long_ns < short_ns) return -2;
    __atomic_store_n(&T.short_ns, short_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&T.long_ns, long_ns, __ATOMIC_RELAXED);
    return 0;
}

uint64_t dp_team_parks(void) { return __atomic_load_n(&T.parks, __ATOMIC_RELAXED); }

int dp_team_helpers(void) {
    pthread_mutex_lock(&T.lock);
    const int n = T.helpers;
    pthread_mutex_unlock(&T.lock);
    return n;
}
