/* Hash aggregation over int64 keys: the table behind slashrt._native.HashAgg, used both as a
 * window slice and as a Slash State Backend (SSB) fragment.
 *
 * Plain C with no Python dependency, so the hot loops can run with the GIL released.
 *
 * ---- layout: a hash index over a log-structured store -----------------------------------
 *
 *   log   ha_entry[log_cap]: {key, count, val} (24 bytes) in insertion order; entries
 *         [0, n) are in use.  Entries are only ever appended (or changed in place).
 *   index uint64_t[cap]: open addressing, linear probing, power-of-two capacity, probing
 *         from the low bits of the key's hash (murmur3 fmix64).  A slot is 0 when empty,
 *         else (pos << 32) | tag: pos is the log position of the key's newest entry, tag
 *         the high half of the hash with bit 31 set (never 0).  One 32-bit comparison per
 *         probe tells a match from an empty slot and from other keys, so a probe past other
 *         keys never touches the log, and on a match the log entry read to check the key is
 *         the one the update writes anyway (a false tag match, one in 2^31, just probes on).
 *         Every int64 key is allowed (0, -1, INT64_MIN: no reserved empty key).
 *   A table holds at most 2^32 - 1 log entries.
 *
 * Each key has exactly one *newest* entry, the one the index points to; the value of a key
 * is the CRDT join of all its entries in the log.  Older entries of a key are *superseded*
 * (dead = n - live of them).
 *
 * ---- the epoch protocol: "changed since the mark" is the log tail -----------------------
 *
 * mark() freezes the log: entries [0, frozen) become read-only.  An update of key k then
 *   - finds k's newest entry at pos >= frozen: combines into it in place (read-modify-write);
 *   - finds it at pos < frozen (written before the mark): appends a NEW entry for k holding
 *     the zero value joined with the update, and repoints the index to it.  The old entry
 *     stays as it was (a frozen, possibly already shipped, delta);
 *   - does not find k: appends a new entry (same as above).
 * So after a mark every key changed since it has exactly one entry at a position >= the mark,
 * and that entry holds precisely the change since the mark (a CRDT delta: the join of the
 * updates since the mark; for sum/count/mean the sum of them, never the full value).  Hence
 * "changed since the mark" == "log tail from the mark", which ships as contiguous arrays,
 * and the join of the deltas of successive epochs is the value of one table that saw
 * everything.  Without marks (frozen == 0) every update is in place, as in a plain table.
 *
 * "The zero value joined with the update" is the same as storing the update itself:
 * count: (c, 0); sum/mean: (c, v) (the IEEE additive identity is -0.0, so even the sign of
 * a zero is kept); min/max: (c, v) (the identity is the largest/smallest int64, or NaN, which
 * fmin/fmax ignore).
 *
 * Positions are log sequence numbers (LSNs): monotonic over the table's life, never reused.
 * mark() returns the LSN of the end of the log.  delta(since) returns the entries from
 * LSN `since` to the end; `since` must be a value returned by mark() (or log_floor()).
 * Compaction (below) and reset/clear/ship re-base the physical log, so only LSNs >=
 * log_floor() are valid (older ones are refused with an error, never answered wrongly).
 *
 * ---- compaction, growth and shrinking -----------------------------------------------------
 *
 * Superseded entries all lie in the frozen prefix [0, frozen) (only entries before the mark
 * are ever superseded).  Compaction folds the prefix into one entry per key (the join of its
 * entries, in log order) and re-appends the tail [frozen, n) unchanged, at the same LSNs:
 * delta(m) for the latest mark m still holds, and log_floor() moves up to the end of the
 * folded prefix.  It runs
 *   - in mark(), before freezing, on the *previous* prefix (so delta(previous mark) stays
 *     valid after mark(): "mark, then ship the tail" works), and on a log that is full
 *     when an update appends, both only when it drops at least half of the prefix
 *     (amortised O(1) per append; memory tracks the live keys, not the history);
 *   - on request (ha_compact).
 * The index grows (x2) at load 0.1875 (up to 512 KiB of index, i.e. cache-resident) or 0.7,
 * the log by doubling (mremap on Linux).  ha_ship shrinks both when the shipped key set was
 * much smaller than the capacity; ha_clear shrinks to the minimum; ha_reset keeps the
 * capacity (a window slice about to be refilled).
 *
 * ---- semantics per kind (all counts and integer sums wrap modulo 2^64) --------------------
 *   count: count += c                         (val stays 0)
 *   sum  : count += c; val += v
 *   mean : count += c; val += v               (the caller divides val by count)
 *   min  : count += c; val = fmin(val, v)     (floats: NaN is ignored unless every value is NaN)
 *   max  : count += c; val = fmax(val, v)
 * An update is a merge with c = 1, so update and merge share one code path, except for NaN
 * (skipped, as pandas does): a NaN record of a float sum or mean adds nothing (a key whose
 * records are all NaN holds 0.0), and a mean does not count it (its count is of non-NaN
 * values, so such a key's mean is 0/0 = NaN).  Merged partials are joined as they are.
 * An integer sum (or mean) that leaves the int64 range sets `overflowed` in a table that checks
 * (check_ovf, see ha_table).
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
    int64_t key;
    int64_t count;
    ha_val val;
} ha_entry;

typedef struct {
    void *ptr;      /* NULL when nothing is allocated */
    void *map_base; /* non-NULL when the memory comes from mmap */
    size_t map_len;
} ha_mem;

typedef struct {
    /* index */
    uint64_t *idx;
    uint64_t cap;     /* power of two */
    uint64_t mask;    /* cap - 1 */
    uint64_t grow_at; /* grow the index when live would exceed this */
    uint64_t live;    /* distinct keys = entries the index points to */
    /* log */
    ha_entry *log;
    uint64_t n;       /* entries in use */
    uint64_t log_cap; /* entries allocated */
    uint64_t frozen;  /* entries [0, frozen) are read-only (physical position) */
    uint64_t off;     /* LSN of physical position 0 */
    uint64_t floor;   /* smallest valid `since` for ha_delta (an LSN) */
    int kind;
    int is_float;
    ha_mem idx_mem, log_mem;
    /* the dense path's guess for the next update: keys in [dense_lo, dense_lo + HA_DENSE_MAX)
     * (modulo 2^64), valid when dense_hint is set; a key outside it ends the guess */
    int64_t dense_lo;
    int dense_hint;
    /* check_ovf (set by the caller after ha_init): integer sums check for overflow, and
     * overflowed is set when one left the int64 range (and wrapped) since the table was last
     * emptied (clear, reset, ship): sticky, so a caller can check once, when it reads.
     * Without check_ovf the loops carry no check at all. */
    int check_ovf;
    int overflowed;
} ha_table;

/* All functions returning int return 0 on success and -1 when memory ran out (the table is
 * then unchanged, except that ha_apply may have folded part of its input). */
int ha_init(ha_table *t, int kind, int is_float);
void ha_free(ha_table *t);
/* Drop every key and shrink back to the initial capacity. */
int ha_clear(ha_table *t);
/* Drop every key but keep the capacity (and the memory, already faulted in): for a table
 * that is about to be refilled to a similar size.  Zeroes only the index slots in use
 * when the index is sparse. */
void ha_reset(ha_table *t);

/* Fold n rows into the table.  Pointers are byte addresses of the first element and
 * strides are in bytes (so strided numpy views work without copying; loads are
 * unaligned-safe).  counts == NULL means a count of 1 per row (an update); vals may be
 * NULL only for HA_COUNT. */
int ha_apply(ha_table *t, const char *keys, ptrdiff_t kstride, const char *counts,
             ptrdiff_t cstride, const char *vals, ptrdiff_t vstride, size_t n);

/* A 1-D or 2-D strided view: rows x cols elements at base + r*row_stride + c*col_stride (a
 * field of the records of a run of ring slots, read in place; 1-D: rows == 1). */
typedef struct {
    const char *base;
    int64_t rows, cols;
    ptrdiff_t row_stride, col_stride;
} ha_view;

/* An update (count 1 per element) from a view of keys and, unless the kind is count, a view
 * of values of the same shape (vals NULL for count).  Same result, in the same log order, as
 * ha_apply over the elements row by row.
 *
 * Dense path: integer tables whose keys in this call span fewer than HA_DENSE_MAX values
 * (a min/max pass over the keys tells) first aggregate the call into a per-thread dense array
 * indexed by key - base (one increment per element, no hashing or probing), noting each key
 * at its first appearance, then fold one (key, count, val) row per distinct key into the table
 * in that order.  The table remembers the base for its next update, which then skips the
 * min/max pass; a key outside the remembered range folds what was counted so far and the rest
 * of the call starts over with a min/max pass.  That fold goes through the ordinary merge path, so marks, deltas and the
 * log order of new keys are exactly those of the element-by-element update.  Float tables
 * (whose sums depend on the order of additions) and wide key ranges take the hash path. */
#define HA_DENSE_MAX (1u << 15)
int ha_update_view(ha_table *t, const ha_view *keys, const ha_view *vals);

/* ha_update_view of the longest prefix (in row-major order) of elements whose time (a view of
 * int64 times of the same shape) lies in [tlo, thi]; *done is set to its length.  The times are
 * checked a segment (HA_SEG elements) at a time just before its keys are counted, so the
 * check costs no extra pass over memory: what a window slice does with a batch that should fall
 * into it (the batch's remaining elements then go their own way).  tv NULL: every element. */
int ha_update_view_until(ha_table *t, const ha_view *keys, const ha_view *vals, const ha_view *times,
                         int64_t tlo, int64_t thi, int64_t *done);

/* dst ⊔= src (CRDT join).  dst == src doubles every entry. */
int ha_merge_table(ha_table *dst, const ha_table *src);

uint64_t ha_len(const ha_table *t); /* distinct keys */
size_t ha_nbytes(const ha_table *t);

/* Write every key once with its value (in order of first appearance in the log); each
 * output needs room for ha_len(t) items.  A straight copy of the log unless keys were
 * superseded after a mark (then the log is folded into a scratch table: -1 if that
 * fails for lack of memory). */
int ha_export(const ha_table *t, int64_t *keys, int64_t *counts, ha_val *vals);

/* ---- epoch protocol (see the top of this file) ---- */

/* Freeze the log and return the LSN of its end (may first compact the previous prefix). */
int ha_mark(ha_table *t, uint64_t *lsn);
uint64_t ha_log_end(const ha_table *t);   /* LSN of the end of the log */
uint64_t ha_log_floor(const ha_table *t); /* smallest valid `since` */
/* Entries from LSN `since` to the end: returns their number, or -1 when since is outside
 * [ha_log_floor, ha_log_end].  With out pointers NULL only counts. */
int64_t ha_delta(const ha_table *t, uint64_t since, int64_t *keys, int64_t *counts, ha_val *vals);
/* ha_export into the outputs (ha_len(t) items), then empty the table for the next epoch:
 * keeps the capacity unless it is far larger than what was shipped. */
int ha_ship(ha_table *t, int64_t *keys, int64_t *counts, ha_val *vals);
/* Fold the frozen prefix (drop superseded entries); keeps the tail and its LSNs. */
int ha_compact(ha_table *t);

#endif
