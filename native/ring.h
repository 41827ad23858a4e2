/* Ring slot footers: publish and poll runs of buffers with explicit memory ordering.
 *
 * The footer layout is slashrt/_buffer.py's: count u32, nbytes u32, seq u64, epoch u64,
 * magic u16, kind u8, 4 reserved bytes, flag u8 (the slot's last byte). The flag is
 * stored with release semantics after everything else and loaded with acquire semantics,
 * so a consumer that sees FULL sees the whole buffer, also across processes sharing the
 * ring (the one-machine analogue of an RDMA WRITE landing footer-last).
 */
#ifndef SLASHRT_RING_H
#define SLASHRT_RING_H

#include <stdint.h>

#define RING_FOOTER_SIZE 32
#define RING_MAGIC 0x5B5A
#define RING_EMPTY 0
#define RING_FULL 1
#define RING_KIND_DATA 0

/* Write footers of k consecutive slots starting at slot `first`, seq numbers seq0.., flag last. */
void ring_post(char *ring, int64_t slot_size, int64_t first, int64_t k, uint32_t count, uint32_t nbytes,
               uint64_t seq0, uint64_t epoch, uint8_t kind);

/* How many consecutive slots from `first` (at most max_k) hold posted, well-formed DATA buffers
 * with consecutive seq numbers from expected_seq and the same record count (stored in *count).
 * Stops before anything else (not posted, control, malformed, a different count): the caller
 * looks at that slot on its own. */
int64_t ring_poll_data(const char *ring, int64_t slot_size, int64_t first, int64_t max_k, uint64_t expected_seq,
                       int64_t record_size, uint32_t *count);

/* Clear the flags of k consecutive slots (the consumer hands them back). */
void ring_release(char *ring, int64_t slot_size, int64_t first, int64_t k);

#endif
