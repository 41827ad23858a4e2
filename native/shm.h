/* Atomics on the control block of a ring shared between processes (slashrt/transport/shm.py).
 *
 * The control block holds words both processes touch: the receiver's `released` counter (the
 * credit word) and one "parked" word per side. The protocol needs three orderings, made
 * explicit here instead of being left to whatever the compiler and the CPU happen to do:
 *
 *   credit word    receiver: store with release after clearing the slot flags (ring.c);
 *                  sender: load with acquire before reusing those slots.
 *   slot flag      ring.c posts with a release store; here the consumer loads it with acquire.
 *   parking        Dekker's pattern, with no lost wake-up:
 *                      parker:  parked = W (seq_cst exchange)   waker: publish (release store)
 *                               re-check the condition                  seq_cst fence
 *                               sleep on the eventfd                    if parked: write eventfd
 *                  Either the parker's re-check sees the publication, or the waker's load sees
 *                  the parked word (both stores precede both loads in the single total order of
 *                  seq_cst operations), so a parker never sleeps through a publication. A waker
 *                  that finds nobody parked makes no system call: a busy pair never does.
 *
 * The parked word may carry a threshold (the sender parks until `released >= W`), so a sender
 * waiting for many credits is not woken for each one.
 */
#ifndef SLASHRT_SHM_H
#define SLASHRT_SHM_H

#include <stdint.h>

uint64_t shm_load_acquire_u64(const void *p);
void shm_store_release_u64(void *p, uint64_t v);
uint8_t shm_load_acquire_u8(const void *p);

/* Park: store `want` (nonzero) into the parked word with a seq_cst exchange; returns the old value. */
uint64_t shm_park(void *parked, uint64_t want);
/* Leave the parked state (seq_cst store of 0). */
void shm_unpark(void *parked);
/* A full (seq_cst) fence. */
void shm_fence(void);

/* After a publication: seq_cst fence, then if the parked word is nonzero and `value >= word`
 * (pass UINT64_MAX to wake any parker), take it back to 0 (compare-exchange, so of two wakers only
 * one writes) and add 1 to the eventfd `efd`. Returns 1 if it wrote, 0 if nobody was to be woken,
 * -errno if the write failed. */
int shm_wake(void *parked, uint64_t value, int efd);

/* The receiver's release: store `value` into the credit word with release, then shm_wake. */
int shm_store_and_wake(void *word, uint64_t value, void *parked, int efd);

#endif
