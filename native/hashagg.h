/* Hash aggregation over int64 keys: the table behind slashrt._native.HashAgg.
 *
 * Plain C with no Python dependency, so the hot loops can run with the GIL released.
 * Open addressing, linear probing, power-of-two capacity, an array of 24-byte slots
 * {key, count, val}.  Key 0 marks an empty slot; the real key 0 lives in a separate
 * cell (`zero`), so every int64 key (0, -1, INT64_MIN, ...) is allowed.
 *
 * Semantics per kind (all counts and integer sums wrap modulo 2^64 like int64 arithmetic):
 *   count: count += c                         (val stays 0)
 *   sum  : count += c; val += v
 *   mean : count += c; val += v               (the caller divides val by count)
 *   min  : count += c; val = fmin(val, v)     (floats: NaN is ignored unless every value is NaN)
 *   max  : count += c; val = fmax(val, v)
 * An update is a merge with c = 1, so update and merge share one code path.
 */
#ifndef SLASHRT_HASHAGG_H
#define SLASHRT_HASHAGG_H

#include <stddef.h>
#include <stdint.h>

enum { HA_COUNT = 0, HA_SUM = 1, HA_MIN = 2, HA_MAX = 3, HA_MEAN = 4 };

typedef union {
    int64_t i;
    double f;
} ha_val;

typedef struct {
    int64_t key; /* 0 = empty (key 0 itself is kept in ha_table.zero) */
    int64_t count;
    ha_val val;
} ha_slot;

typedef struct {
    ha_slot *slots;
    uint64_t cap;     /* power of two */
    uint64_t mask;    /* cap - 1 */
    uint64_t size;    /* occupied slots, not counting the zero cell */
    uint64_t grow_at; /* resize when size would exceed this */
    int has_zero;
    ha_slot zero;
    int kind;
    int is_float;
    void *map_base; /* non-NULL when slots come from mmap (large tables) */
    size_t map_len;
} ha_table;

/* All functions returning int return 0 on success and -1 when memory ran out
 * (the table is then unchanged for resize, or partially updated for apply). */
int ha_init(ha_table *t, int kind, int is_float);
void ha_free(ha_table *t);
int ha_clear(ha_table *t);
/* Drop every key but keep the capacity (and the memory, already faulted in): for a table
 * that is about to be refilled to a similar size. */
void ha_reset(ha_table *t); /* empties and shrinks back to the initial capacity */

/* Fold n rows into the table.  Pointers are byte addresses of the first element and
 * strides are in bytes (so strided numpy views work without copying; loads are
 * unaligned-safe).  counts == NULL means a count of 1 per row (an update); vals may be
 * NULL only for HA_COUNT. */
int ha_apply(ha_table *t, const char *keys, ptrdiff_t kstride, const char *counts,
             ptrdiff_t cstride, const char *vals, ptrdiff_t vstride, size_t n);

/* dst ⊔= src (CRDT join).  dst == src doubles every entry. */
int ha_merge_table(ha_table *dst, const ha_table *src);

uint64_t ha_len(const ha_table *t);
size_t ha_nbytes(const ha_table *t);

/* Write every entry (order unspecified); each output needs room for ha_len(t) items. */
void ha_export(const ha_table *t, int64_t *keys, int64_t *counts, ha_val *vals);

#endif
