/* Hash aggregation table (see hashagg.h for the semantics).
 *
 * Speed comes from three things:
 *  - rows are processed in blocks: first every key of the block is loaded and hashed,
 *    then the probe loop prefetches the slot of the row HA_PF rows ahead, so that many
 *    cache misses are in flight at once when the table is far larger than the caches;
 *  - the probe loop is specialised per (kind, float, counts-given) at compile time;
 *  - large tables are mmap'ed 2 MiB-aligned with MADV_HUGEPAGE, which cuts TLB misses on
 *    random access, and come zeroed (= empty) from the kernel without a memset.
 */
#if defined(__linux__) || defined(__APPLE__) || defined(__unix__)
#define _GNU_SOURCE
#define HA_HAVE_MMAP 1
#include <sys/mman.h>
#endif

#include "hashagg.h"

#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#define HA_INLINE static inline __attribute__((always_inline))
#define HA_LIKELY(x) __builtin_expect(!!(x), 1)
#define HA_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define HA_PREFETCH_W(p) __builtin_prefetch((p), 1, 3)
#else
#define HA_INLINE static inline
#define HA_LIKELY(x) (x)
#define HA_UNLIKELY(x) (x)
#define HA_PREFETCH_W(p) ((void)0)
#endif

#define HA_MIN_CAP 64u
#define HA_MAX_CAP (1ull << 40)
/* Tuned on a 2-core Xeon VM: PF 16..32 and BLOCK 1024 are all within noise; PF < 8
 * leaves DRAM latency exposed on tables much larger than the caches. */
#ifndef HA_BLOCK
#define HA_BLOCK 1024 /* rows hashed ahead of the probe loop */
#endif
#ifndef HA_PF
#define HA_PF 20 /* prefetch distance in rows: enough misses in flight to cover DRAM latency */
#endif
#define HA_MMAP_MIN (4u << 20) /* tables from this size on are mmap'ed */
#define HA_HUGE (2u << 20)     /* huge page size, for alignment */

/* murmur3's fmix64: a bijection whose low bits depend on all key bits, so dense or
 * strided key ranges still spread over the table. */
HA_INLINE uint64_t ha_mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

HA_INLINE int64_t ld64(const char *p) {
    int64_t x;
    memcpy(&x, p, 8); /* unaligned-safe: fields of packed records are not 8-aligned */
    return x;
}

HA_INLINE void prefetch_slot(const ha_slot *s) {
    /* a 24-byte slot may straddle two cache lines */
    HA_PREFETCH_W(s);
    HA_PREFETCH_W((const char *)s + sizeof(ha_slot) - 1);
}

/* Maximum load: 0.7 keeps big (DRAM-resident) tables compact, and a probe past the home
 * slot is then usually in the same cache line anyway.  Cache-resident tables pay for
 * every extra probe with a branch miss instead (at load 0.5 a 1000-key table ran ~1.6x
 * slower than at 0.25), and their memory is cheap, so they stay below 0.375. */
#define HA_SMALL_CAP (1u << 15) /* 768 KiB of slots */
static uint64_t grow_limit(uint64_t cap) {
    return cap <= HA_SMALL_CAP ? cap / 8 * 3 : cap / 10 * 7;
}

/* ---- slot storage ------------------------------------------------------------------ */

static int slots_alloc(ha_table *t, uint64_t cap) {
    size_t bytes = (size_t)cap * sizeof(ha_slot);
    t->map_base = NULL;
    t->map_len = 0;
#ifdef HA_HAVE_MMAP
    if (bytes >= HA_MMAP_MIN) {
        size_t len = bytes + HA_HUGE;
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return -1;
        uintptr_t a = ((uintptr_t)p + HA_HUGE - 1) & ~(uintptr_t)(HA_HUGE - 1);
#ifdef MADV_HUGEPAGE
        madvise((void *)a, bytes, MADV_HUGEPAGE); /* advisory: failure is harmless */
#endif
        t->map_base = p;
        t->map_len = len;
        t->slots = (ha_slot *)a;
        return 0;
    }
#endif
    t->slots = (ha_slot *)calloc((size_t)cap, sizeof(ha_slot));
    return t->slots ? 0 : -1;
}

static void slots_free(ha_slot *slots, void *map_base, size_t map_len) {
#ifdef HA_HAVE_MMAP
    if (map_base) {
        munmap(map_base, map_len);
        return;
    }
#endif
    (void)map_len;
    (void)map_base;
    free(slots);
}

static int table_alloc(ha_table *t, uint64_t cap) {
    if (slots_alloc(t, cap)) return -1;
    t->cap = cap;
    t->mask = cap - 1;
    t->size = 0;
    t->grow_at = grow_limit(cap);
    return 0;
}

int ha_init(ha_table *t, int kind, int is_float) {
    memset(t, 0, sizeof(*t));
    t->kind = kind;
    t->is_float = is_float;
    return table_alloc(t, HA_MIN_CAP);
}

void ha_free(ha_table *t) {
    if (t->slots) slots_free(t->slots, t->map_base, t->map_len);
    t->slots = NULL;
    t->map_base = NULL;
    t->cap = t->mask = t->size = t->grow_at = 0;
    t->has_zero = 0;
}

int ha_clear(ha_table *t) {
    if (t->cap == HA_MIN_CAP && !t->map_base) {
        memset(t->slots, 0, (size_t)t->cap * sizeof(ha_slot));
        t->size = 0;
        t->has_zero = 0;
        return 0;
    }
    ha_table fresh = *t;
    if (table_alloc(&fresh, HA_MIN_CAP)) return -1;
    ha_free(t);
    *t = fresh;
    t->has_zero = 0;
    return 0;
}

void ha_reset(ha_table *t) {
    memset(t->slots, 0, (size_t)t->cap * sizeof(ha_slot));
    t->size = 0;
    t->has_zero = 0;
}

/* Rehash into a table of newcap slots; keys are known distinct, so inserting only
 * looks for the first empty slot.  Same block + prefetch scheme as ha_apply. */
static int ha_resize(ha_table *t, uint64_t newcap) {
    ha_table nt = *t;
    if (table_alloc(&nt, newcap)) return -1;
    ha_slot *dst = nt.slots;
    const uint64_t mask = nt.mask;
    const ha_slot *src[HA_BLOCK];
    uint64_t idx[HA_BLOCK];
    uint64_t i = 0;
    while (i < t->cap) {
        int m = 0;
        for (; i < t->cap && m < HA_BLOCK; i++) {
            if (t->slots[i].key != 0) {
                src[m] = &t->slots[i];
                idx[m] = ha_mix((uint64_t)t->slots[i].key) & mask;
                m++;
            }
        }
        for (int j = 0; j < m && j < HA_PF; j++) prefetch_slot(&dst[idx[j]]);
        for (int j = 0; j < m; j++) {
            if (j + HA_PF < m) prefetch_slot(&dst[idx[j + HA_PF]]);
            uint64_t p = idx[j];
            while (dst[p].key != 0) p = (p + 1) & mask;
            dst[p] = *src[j];
        }
    }
    nt.size = t->size;
    slots_free(t->slots, t->map_base, t->map_len);
    *t = nt;
    return 0;
}

/* Make room for `need` occupied slots without crossing the load limit. */
static int ha_reserve(ha_table *t, uint64_t need) {
    if (need <= t->grow_at) return 0;
    uint64_t cap = t->cap;
    while (grow_limit(cap) < need) {
        if (cap >= HA_MAX_CAP) return -1;
        cap <<= 1;
    }
    return ha_resize(t, cap);
}

/* ---- the specialised update / merge loop ------------------------------------------- */

HA_INLINE void combine(ha_slot *s, int64_t c, ha_val v, const int kind, const int isf) {
    s->count = (int64_t)((uint64_t)s->count + (uint64_t)c);
    switch (kind) {
    case HA_SUM:
    case HA_MEAN:
        if (isf)
            s->val.f += v.f;
        else
            s->val.i = (int64_t)((uint64_t)s->val.i + (uint64_t)v.i);
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

HA_INLINE void put(ha_slot *s, int64_t k, int64_t c, ha_val v, const int kind) {
    s->key = k;
    s->count = c;
    if (kind == HA_COUNT)
        s->val.i = 0;
    else
        s->val = v;
}

HA_INLINE int apply_core(ha_table *t, const char *kp, ptrdiff_t ks, const char *cp, ptrdiff_t cs,
                         const char *vp, ptrdiff_t vs, size_t n, const int kind, const int isf,
                         const int has_counts) {
    int64_t kb[HA_BLOCK], cb[HA_BLOCK];
    ha_val vb[HA_BLOCK];
    uint64_t idx[HA_BLOCK];
    for (size_t b = 0; b < n; b += HA_BLOCK) {
        const int m = (int)(n - b < HA_BLOCK ? n - b : HA_BLOCK);
        ha_slot *slots = t->slots;
        uint64_t mask = t->mask;
        const char *kq = kp + (ptrdiff_t)b * ks;
        for (int j = 0; j < m; j++) {
            int64_t k = ld64(kq + (ptrdiff_t)j * ks);
            kb[j] = k;
            idx[j] = ha_mix((uint64_t)k) & mask;
        }
        for (int j = 0; j < m && j < HA_PF; j++) prefetch_slot(&slots[idx[j]]);
        if (kind != HA_COUNT) {
            const char *vq = vp + (ptrdiff_t)b * vs;
            for (int j = 0; j < m; j++) memcpy(&vb[j], vq + (ptrdiff_t)j * vs, 8);
        }
        if (has_counts) {
            const char *cq = cp + (ptrdiff_t)b * cs;
            for (int j = 0; j < m; j++) cb[j] = ld64(cq + (ptrdiff_t)j * cs);
        }
        uint64_t size = t->size; /* a local: slot stores could alias t->size otherwise */
        uint64_t grow_at = t->grow_at;
        for (int j = 0; j < m; j++) {
            if (j + HA_PF < m) prefetch_slot(&slots[idx[j + HA_PF]]);
            const int64_t k = kb[j];
            const int64_t c = has_counts ? cb[j] : 1;
            ha_val v;
            if (kind != HA_COUNT)
                v = vb[j];
            else
                v.i = 0;
            if (HA_UNLIKELY(k == 0)) {
                if (t->has_zero) {
                    combine(&t->zero, c, v, kind, isf);
                } else {
                    put(&t->zero, 0, c, v, kind);
                    t->has_zero = 1;
                }
                continue;
            }
            uint64_t p = idx[j];
            for (;;) {
                ha_slot *s = &slots[p];
                if (HA_LIKELY(s->key == k)) {
                    combine(s, c, v, kind, isf);
                    break;
                }
                if (s->key == 0) {
                    put(s, k, c, v, kind);
                    if (HA_UNLIKELY(++size > grow_at)) {
                        /* grow in the middle of the block (not pessimistically before it,
                         * which would bloat small tables fed large batches), then rehash
                         * the block's remaining rows for the new mask */
                        t->size = size;
                        if (t->cap >= HA_MAX_CAP || ha_resize(t, t->cap << 1)) return -1;
                        slots = t->slots;
                        mask = t->mask;
                        grow_at = t->grow_at;
                        for (int q = j + 1; q < m; q++) idx[q] = ha_mix((uint64_t)kb[q]) & mask;
                        for (int q = j + 1; q < m && q <= j + HA_PF; q++) prefetch_slot(&slots[idx[q]]);
                    }
                    break;
                }
                p = (p + 1) & mask;
            }
        }
        t->size = size;
    }
    return 0;
}

#define HA_CASE(KIND, ISF)                                                                    \
    return has_counts ? apply_core(t, kp, ks, cp, cs, vp, vs, n, KIND, ISF, 1)                \
                      : apply_core(t, kp, ks, cp, cs, vp, vs, n, KIND, ISF, 0)

int ha_apply(ha_table *t, const char *kp, ptrdiff_t ks, const char *cp, ptrdiff_t cs,
             const char *vp, ptrdiff_t vs, size_t n) {
    const int has_counts = cp != NULL;
    switch (t->kind) {
    case HA_COUNT:
        HA_CASE(HA_COUNT, 0);
    case HA_SUM:
        if (t->is_float) HA_CASE(HA_SUM, 1);
        HA_CASE(HA_SUM, 0);
    case HA_MIN:
        if (t->is_float) HA_CASE(HA_MIN, 1);
        HA_CASE(HA_MIN, 0);
    case HA_MAX:
        if (t->is_float) HA_CASE(HA_MAX, 1);
        HA_CASE(HA_MAX, 0);
    default: /* HA_MEAN */
        if (t->is_float) HA_CASE(HA_MEAN, 1);
        HA_CASE(HA_MEAN, 0);
    }
}

/* ---- join, export ------------------------------------------------------------------ */

static void double_entry(ha_slot *s, int kind, int isf) {
    /* s ⊔ s for the additive CRDTs; min/max are idempotent */
    s->count = (int64_t)((uint64_t)s->count * 2u);
    if (kind == HA_SUM || kind == HA_MEAN) {
        if (isf)
            s->val.f += s->val.f;
        else
            s->val.i = (int64_t)((uint64_t)s->val.i * 2u);
    }
}

int ha_merge_table(ha_table *dst, const ha_table *src) {
    if (dst == src) {
        for (uint64_t i = 0; i < dst->cap; i++)
            if (dst->slots[i].key != 0) double_entry(&dst->slots[i], dst->kind, dst->is_float);
        if (dst->has_zero) double_entry(&dst->zero, dst->kind, dst->is_float);
        return 0;
    }
    /* the join has at least as many keys as the larger side: size for that up front */
    if (ha_reserve(dst, dst->size > src->size ? dst->size : src->size)) return -1;
    int64_t kb[HA_BLOCK], cb[HA_BLOCK];
    ha_val vb[HA_BLOCK];
    int m = 0;
    if (src->has_zero) {
        kb[0] = 0;
        cb[0] = src->zero.count;
        vb[0] = src->zero.val;
        m = 1;
    }
    for (uint64_t i = 0; i < src->cap; i++) {
        const ha_slot *s = &src->slots[i];
        if (s->key == 0) continue;
        kb[m] = s->key;
        cb[m] = s->count;
        vb[m] = s->val;
        if (++m == HA_BLOCK) {
            if (ha_apply(dst, (const char *)kb, 8, (const char *)cb, 8, (const char *)vb, 8, m))
                return -1;
            m = 0;
        }
    }
    if (m && ha_apply(dst, (const char *)kb, 8, (const char *)cb, 8, (const char *)vb, 8, m))
        return -1;
    return 0;
}

uint64_t ha_len(const ha_table *t) { return t->size + (t->has_zero ? 1 : 0); }

size_t ha_nbytes(const ha_table *t) {
    return sizeof(*t) + (t->map_base ? t->map_len : (size_t)t->cap * sizeof(ha_slot));
}

void ha_export(const ha_table *t, int64_t *keys, int64_t *counts, ha_val *vals) {
    size_t o = 0;
    if (t->has_zero) {
        keys[0] = 0;
        counts[0] = t->zero.count;
        vals[0] = t->zero.val;
        o = 1;
    }
    for (uint64_t i = 0; i < t->cap; i++) {
        const ha_slot *s = &t->slots[i];
        if (s->key == 0) continue;
        keys[o] = s->key;
        counts[o] = s->count;
        vals[o] = s->val;
        o++;
    }
}
