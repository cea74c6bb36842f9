/* Futex wait/wake on 32-bit words in shared memory (Dense Assist handshake, ring doorbells).
 * Shared (not PRIVATE) futex ops: the word lives in a posix_ipc mapping used by several
 * processes. */
#include <errno.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "dp_cext.h"

uint32_t dp_atomic_load(const uint32_t *addr) {
    return __atomic_load_n(addr, __ATOMIC_ACQUIRE);
}
void dp_atomic_store(uint32_t *addr, uint32_t value) {
    __atomic_store_n(addr, value, __ATOMIC_RELEASE);
}
uint64_t dp_atomic_load64(const uint64_t *addr) {
    return __atomic_load_n(addr, __ATOMIC_ACQUIRE);
}
void dp_atomic_store64(uint64_t *addr, uint64_t value) {
    __atomic_store_n(addr, value, __ATOMIC_RELEASE);
}
uint32_t dp_atomic_add(uint32_t *addr, uint32_t delta) {
    return __atomic_add_fetch(addr, delta, __ATOMIC_ACQ_REL);
}
int dp_atomic_cas(uint32_t *addr, uint32_t expected, uint32_t desired) {
    return __atomic_compare_exchange_n(addr, &expected, desired, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE);
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int dp_futex_wait(uint32_t *addr, uint32_t expected, int64_t timeout_ns) {
    struct timespec ts, *tp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = timeout_ns / 1000000000LL;
        ts.tv_nsec = timeout_ns % 1000000000LL;
        tp = &ts;
    }
    const long r = syscall(SYS_futex, addr, FUTEX_WAIT, expected, tp, NULL, 0);
    if (r == 0) return 0;
    if (errno == EAGAIN || errno == EINTR) return 0; /* value differed / signal: re-check */
    if (errno == ETIMEDOUT) return 1;
    return -1;
}

int dp_futex_wake(uint32_t *addr, int n) {
    const long r = syscall(SYS_futex, addr, FUTEX_WAKE, n, NULL, NULL, 0);
    return r < 0 ? -1 : (int)r;
}

int dp_wait_while_equal(uint32_t *addr, uint32_t value, int spin_iters, int64_t timeout_ns) {
    for (int i = 0; i < spin_iters; i++) {
        if (__atomic_load_n(addr, __ATOMIC_ACQUIRE) != value) return 0;
        __builtin_ia32_pause();
    }
    const int64_t deadline = timeout_ns >= 0 ? now_ns() + timeout_ns : -1;
    while (__atomic_load_n(addr, __ATOMIC_ACQUIRE) == value) {
        int64_t left = -1;
        if (deadline >= 0) {
            left = deadline - now_ns();
            if (left <= 0) return 1;
        }
        if (dp_futex_wait(addr, value, left) < 0) return 1;
    }
    return 0;
}
