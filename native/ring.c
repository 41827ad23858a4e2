/* Footers of ring slots, written and read with release/acquire ordering (see ring.h). */
#include "ring.h"

#include <string.h>

struct footer {
    uint32_t count;
    uint32_t nbytes;
    uint64_t seq;
    uint64_t epoch;
    uint16_t magic;
    uint8_t kind;
    uint8_t reserved[4];
    uint8_t flag;
} __attribute__((packed));

_Static_assert(sizeof(struct footer) == RING_FOOTER_SIZE, "footer layout");

void ring_post(char *ring, int64_t slot_size, int64_t first, int64_t k, uint32_t count, uint32_t nbytes,
               uint64_t seq0, uint64_t epoch, uint8_t kind) {
    for (int64_t i = 0; i < k; i++) {
        char *end = ring + (first + i + 1) * slot_size;
        struct footer f = {count, nbytes, seq0 + (uint64_t)i, epoch, RING_MAGIC, kind, {0}, RING_EMPTY};
        memcpy(end - RING_FOOTER_SIZE, &f, RING_FOOTER_SIZE - 1); /* all but the flag */
        __atomic_store_n((uint8_t *)(end - 1), (uint8_t)RING_FULL, __ATOMIC_RELEASE);
    }
}

int64_t ring_poll_data(const char *ring, int64_t slot_size, int64_t first, int64_t max_k, uint64_t expected_seq,
                       int64_t record_size, uint32_t *count) {
    const int64_t capacity = slot_size - RING_FOOTER_SIZE;
    int64_t n = 0;
    for (; n < max_k; n++) {
        const char *end = ring + (first + n + 1) * slot_size;
        if (__atomic_load_n((const uint8_t *)(end - 1), __ATOMIC_ACQUIRE) != RING_FULL) break;
        struct footer f;
        memcpy(&f, end - RING_FOOTER_SIZE, RING_FOOTER_SIZE);
        if (f.magic != RING_MAGIC || f.kind != RING_KIND_DATA || f.seq != expected_seq + (uint64_t)n ||
            (int64_t)f.nbytes > capacity || (int64_t)f.count * record_size != (int64_t)f.nbytes)
            break;
        if (n == 0)
            *count = f.count;
        else if (f.count != *count)
            break;
    }
    return n;
}

void ring_release(char *ring, int64_t slot_size, int64_t first, int64_t k) {
    for (int64_t i = 0; i < k; i++)
        __atomic_store_n((uint8_t *)(ring + (first + i + 1) * slot_size - 1), (uint8_t)RING_EMPTY, __ATOMIC_RELEASE);
}
