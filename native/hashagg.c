/* Hash aggregation table: a hash index over a log-structured store (see hashagg.h for the
 * layout, the epoch protocol and the semantics).
 *
 * Speed comes from four things:
 *  - rows are processed in blocks: first every key of the block is loaded and hashed,
 *    then the probe loop prefetches the index slot of the row HA_PF rows ahead (and, for
 *    tables larger than the caches, the log entry that slot points to, HA_PF2 rows ahead),
 *    so that many cache misses are in flight at once;
 *  - index slots are 8 bytes (tag + position), so a probe past a non-matching slot never
 *    touches the log, a sparse index for cache-resident tables is cheap, and new keys are
 *    appended to the log sequentially;
 *  - the probe loop is specialised per (kind, float, counts-given) at compile time;
 *  - large arrays are mmap'ed 2 MiB-aligned with MADV_HUGEPAGE, which cuts TLB misses on
 *    random access, come zeroed from the kernel without a memset, and the log grows with
 *    mremap (no copy) on Linux.
 */
#if defined(__linux__) || defined(__APPLE__) || defined(__unix__)
#define _GNU_SOURCE
#define HA_HAVE_MMAP 1
#include <sys/mman.h>
#endif

#include "hashagg.h"

#include <stdlib.h>
#include <string.h>

#if defined(HA_HAVE_MMAP)
#define HA_HAVE_DENSE 1
#include <pthread.h>
#endif

#if defined(__GNUC__)
#define HA_INLINE static inline __attribute__((always_inline))
#define HA_NOINLINE static __attribute__((noinline))
#define HA_LIKELY(x) __builtin_expect(!!(x), 1)
#define HA_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define HA_PREFETCH_W(p) __builtin_prefetch((p), 1, 3)
#define HA_PREFETCH_R(p) __builtin_prefetch((p), 0, 3)
#else
#define HA_PREFETCH_R(p) ((void)0)
#define HA_INLINE static inline
#define HA_NOINLINE static
#define HA_LIKELY(x) (x)
#define HA_UNLIKELY(x) (x)
#define HA_PREFETCH_W(p) ((void)0)
#endif

#define HA_MIN_CAP 64u /* index slots */
#define HA_MIN_LOG 32u /* log entries */
#define HA_MAX_LOG 0xffffffffull  /* a slot stores the log position in 32 bits */
#define HA_MAX_CAP (1ull << 33)     /* enough index for HA_MAX_LOG keys */
/* Tuned on a 2-core Xeon VM: PF 16..32 and BLOCK 1024 are all within noise; PF < 8
 * leaves DRAM latency exposed on tables much larger than the caches. */
#ifndef HA_BLOCK
#define HA_BLOCK 1024 /* rows hashed ahead of the probe loop */
#endif
#ifndef HA_PF
#define HA_PF 20 /* prefetch distance of index slots, in rows */
#endif
#ifndef HA_PF2
#define HA_PF2 10 /* prefetch distance of log entries (read from the slot prefetched earlier) */
#endif
#define HA_MMAP_MIN (4u << 20) /* arrays from this size on are mmap'ed */
#define HA_HUGE (2u << 20)     /* huge page size, for alignment */

/* murmur3's fmix64: a bijection whose bits all depend on all key bits, so dense or
 * strided key ranges still spread over the table. */
HA_INLINE uint64_t ha_mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

/* An index slot: (log position << 32) | tag, or 0 when empty.  The low bits of the hash
 * pick the home slot; the tag is its high half with bit 31 forced to 1: never 0, so a
 * single 32-bit comparison tells a match from both an empty slot and (but for one time in
 * 2^31) a slot of another key. */
HA_INLINE uint64_t ha_hash(int64_t k) { return ha_mix((uint64_t)k); }
HA_INLINE uint32_t tag_of(uint64_t h) { return (uint32_t)(h >> 32) | 0x80000000u; }
HA_INLINE uint64_t slot_make(uint32_t tag, uint64_t pos) { return pos << 32 | tag; }
HA_INLINE uint64_t slot_pos(uint64_t s) { return s >> 32; }
HA_INLINE int slot_has(uint64_t s, uint32_t tag) { return (uint32_t)s == tag; }

HA_INLINE int64_t ld64(const char *p) {
    int64_t x;
    memcpy(&x, p, 8); /* unaligned-safe: fields of packed records are not 8-aligned */
    return x;
}

HA_INLINE void prefetch_entry(const ha_entry *e) {
    /* a 24-byte entry may straddle two cache lines */
    HA_PREFETCH_W(e);
    HA_PREFETCH_W((const char *)e + sizeof(ha_entry) - 1);
}

/* Maximum load of the index: 0.7 keeps big (DRAM-resident) indexes compact, and a probe
 * past the home slot is then usually in the same cache line anyway.  Cache-resident tables
 * pay for every extra probe with a branch miss instead, and their index is cheap (8-byte
 * slots: 1000 keys take 64 KiB at load 3/16, less than the 96 KiB of 24-byte slots at
 * load 3/8 before the log), so they stay below 0.1875.  Measured on a 2-core Xeon VM,
 * 1000 keys in batches of 13440 rows: 3/8 ran 0.91x, 1/4 0.95x and 3/16 1.19x the speed
 * of the one-array table that preceded the log. */
#define HA_SMALL_CAP (1u << 16) /* 512 KiB of index */
static uint64_t grow_limit(uint64_t cap) {
    return cap <= HA_SMALL_CAP ? cap / 16 * 3 : cap / 10 * 7;
}

/* Smallest index capacity holding `live` keys within the load limit (0 if impossible). */
static uint64_t cap_for(uint64_t live) {
    uint64_t cap = HA_MIN_CAP;
    while (grow_limit(cap) < live) {
        if (cap >= HA_MAX_CAP) return 0;
        cap <<= 1;
    }
    return cap;
}

/* Tables whose index or log outgrow the L2 cache also prefetch log entries. */
#define HA_BIG_BYTES (1u << 20)
HA_INLINE int is_big(const ha_table *t) {
    return t->cap * sizeof(uint64_t) > HA_BIG_BYTES || t->n * sizeof(ha_entry) > HA_BIG_BYTES;
}

/* ---- memory ------------------------------------------------------------------------ */

/* Large blocks are mmap'ed at a 2 MiB boundary (so the whole block can be huge pages) with
 * the mapping starting exactly at the block, so mremap can grow it; small ones use malloc. */
static int mem_alloc(ha_mem *m, size_t bytes, int zero) {
    m->ptr = NULL;
    m->map_base = NULL;
    m->map_len = 0;
    if (bytes == 0) bytes = 8;
#ifdef HA_HAVE_MMAP
    if (bytes >= HA_MMAP_MIN) {
        size_t len = (bytes + HA_HUGE - 1) & ~(size_t)(HA_HUGE - 1);
        char *p = mmap(NULL, len + HA_HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
        if (p == MAP_FAILED) return -1;
        char *a = (char *)(((uintptr_t)p + HA_HUGE - 1) & ~(uintptr_t)(HA_HUGE - 1));
        if (a > p) munmap(p, (size_t)(a - p));                     /* unaligned head */
        if (a + len < p + len + HA_HUGE) munmap(a + len, (size_t)(p + len + HA_HUGE - (a + len)));
#ifdef MADV_HUGEPAGE
        madvise(a, len, MADV_HUGEPAGE); /* advisory: failure is harmless */
#endif
        m->ptr = a;
        m->map_base = a;
        m->map_len = len;
        return 0; /* fresh anonymous pages read as zero */
    }
#endif
    m->ptr = zero ? calloc(1, bytes) : malloc(bytes);
    return m->ptr ? 0 : -1;
}

static void mem_free(ha_mem *m) {
#ifdef HA_HAVE_MMAP
    if (m->map_base) {
        munmap(m->map_base, m->map_len);
        m->ptr = m->map_base = NULL;
        m->map_len = 0;
        return;
    }
#endif
    free(m->ptr);
    m->ptr = NULL;
}

static size_t mem_bytes(const ha_mem *m, size_t asked) { return m->map_base ? m->map_len : asked; }

/* Resize keeping the first `used` bytes. */
static int mem_resize(ha_mem *m, size_t used, size_t bytes) {
#if defined(HA_HAVE_MMAP) && defined(MREMAP_MAYMOVE)
    if (m->map_base && bytes >= HA_MMAP_MIN) {
        size_t len = (bytes + HA_HUGE - 1) & ~(size_t)(HA_HUGE - 1);
        void *p = mremap(m->map_base, m->map_len, len, MREMAP_MAYMOVE);
        if (p == MAP_FAILED) return -1;
        m->ptr = m->map_base = p;
        m->map_len = len;
        return 0;
    }
#endif
    if (!m->map_base && bytes < HA_MMAP_MIN) {
        void *p = realloc(m->ptr, bytes);
        if (!p) return -1;
        m->ptr = p;
        return 0;
    }
    ha_mem nm;
    if (mem_alloc(&nm, bytes, 0)) return -1;
    memcpy(nm.ptr, m->ptr, used < bytes ? used : bytes);
    mem_free(m);
    *m = nm;
    return 0;
}

static int index_alloc(ha_table *t, uint64_t cap) {
    ha_mem m;
    if (mem_alloc(&m, (size_t)cap * sizeof(uint64_t), 1)) return -1;
    mem_free(&t->idx_mem);
    t->idx_mem = m;
    t->idx = (uint64_t *)m.ptr;
    t->cap = cap;
    t->mask = cap - 1;
    t->grow_at = grow_limit(cap);
    return 0;
}

static int log_resize(ha_table *t, uint64_t log_cap) {
    if (log_cap > HA_MAX_LOG) log_cap = HA_MAX_LOG;
    if (log_cap < t->n) return -1;
    if (mem_resize(&t->log_mem, (size_t)t->n * sizeof(ha_entry), (size_t)log_cap * sizeof(ha_entry)))
        return -1;
    t->log = (ha_entry *)t->log_mem.ptr;
    t->log_cap = log_cap;
    return 0;
}

/* ---- init / free / clear / reset ----------------------------------------------------- */

static int table_alloc(ha_table *t, int kind, int is_float, uint64_t cap, uint64_t log_cap) {
    memset(t, 0, sizeof(*t));
    t->kind = kind;
    t->is_float = is_float;
    if (index_alloc(t, cap)) return -1;
    if (mem_alloc(&t->log_mem, (size_t)log_cap * sizeof(ha_entry), 0)) {
        mem_free(&t->idx_mem);
        return -1;
    }
    t->log = (ha_entry *)t->log_mem.ptr;
    t->log_cap = log_cap;
    return 0;
}

int ha_init(ha_table *t, int kind, int is_float) {
    return table_alloc(t, kind, is_float, HA_MIN_CAP, HA_MIN_LOG);
}

void ha_free(ha_table *t) {
    mem_free(&t->idx_mem);
    mem_free(&t->log_mem);
    t->idx = NULL;
    t->log = NULL;
    t->cap = t->mask = t->grow_at = t->live = 0;
    t->n = t->log_cap = t->frozen = 0;
}

/* The log is emptied; LSNs go on from where they were, so no old mark can be mistaken for
 * a position in the new log. */
static void log_restart(ha_table *t) {
    t->off += t->n;
    t->floor = t->off;
    t->n = 0;
    t->frozen = 0;
    t->live = 0;
    t->overflowed = 0;
}

int ha_clear(ha_table *t) {
    ha_table fresh;
    if (table_alloc(&fresh, t->kind, t->is_float, HA_MIN_CAP, HA_MIN_LOG)) return -1;
    fresh.off = fresh.floor = t->off + t->n;
    fresh.check_ovf = t->check_ovf;
    ha_free(t);
    *t = fresh;
    return 0;
}

/* Home-to-slot walk of key k, which must be in the index. */
HA_INLINE uint64_t slot_of(const ha_table *t, int64_t k, uint64_t h) {
    uint64_t p = h & t->mask;
    for (;;) {
        uint64_t s = t->idx[p];
        if (slot_has(s, tag_of(h)) && t->log[slot_pos(s)].key == k) return p;
        p = (p + 1) & t->mask;
    }
}

/* Zero the index.  A sparse index (far more slots than log entries) is cleared slot by
 * slot: first every entry's slot is looked up (into the entry's count field: the log is
 * being discarded), then those slots are zeroed.  Superseded entries find the slot of
 * their key's newest entry, which is then zeroed twice: harmless. */
static void index_zero(ha_table *t) {
    if (t->n * 16 >= t->cap) {
        memset(t->idx, 0, (size_t)t->cap * sizeof(uint64_t));
        return;
    }
    for (uint64_t i = 0; i < t->n; i++) {
        const int64_t k = t->log[i].key;
        t->log[i].count = (int64_t)slot_of(t, k, ha_hash(k));
    }
    for (uint64_t i = 0; i < t->n; i++) t->idx[(uint64_t)t->log[i].count] = 0;
}

void ha_reset(ha_table *t) {
    index_zero(t);
    log_restart(t);
}

/* ---- index (re)building ------------------------------------------------------------ */

/* Build an index of newcap slots over the log.  Entries are inserted in log order and a
 * later entry of a key replaces the earlier one, so every key ends up pointing to its
 * newest entry; when nothing is superseded (n == live) the keys are known distinct and
 * inserting only looks for the first empty slot.  Block + prefetch scheme as ha_apply. */
static int index_rebuild(ha_table *t, uint64_t newcap) {
    ha_mem m;
    if (mem_alloc(&m, (size_t)newcap * sizeof(uint64_t), 1)) return -1;
    uint64_t *dst = (uint64_t *)m.ptr;
    const uint64_t mask = newcap - 1;
    const ha_entry *log = t->log;
    const int distinct = t->n == t->live;
    uint64_t hb[HA_BLOCK];
    for (uint64_t b = 0; b < t->n; b += HA_BLOCK) {
        const int nb = (int)(t->n - b < HA_BLOCK ? t->n - b : HA_BLOCK);
        for (int j = 0; j < nb; j++) hb[j] = ha_hash(log[b + (uint64_t)j].key);
        for (int j = 0; j < nb && j < HA_PF; j++) HA_PREFETCH_W(&dst[hb[j] & mask]);
        for (int j = 0; j < nb; j++) {
            if (j + HA_PF < nb) HA_PREFETCH_W(&dst[hb[j + HA_PF] & mask]);
            const uint64_t h = hb[j];
            const uint32_t tag = tag_of(h);
            const uint64_t slot = slot_make(tag, b + (uint64_t)j);
            uint64_t p = h & mask;
            if (distinct) {
                while (dst[p] != 0) p = (p + 1) & mask;
            } else {
                const int64_t k = log[b + (uint64_t)j].key;
                while (dst[p] != 0 &&
                       (!slot_has(dst[p], tag) || log[slot_pos(dst[p])].key != k))
                    p = (p + 1) & mask;
            }
            dst[p] = slot;
        }
    }
    mem_free(&t->idx_mem);
    t->idx_mem = m;
    t->idx = dst;
    t->cap = newcap;
    t->mask = mask;
    t->grow_at = grow_limit(newcap);
    return 0;
}

/* Make room for `need` distinct keys without crossing the load limit. */
static int ha_reserve(ha_table *t, uint64_t need) {
    if (need <= t->grow_at) return 0;
    uint64_t cap = cap_for(need);
    if (!cap) return -1;
    return index_rebuild(t, cap);
}

static int compact_prefix(ha_table *t);

/* The log is full and an update must append: compact the frozen prefix when that drops at
 * least half of it (the superseded entries that are not superseded by the tail), else
 * double the log. */
HA_NOINLINE int log_make_room(ha_table *t) {
    const uint64_t dead = t->n - t->live;
    if (t->frozen > 0 && dead > t->n - t->frozen && (dead - (t->n - t->frozen)) * 2 >= t->frozen &&
        compact_prefix(t) == 0 && t->n < t->log_cap)
        return 0;
    if (t->log_cap >= HA_MAX_LOG) return -1;
    return log_resize(t, t->log_cap * 2);
}

/* ---- the specialised update / merge loop ------------------------------------------- */

/* Join (c, v) into an entry.  `upd`: (c, v) is one record (c == 1), not a partial: a NaN value
 * of a float sum or mean is then skipped (the record adds 0.0 and, for mean, is not counted),
 * while a NaN partial (inf + -inf) still propagates.  An integer sum leaving the int64 range
 * wraps, and with `chk` (a table that checks overflow) sets *ovf. */
HA_INLINE void combine(ha_entry *s, int64_t c, ha_val v, const int kind, const int isf, const int upd,
                       const int chk, int *ovf) {
    if (kind == HA_MEAN && isf && upd) c = v.f == v.f;
    s->count = (int64_t)((uint64_t)s->count + (uint64_t)c);
    switch (kind) {
    case HA_SUM:
    case HA_MEAN:
        if (isf) {
            if (!upd || v.f == v.f) s->val.f += v.f;
        } else {
            if (!chk)
                s->val.i = (int64_t)((uint64_t)s->val.i + (uint64_t)v.i);
            else if (HA_UNLIKELY(__builtin_add_overflow(s->val.i, v.i, &s->val.i)))
                *ovf = 1;
        }
        break;
    case HA_MIN:
        if (isf) {
            if (v.f < s->val.f || s->val.f != s->val.f) s->val.f = v.f; /* fmin */
        } else if (v.i < s->val.i) {
            s->val.i = v.i;
        }
        break;
    case HA_MAX:
        if (isf) {
            if (v.f > s->val.f || s->val.f != s->val.f) s->val.f = v.f; /* fmax */
        } else if (v.i > s->val.i) {
            s->val.i = v.i;
        }
        break;
    default:
        break;
    }
}

/* A new entry: the zero value of the kind joined with (c, v), which is (c, v) itself (a NaN
 * record of a float sum or mean: 0.0, and for mean a count of 0). */
HA_INLINE void put(ha_entry *s, int64_t k, int64_t c, ha_val v, const int kind, const int isf, const int upd) {
    s->key = k;
    s->count = c;
    if (kind == HA_COUNT) {
        s->val.i = 0;
    } else if ((kind == HA_SUM || kind == HA_MEAN) && isf && upd && v.f != v.f) {
        s->val.f = 0.0;
        if (kind == HA_MEAN) s->count = 0;
    } else {
        s->val = v;
    }
}

enum { RUN_DONE, RUN_ROOM, RUN_GROW };

/* Rows [j, m) of a block, until done or the table must change shape: RUN_ROOM (the log is
 * full and row j, not applied, must append) or RUN_GROW (row j was applied and the index
 * must grow).  Returns the row where it stopped in *jp.  The table's fields are kept in
 * locals (stores into the table could alias them otherwise) and written back on return. */
HA_INLINE int run_rows(ha_table *t, int *jp, const int m, const int64_t *kb, const int64_t *cb,
                       const ha_val *vb, const uint64_t *hb, const int kind, const int isf,
                       const int has_counts, const int general, const int chk) {
    uint64_t *const idx = t->idx;
    const uint64_t mask = t->mask;
    ha_entry *const log = t->log;
    const uint64_t grow_at = t->grow_at, log_cap = t->log_cap, frozen = t->frozen;
    uint64_t used = t->n, live = t->live;
    const int big = general && is_big(t);
    int rc = RUN_DONE, ovf = 0;
    int j = *jp;
    for (; j < m; j++) {
        if (general && j + HA_PF < m) HA_PREFETCH_W(&idx[hb[j + HA_PF] & mask]);
        if (big && j + HA_PF2 < m) {
            /* the slot of row j + PF2 was prefetched PF - PF2 rows ago: if it is the row's
             * key (tag match; nearly always when the key exists), fetch its entry */
            const uint64_t h2 = hb[j + HA_PF2];
            const uint64_t s2 = idx[h2 & mask];
            if (slot_has(s2, tag_of(h2))) prefetch_entry(&log[slot_pos(s2)]);
        }
        const int64_t k = kb[j];
        const int64_t c = has_counts ? cb[j] : 1;
        ha_val v;
        if (kind != HA_COUNT)
            v = vb[j];
        else
            v.i = 0;
        const uint64_t h = hb[j];
        const uint32_t tag = tag_of(h);
        uint64_t p = h & mask;
        for (;;) {
            const uint64_t s = idx[p];
            if (HA_LIKELY(slot_has(s, tag))) {
                const uint64_t pos = slot_pos(s);
                ha_entry *e = &log[pos];
                if (HA_LIKELY(e->key == k)) {
                    if (!general || HA_LIKELY(pos >= frozen)) {
                        combine(e, c, v, kind, isf, !has_counts, chk, &ovf);
                        break;
                    }
                    /* the newest entry is frozen: append the delta, repoint the index */
                    if (HA_UNLIKELY(used == log_cap)) {
                        rc = RUN_ROOM;
                        goto out;
                    }
                    put(&log[used], k, c, v, kind, isf, !has_counts);
                    idx[p] = slot_make(tag, used);
                    used++;
                    break;
                }
            } else if (s == 0) {
                /* a new key */
                if (HA_UNLIKELY(used == log_cap)) {
                    rc = RUN_ROOM;
                    goto out;
                }
                put(&log[used], k, c, v, kind, isf, !has_counts);
                idx[p] = slot_make(tag, used);
                used++;
                if (HA_UNLIKELY(++live > grow_at)) {
                    rc = RUN_GROW;
                    goto out;
                }
                break;
            }
            p = (p + 1) & mask;
        }
    }
out:
    t->n = used;
    t->live = live;
    t->overflowed |= ovf;
    *jp = j;
    return rc;
}

HA_INLINE int apply_core(ha_table *t, const char *kp, ptrdiff_t ks, const char *cp, ptrdiff_t cs,
                         const char *vp, ptrdiff_t vs, size_t n, const int kind, const int isf,
                         const int has_counts, const int chk) {
    int64_t kb[HA_BLOCK], cb[HA_BLOCK];
    ha_val vb[HA_BLOCK];
    uint64_t hb[HA_BLOCK];
    for (size_t b = 0; b < n; b += HA_BLOCK) {
        const int m = (int)(n - b < HA_BLOCK ? n - b : HA_BLOCK);
        const char *kq = kp + (ptrdiff_t)b * ks;
        for (int j = 0; j < m; j++) {
            int64_t k = ld64(kq + (ptrdiff_t)j * ks);
            kb[j] = k;
            hb[j] = ha_hash(k);
        }
        for (int j = 0; j < m && j < HA_PF; j++) HA_PREFETCH_W(&t->idx[hb[j] & t->mask]);
        if (kind != HA_COUNT) {
            const char *vq = vp + (ptrdiff_t)b * vs;
            for (int j = 0; j < m; j++) memcpy(&vb[j], vq + (ptrdiff_t)j * vs, 8);
        }
        if (has_counts) {
            const char *cq = cp + (ptrdiff_t)b * cs;
            for (int j = 0; j < m; j++) cb[j] = ld64(cq + (ptrdiff_t)j * cs);
        }
        int j = 0;
        for (;;) {
            /* the window path (no marks, cache-resident) gets a loop of its own */
            const int rc = (t->frozen || is_big(t))
                               ? run_rows(t, &j, m, kb, cb, vb, hb, kind, isf, has_counts, 1, chk)
                               : run_rows(t, &j, m, kb, cb, vb, hb, kind, isf, has_counts, 0, chk);
            if (rc == RUN_DONE) break;
            if (rc == RUN_ROOM) {
                /* row j is not applied yet: grow or compact the log, then retry it */
                if (log_make_room(t)) return -1;
            } else {
                /* grow in the middle of the block (not pessimistically before it, which
                 * would bloat small tables fed large batches) */
                if (t->cap >= HA_MAX_CAP || index_rebuild(t, t->cap << 1)) return -1;
                j++;
            }
            for (int q = j; q < m && q < j + HA_PF; q++) HA_PREFETCH_W(&t->idx[hb[q] & t->mask]);
        }
    }
    return 0;
}

#define HA_CASE_CHK(KIND, ISF, CHK)                                                           \
    return has_counts ? apply_core(t, kp, ks, cp, cs, vp, vs, n, KIND, ISF, 1, CHK)           \
                      : apply_core(t, kp, ks, cp, cs, vp, vs, n, KIND, ISF, 0, CHK)
#define HA_CASE(KIND, ISF) HA_CASE_CHK(KIND, ISF, 0)
/* integer sums: the overflow check is compiled only into the loops of tables that ask for it */
#define HA_CASE_INT_SUM(KIND)                                                                 \
    if (t->check_ovf) HA_CASE_CHK(KIND, 0, 1);                                                \
    HA_CASE_CHK(KIND, 0, 0)

int ha_apply(ha_table *t, const char *kp, ptrdiff_t ks, const char *cp, ptrdiff_t cs,
             const char *vp, ptrdiff_t vs, size_t n) {
    const int has_counts = cp != NULL;
    switch (t->kind) {
    case HA_COUNT:
        HA_CASE(HA_COUNT, 0);
    case HA_SUM:
        if (t->is_float) HA_CASE(HA_SUM, 1);
        HA_CASE_INT_SUM(HA_SUM);
    case HA_MIN:
        if (t->is_float) HA_CASE(HA_MIN, 1);
        HA_CASE(HA_MIN, 0);
    case HA_MAX:
        if (t->is_float) HA_CASE(HA_MAX, 1);
        HA_CASE(HA_MAX, 0);
    default: /* HA_MEAN */
        if (t->is_float) HA_CASE(HA_MEAN, 1);
        HA_CASE_INT_SUM(HA_MEAN);
    }
}

/* Fold log entries [from, to) of src into dst (as merged partials). */
static int apply_entries(ha_table *dst, const ha_entry *e, uint64_t count) {
    if (count == 0) return 0;
    const ptrdiff_t st = (ptrdiff_t)sizeof(ha_entry);
    return ha_apply(dst, (const char *)&e->key, st, (const char *)&e->count, st,
                    (const char *)&e->val, st, (size_t)count);
}

/* ---- compaction ------------------------------------------------------------------- */

/* Fold the frozen prefix [0, frozen) into one entry per key (the join of its entries, in
 * log order) in a fresh log, then re-append the tail [frozen, n) unchanged: tail keys that
 * also occur in the prefix get a superseding entry again, so the new log has the same
 * value per key, the same tail, and the tail keeps its LSNs.  The prefix becomes
 * log_floor: marks before it are invalid from now on. */
static int compact_prefix(ha_table *t) {
    if (t->frozen == 0) return 0;
    if (t->n == t->live) { /* nothing superseded: nothing to fold */
        return 0;
    }
    const uint64_t tail = t->n - t->frozen;
    uint64_t want = t->live + tail; /* an upper bound on the new log length */
    if (want > t->n) want = t->n;
    uint64_t cap = cap_for(t->live);
    if (!cap) return -1;
    uint64_t log_cap = HA_MIN_LOG;
    while (log_cap < want + want / 2) log_cap <<= 1; /* headroom before the next growth */
    ha_table nt;
    if (table_alloc(&nt, t->kind, t->is_float, cap, log_cap)) return -1;
    nt.check_ovf = t->check_ovf; /* the fold joins a key's entries of several epochs */
    if (apply_entries(&nt, t->log, t->frozen)) goto fail;
    const uint64_t k = nt.n;
    nt.frozen = k;
    if (apply_entries(&nt, t->log + t->frozen, tail)) goto fail;
    /* nt.n == k + tail, nt.live == t->live */
    nt.off = t->off + t->frozen - k; /* tail entries keep their LSNs */
    nt.floor = t->off + t->frozen;
    nt.overflowed |= t->overflowed;
    ha_free(t);
    *t = nt;
    return 0;
fail:
    ha_free(&nt);
    return -1;
}

int ha_compact(ha_table *t) {
    if (compact_prefix(t)) return -1;
    /* even when nothing was superseded: the prefix counts as folded from now on (the same
     * rule, whatever the log held) */
    if (t->floor < t->off + t->frozen) t->floor = t->off + t->frozen;
    return 0;
}

/* ---- join, export, epochs ------------------------------------------------------------- */

int ha_merge_table(ha_table *dst, const ha_table *src) {
    if (dst == src) {
        /* a ⊔ a: fold a snapshot of the log (folding the log into itself would read
         * entries already changed by the fold) */
        ha_mem copy;
        if (mem_alloc(&copy, (size_t)src->n * sizeof(ha_entry), 0)) return -1;
        memcpy(copy.ptr, src->log, (size_t)src->n * sizeof(ha_entry));
        int rc = apply_entries(dst, (const ha_entry *)copy.ptr, src->n);
        mem_free(&copy);
        return rc;
    }
    /* the join has at least as many keys as the larger side: size for that up front */
    if (ha_reserve(dst, dst->live > src->live ? dst->live : src->live)) return -1;
    return apply_entries(dst, src->log, src->n);
}

uint64_t ha_len(const ha_table *t) { return t->live; }

size_t ha_nbytes(const ha_table *t) {
    return sizeof(*t) + mem_bytes(&t->idx_mem, (size_t)t->cap * sizeof(uint64_t)) +
           mem_bytes(&t->log_mem, (size_t)t->log_cap * sizeof(ha_entry));
}

static void copy_out(const ha_entry *e, uint64_t count, int64_t *keys, int64_t *counts, ha_val *vals) {
    for (uint64_t i = 0; i < count; i++) {
        keys[i] = e[i].key;
        counts[i] = e[i].count;
        vals[i] = e[i].val;
    }
}

int ha_export(const ha_table *t, int64_t *keys, int64_t *counts, ha_val *vals) {
    if (t->n == t->live) {
        copy_out(t->log, t->n, keys, counts, vals);
        return 0;
    }
    /* some keys have several entries (deltas of several epochs): join them in a scratch
     * table, which appends each key once, in order of first appearance */
    ha_table nt;
    uint64_t cap = cap_for(t->live);
    if (!cap || table_alloc(&nt, t->kind, t->is_float, cap, t->live ? t->live : 1)) return -1;
    if (apply_entries(&nt, t->log, t->n)) {
        ha_free(&nt);
        return -1;
    }
    copy_out(nt.log, nt.n, keys, counts, vals);
    ha_free(&nt);
    return 0;
}

uint64_t ha_log_end(const ha_table *t) { return t->off + t->n; }
uint64_t ha_log_floor(const ha_table *t) { return t->floor; }

int ha_mark(ha_table *t, uint64_t *lsn) {
    /* compact the previous prefix when that drops at least half of it; the tail that is
     * being frozen now stays as it is, so delta(previous mark) still holds after this */
    const uint64_t dead = t->n - t->live;
    const uint64_t tail = t->n - t->frozen;
    if (t->frozen > 0 && dead > tail && (dead - tail) * 2 >= t->frozen && compact_prefix(t))
        return -1;
    t->frozen = t->n;
    *lsn = t->off + t->n;
    return 0;
}

int64_t ha_delta(const ha_table *t, uint64_t since, int64_t *keys, int64_t *counts, ha_val *vals) {
    if (since < t->floor || since > t->off + t->n) return -1;
    const uint64_t from = since - t->off;
    const uint64_t count = t->n - from;
    if (keys) copy_out(t->log + from, count, keys, counts, vals);
    return (int64_t)count;
}

int ha_ship(ha_table *t, int64_t *keys, int64_t *counts, ha_val *vals) {
    if (ha_export(t, keys, counts, vals)) return -1;
    const uint64_t shipped = t->live;
    /* keep the capacity for the next epoch, unless this one needed far less of it */
    const uint64_t cap = cap_for(shipped);
    const uint64_t logw = shipped > HA_MIN_LOG ? shipped : HA_MIN_LOG;
    int fresh_index = 0;
    if (cap && t->cap >= 8 * cap) {
        ha_mem m;
        if (mem_alloc(&m, (size_t)(2 * cap) * sizeof(uint64_t), 1) == 0) {
            mem_free(&t->idx_mem);
            t->idx_mem = m;
            t->idx = (uint64_t *)m.ptr;
            t->cap = 2 * cap;
            t->mask = t->cap - 1;
            t->grow_at = grow_limit(t->cap);
            fresh_index = 1;
        }
    }
    if (!fresh_index) index_zero(t);
    log_restart(t);
    if (t->log_cap >= 8 * logw) log_resize(t, 2 * logw); /* shrinking: failure is harmless */
    return 0;
}

/* ---- update from a view, with the dense path ------------------------------------------- */

/* Rows read for the first time (a ring slot the producer's core just wrote) come from
 * another core's cache or L3: prefetching this many elements ahead keeps several lines in
 * flight, across the 4 KiB page boundaries the hardware prefetcher stops at. */
#define HA_SEG_PF 64

#ifdef HA_HAVE_DENSE
/* Per-thread scratch of the dense path (a table is not thread-safe, but different tables may
 * be updated in different threads at once).  calloc'ed once per thread (about 512 KiB, of
 * which only the pages of the key ranges used are ever touched) and kept zeroed between
 * calls: a call resets exactly the counters it used. */
typedef struct {
    uint32_t cnt[HA_DENSE_MAX];
    uint32_t order[HA_DENSE_MAX + 1]; /* + 1: the branch-free append writes one past the last */
    ha_val val[HA_DENSE_MAX];
} dense_scratch;

static pthread_key_t dense_key;
static pthread_once_t dense_once = PTHREAD_ONCE_INIT;
static int dense_key_ok;

static void dense_key_init(void) { dense_key_ok = pthread_key_create(&dense_key, free) == 0; }

static dense_scratch *dense_get(void) {
    pthread_once(&dense_once, dense_key_init);
    if (!dense_key_ok) return NULL;
    dense_scratch *d = pthread_getspecific(dense_key);
    if (d == NULL) {
        d = calloc(1, sizeof(*d));
        if (d != NULL && pthread_setspecific(dense_key, d) != 0) {
            free(d);
            d = NULL;
        }
    }
    return d;
}

/* Count (and join the values of) n elements (keys at kp, stride ks; values at vp, stride vs)
 * into the dense arrays: slot key - lo (modulo 2^64).  The first appearance of a key appends
 * its slot to `order`.  Stops at the first key outside [lo, lo + HA_DENSE_MAX), and, when
 * `check` is set, at the first element whose time (at tp, stride ts) lies outside
 * [tlo, tlo + twidth] (then *tstop is set): returns the number of elements counted.  Keys and
 * times of packed records share cache lines, so the check reads nothing the count does not. */
HA_INLINE int64_t dense_fill(dense_scratch *d, uint32_t *nop, const char *kp, ptrdiff_t ks,
                             const char *vp, ptrdiff_t vs, const char *tp, ptrdiff_t ts, int64_t tlo,
                             uint64_t twidth, int *tstop, int64_t n, int64_t lo, const int kind,
                             const int check, const int chk, int *ovfp) {
    uint32_t *const cnt = d->cnt, *const order = d->order;
    ha_val *const val = d->val;
    uint32_t no = *nop;
    int64_t c = 0;
    int ovf = 0;
    for (; c < n; c++) {
        if (check) {
            HA_PREFETCH_R(kp + (c + HA_SEG_PF) * ks);
            if (HA_UNLIKELY((uint64_t)ld64(tp + c * ts) - (uint64_t)tlo > twidth)) {
                *tstop = 1;
                break;
            }
        }
        const uint64_t i = (uint64_t)ld64(kp + c * ks) - (uint64_t)lo;
        if (HA_UNLIKELY(i >= HA_DENSE_MAX)) break;
        if (kind == HA_COUNT) {
            if (HA_UNLIKELY(cnt[i]++ == 0)) order[no++] = (uint32_t)i;
            continue;
        }
        const int64_t v = ld64(vp + c * vs);
        if (HA_UNLIKELY(cnt[i]++ == 0)) {
            order[no++] = (uint32_t)i;
            val[i].i = v;
        } else if (kind == HA_SUM || kind == HA_MEAN) {
            if (!chk)
                val[i].i = (int64_t)((uint64_t)val[i].i + (uint64_t)v);
            else if (HA_UNLIKELY(__builtin_add_overflow(val[i].i, v, &val[i].i)))
                ovf = 1;
        } else if (kind == HA_MIN) {
            if (v < val[i].i) val[i].i = v;
        } else if (v > val[i].i) {
            val[i].i = v;
        }
    }
    *nop = no;
    *ovfp |= ovf;
    return c;
}

#define DENSE_KIND(KIND, CHECK) \
    dense_fill(d, nop, kp, ks, vp, vs, tp, ts, tlo, twidth, tstop, n, lo, KIND, CHECK, 0, ovf)
#define DENSE_SUM(KIND, CHECK)                                                                    \
    (chk ? dense_fill(d, nop, kp, ks, vp, vs, tp, ts, tlo, twidth, tstop, n, lo, KIND, CHECK, 1, ovf) \
         : DENSE_KIND(KIND, CHECK))

static int64_t dense_fill_any(dense_scratch *d, uint32_t *nop, const char *kp, ptrdiff_t ks,
                              const char *vp, ptrdiff_t vs, const char *tp, ptrdiff_t ts, int64_t tlo,
                              uint64_t twidth, int *tstop, int64_t n, int64_t lo, int kind, int chk,
                              int *ovf) {
    if (tp) {
        switch (kind) {
        case HA_COUNT: return DENSE_KIND(HA_COUNT, 1);
        case HA_SUM: return DENSE_SUM(HA_SUM, 1);
        case HA_MIN: return DENSE_KIND(HA_MIN, 1);
        case HA_MAX: return DENSE_KIND(HA_MAX, 1);
        default: return DENSE_SUM(HA_MEAN, 1);
        }
    }
    switch (kind) {
    case HA_COUNT: return DENSE_KIND(HA_COUNT, 0);
    case HA_SUM: return DENSE_SUM(HA_SUM, 0);
    case HA_MIN: return DENSE_KIND(HA_MIN, 0);
    case HA_MAX: return DENSE_KIND(HA_MAX, 0);
    default: return DENSE_SUM(HA_MEAN, 0);
    }
}

/* Fold the dense aggregate into the table in order of first appearance (as merge rows), and
 * zero the counters used. */
static int dense_fold(ha_table *t, dense_scratch *d, uint32_t no, int64_t lo) {
    int64_t kb[HA_BLOCK], cb[HA_BLOCK];
    ha_val vb[HA_BLOCK];
    int rc = 0;
    const ptrdiff_t st = 8;
    for (uint32_t b = 0; b < no; b += HA_BLOCK) {
        const uint32_t m = no - b < HA_BLOCK ? no - b : HA_BLOCK;
        for (uint32_t j = 0; j < m; j++) {
            const uint32_t i = d->order[b + j];
            kb[j] = (int64_t)((uint64_t)lo + i);
            cb[j] = d->cnt[i];
            vb[j] = d->val[i];
            d->cnt[i] = 0;
        }
        if (rc == 0)
            rc = ha_apply(t, (const char *)kb, st, (const char *)cb, st, (const char *)vb, st, m);
    }
    return rc;
}
#endif

static void view_minmax(const ha_view *v, int64_t *lo_out, int64_t *hi_out) {
    /* four independent (min, max) pairs, as columns_minmax_i64 */
    int64_t lo[4] = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};
    int64_t hi[4] = {INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN};
    const ptrdiff_t cs = v->col_stride;
    for (int64_t r = 0; r < v->rows; r++) {
        const char *row = v->base + r * v->row_stride;
        int64_t c = 0;
        for (; c + 4 <= v->cols; c += 4) {
            for (int u = 0; u < 4; u++) {
                const int64_t x = ld64(row + (c + u) * cs);
                lo[u] = x < lo[u] ? x : lo[u];
                hi[u] = x > hi[u] ? x : hi[u];
            }
        }
        for (; c < v->cols; c++) {
            const int64_t x = ld64(row + c * cs);
            lo[0] = x < lo[0] ? x : lo[0];
            hi[0] = x > hi[0] ? x : hi[0];
        }
    }
    for (int u = 1; u < 4; u++) {
        lo[0] = lo[u] < lo[0] ? lo[u] : lo[0];
        hi[0] = hi[u] > hi[0] ? hi[u] : hi[0];
    }
    *lo_out = lo[0];
    *hi_out = hi[0];
}

/* Below this many elements the min/max pass and the fold cost more than they save. */
#define HA_DENSE_MIN_ROWS 256
/* Elements per segment: a view is read a segment at a time (its times checked, then its keys
 * counted), so the second read of the segment's cache lines hits L1. */
#define HA_SEG 1024

/* The elements of a view from (r, c) on, as up to two views: the rest of row r, then the
 * rows after it. */
static void view_rest(const ha_view *v, int64_t r, int64_t c, ha_view *head, ha_view *tail) {
    *head = *v;
    head->base = v->base + r * v->row_stride + c * v->col_stride;
    head->rows = 1;
    head->cols = v->cols - c;
    *tail = *v;
    tail->base = v->base + (r + 1) * v->row_stride;
    tail->rows = v->rows - r - 1;
}


/* Number of leading elements of a segment with tlo <= time <= thi. */
static int64_t seg_within(const char *tp, ptrdiff_t ts, int64_t n, int64_t tlo, int64_t thi) {
    int64_t lo[4] = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};
    int64_t hi[4] = {INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN};
    int64_t c = 0;
    for (; c + 4 <= n; c += 4) {
        HA_PREFETCH_R(tp + (c + HA_SEG_PF) * ts);
        for (int u = 0; u < 4; u++) {
            const int64_t x = ld64(tp + (c + u) * ts);
            lo[u] = x < lo[u] ? x : lo[u];
            hi[u] = x > hi[u] ? x : hi[u];
        }
    }
    for (; c < n; c++) {
        const int64_t x = ld64(tp + c * ts);
        lo[0] = x < lo[0] ? x : lo[0];
        hi[0] = x > hi[0] ? x : hi[0];
    }
    int ok = 1;
    for (int u = 0; u < 4; u++) ok &= lo[u] >= tlo && hi[u] <= thi;
    if (ok) return n;
    c = 0;
    while (c < n) {
        const int64_t x = ld64(tp + c * ts);
        if (x < tlo || x > thi) break;
        c++;
    }
    return c;
}

/* How an update proceeds: densely from base `lo`, or by hashing. */
typedef struct {
    dense_scratch *d; /* NULL: hashing */
    int64_t lo;
    uint32_t no;      /* distinct keys counted densely and not folded yet */
} dense_state;

/* Choose dense (with a base) or hashing for the elements of kv from (r, c) on. */
static void dense_choose(dense_state *st, const ha_view *kv, int64_t r, int64_t c) {
    ha_view kh, kt;
    int64_t lo, hi, lo2, hi2;
    view_rest(kv, r, c, &kh, &kt);
    view_minmax(&kh, &lo, &hi);
    view_minmax(&kt, &lo2, &hi2);
    lo = lo2 < lo ? lo2 : lo;
    hi = hi2 > hi ? hi2 : hi;
    const uint64_t span = (uint64_t)hi - (uint64_t)lo;
    if (span >= HA_DENSE_MAX) {
        st->d = NULL;
        return;
    }
    /* centre the keys in the dense range: later updates may drift either way */
    st->lo = (int64_t)((uint64_t)lo - (HA_DENSE_MAX - 1 - span) / 2);
}

int ha_update_view_until(ha_table *t, const ha_view *kv, const ha_view *vv, const ha_view *tv,
                         int64_t tlo, int64_t thi, int64_t *done) {
    *done = 0;
    const int64_t n = kv->rows * kv->cols;
    if (n <= 0 || (tv && thi < tlo)) return 0; /* nothing, or an empty time range */
    dense_state st = {NULL, 0, 0};
#ifdef HA_HAVE_DENSE
    if (!t->is_float && n >= HA_DENSE_MIN_ROWS && n < (int64_t)UINT32_MAX && (st.d = dense_get()) != NULL) {
        if (t->dense_hint)
            st.lo = t->dense_lo; /* the range of the last update: no min/max pass */
        else
            dense_choose(&st, kv, 0, 0);
    }
#endif
    const ptrdiff_t ks = kv->col_stride, vs = vv ? vv->col_stride : 0, ts = tv ? tv->col_stride : 0;
    const uint64_t twidth = (uint64_t)thi - (uint64_t)tlo;
    int64_t applied = 0;
    int stop = 0, rc = 0;
    for (int64_t r = 0; r < kv->rows && !stop && rc == 0; r++) {
        for (int64_t c0 = 0; c0 < kv->cols && !stop; c0 += HA_SEG) {
            int64_t end = kv->cols - c0 < HA_SEG ? kv->cols : c0 + HA_SEG;
            /* counted densely, the times are checked in the counting loop; hashed, a
             * segment's times are checked first */
            if (tv && !st.d) {
                const int64_t ok = seg_within(tv->base + r * tv->row_stride + c0 * ts, ts, end - c0, tlo, thi);
                stop = c0 + ok < end;
                end = c0 + ok;
            }
            int64_t c = c0;
            while (c < end) {
                const char *kp = kv->base + r * kv->row_stride + c * ks;
                const char *vp = vv ? vv->base + r * vv->row_stride + c * vs : NULL;
#ifdef HA_HAVE_DENSE
                if (st.d) {
                    const char *tp = tv ? tv->base + r * tv->row_stride + c * ts : NULL;
                    int tstop = 0;
                    c += dense_fill_any(st.d, &st.no, kp, ks, vp, vs, tp, ts, tlo, twidth, &tstop, end - c,
                                        st.lo, t->kind, t->check_ovf, &t->overflowed);
                    if (tstop) {
                        stop = 1;
                        break;
                    }
                    if (c < end) {
                        /* a key outside the range: fold what was counted (the log keeps the
                         * order of the rows), then choose again for what is left */
                        rc = dense_fold(t, st.d, st.no, st.lo);
                        st.no = 0;
                        if (rc) break;
                        dense_choose(&st, kv, r, c);
                        if (tv && !st.d) { /* hashing from here: check this segment's rest */
                            const int64_t ok = seg_within(tv->base + r * tv->row_stride + c * ts, ts, end - c, tlo, thi);
                            stop = c + ok < end;
                            end = c + ok;
                        }
                    }
                    continue;
                }
#endif
                rc = ha_apply(t, kp, ks, NULL, 0, vp, vs, (size_t)(end - c));
                if (rc) break;
                c = end;
            }
            applied += c - c0;
            if (rc) break;
        }
    }
#ifdef HA_HAVE_DENSE
    if (st.d) {
        if (dense_fold(t, st.d, st.no, st.lo)) rc = -1;
        t->dense_hint = rc == 0;
        t->dense_lo = st.lo;
    } else {
        t->dense_hint = 0;
    }
#endif
    *done = applied;
    return rc;
}

int ha_update_view(ha_table *t, const ha_view *kv, const ha_view *vv) {
    int64_t done;
    return ha_update_view_until(t, kv, vv, NULL, 0, 0, &done);
}
