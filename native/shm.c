/* Control-block atomics for rings shared between processes (see shm.h). */
#define _GNU_SOURCE
#include "shm.h"

#include <errno.h>
#include <unistd.h>

uint64_t shm_load_acquire_u64(const void *p) { return __atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE); }

void shm_store_release_u64(void *p, uint64_t v) { __atomic_store_n((uint64_t *)p, v, __ATOMIC_RELEASE); }

uint8_t shm_load_acquire_u8(const void *p) { return __atomic_load_n((const uint8_t *)p, __ATOMIC_ACQUIRE); }

uint64_t shm_park(void *parked, uint64_t want) {
    return __atomic_exchange_n((uint64_t *)parked, want, __ATOMIC_SEQ_CST);
}

void shm_unpark(void *parked) { __atomic_store_n((uint64_t *)parked, 0, __ATOMIC_SEQ_CST); }

void shm_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

int shm_wake(void *parked, uint64_t value, int efd) {
    uint64_t *w = (uint64_t *)parked;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    /* A plain (relaxed) load first: while nobody is parked the line stays shared, no write. */
    uint64_t want = __atomic_load_n(w, __ATOMIC_RELAXED);
    if (want == 0 || value < want) return 0;
    if (!__atomic_compare_exchange_n(w, &want, 0, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) return 0;
    const uint64_t one = 1;
    ssize_t n;
    do {
        n = write(efd, &one, sizeof one);
    } while (n < 0 && errno == EINTR);
    /* EAGAIN: the counter is already at its maximum, so the parker is awake anyway. */
    if (n < 0) return errno == EAGAIN ? 1 : -errno;
    return 1;
}

int shm_store_and_wake(void *word, uint64_t value, void *parked, int efd) {
    __atomic_store_n((uint64_t *)word, value, __ATOMIC_RELEASE);
    return shm_wake(parked, value, efd);
}
