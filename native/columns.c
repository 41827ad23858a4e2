/* Column kernels: gather a field of a 2-D strided record view, min/max of an int64 field. */
#include "columns.h"

#include <stdlib.h>

#include <string.h>

/* One loop per element size, so the inner loops are plain typed loads and stores. */
#define GATHER_LOOPS(T)                                                                            \
    do {                                                                                           \
        T *o = (T *)out;                                                                           \
        if (sel == NULL) {                                                                         \
            int64_t i = 0;                                                                         \
            for (int64_t r = 0; r < v->rows; r++) {                                                \
                const char *row = v->base + r * v->row_stride;                                     \
                for (int64_t c = 0; c < cols; c++, i++) memcpy(&o[i], row + c * v->col_stride, sizeof(T)); \
            }                                                                                      \
            return 0;                                                                              \
        }                                                                                          \
        int64_t row = 0, row_first = 0;                                                            \
        const char *row_base = v->base;                                                            \
        for (int64_t i = 0; i < m; i++) {                                                          \
            int64_t idx = sel[i];                                                                  \
            if ((uint64_t)(idx - row_first) >= (uint64_t)cols) {                                   \
                /* selections from filters ascend: step to the next row, divide only on a jump */ \
                if (idx < 0 || idx >= total) return i + 1;                                         \
                row = (idx >= row_first + cols && idx < row_first + 2 * cols) ? row + 1 : idx / cols; \
                row_first = row * cols;                                                            \
                row_base = v->base + row * v->row_stride;                                          \
            }                                                                                      \
            memcpy(&o[i], row_base + (idx - row_first) * v->col_stride, sizeof(T));                \
        }                                                                                          \
        return 0;                                                                                  \
    } while (0)

typedef struct { char b[16]; } bytes16;

int64_t columns_gather(const field_view *v, const int64_t *sel, int64_t m, char *out) {
    const int64_t cols = v->cols, total = v->rows * v->cols, isz = v->itemsize;
    switch (isz) {
        case 1: GATHER_LOOPS(uint8_t);
        case 2: GATHER_LOOPS(uint16_t);
        case 4: GATHER_LOOPS(uint32_t);
        case 8: GATHER_LOOPS(uint64_t);
        case 16: GATHER_LOOPS(bytes16);
        default: break;
    }
    /* any other element size: memcpy per element */
    int64_t row = 0, row_first = 0;
    for (int64_t i = 0; i < (sel ? m : total); i++) {
        int64_t idx = sel ? sel[i] : i;
        if (idx < 0 || idx >= total) return i + 1;
        if (idx < row_first || idx >= row_first + cols) {
            row = idx / cols;
            row_first = row * cols;
        }
        memcpy(out + i * isz, v->base + row * v->row_stride + (idx - row_first) * v->col_stride, (size_t)isz);
    }
    return 0;
}

void columns_minmax_i64(const field_view *v, int64_t *min_out, int64_t *max_out) {
    /* four independent (min, max) pairs: the compare-and-select chains of one pair would
     * limit the loop to one element per two cycles */
    int64_t lo[4] = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};
    int64_t hi[4] = {INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN};
    const int64_t cs = v->col_stride;
    for (int64_t r = 0; r < v->rows; r++) {
        const char *row = v->base + r * v->row_stride;
        int64_t c = 0;
        for (; c + 4 <= v->cols; c += 4) {
            for (int u = 0; u < 4; u++) {
                int64_t x;
                memcpy(&x, row + (c + u) * cs, sizeof x);
                lo[u] = x < lo[u] ? x : lo[u];
                hi[u] = x > hi[u] ? x : hi[u];
            }
        }
        for (; c < v->cols; c++) {
            int64_t x;
            memcpy(&x, row + c * cs, sizeof x);
            lo[0] = x < lo[0] ? x : lo[0];
            hi[0] = x > hi[0] ? x : hi[0];
        }
    }
    for (int u = 1; u < 4; u++) {
        lo[0] = lo[u] < lo[0] ? lo[u] : lo[0];
        hi[0] = hi[u] > hi[0] ? hi[u] : hi[0];
    }
    *min_out = lo[0];
    *max_out = hi[0];
}

/* Max of n int64 at p[0], p[stride], ... (8-aligned): with the stride a compile-time
 * constant the compiler vectorises the loop (strided loads, vector compares). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define COLUMNS_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define COLUMNS_CLONES
#endif

#define MAX_STRIDED(S)                                                                             \
    do {                                                                                           \
        int64_t hi = INT64_MIN;                                                                    \
        for (int64_t i = 0; i < n; i++) {                                                          \
            const int64_t x = p[i * (S)];                                                          \
            hi = x > hi ? x : hi;                                                                  \
        }                                                                                          \
        return hi;                                                                                 \
    } while (0)

COLUMNS_CLONES static int64_t max_strided_i64(const int64_t *p, int64_t n, int64_t stride) {
    switch (stride) {
    case 1: MAX_STRIDED(1);
    case 2: MAX_STRIDED(2);
    case 3: MAX_STRIDED(3);
    case 4: MAX_STRIDED(4);
    default: MAX_STRIDED(stride);
    }
}

/* Max of the int64 field at `off` of the records in bytes [0, nbytes) of row (unaligned-safe,
 * four independent compare chains). */
static int64_t max_field(const char *row, int64_t nbytes, int64_t record_size, int64_t off) {
    int64_t hi[4] = {INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN};
    for (; off + 3 * record_size + 8 <= nbytes; off += 4 * record_size) {
        for (int u = 0; u < 4; u++) {
            int64_t x;
            memcpy(&x, row + off + u * record_size, sizeof x);
            hi[u] = x > hi[u] ? x : hi[u];
        }
    }
    for (; off + 8 <= nbytes; off += record_size) {
        int64_t x;
        memcpy(&x, row + off, sizeof x);
        hi[0] = x > hi[0] ? x : hi[0];
    }
    for (int u = 1; u < 4; u++) hi[0] = hi[u] > hi[0] ? hi[u] : hi[0];
    return hi[0];
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define COLUMNS_HAVE_AVX2 1
/* Copy nbytes (a multiple of 64) and return the max of the int64 lanes selected by `lanes`
 * (all-ones in the lanes of a 32-byte chunk that hold the field: the layout repeats every 32
 * bytes when the record size divides 32). One pass: each chunk is compared while in a
 * register, so the max costs no second read. Two accumulators hide the compare latency. */
__attribute__((target("avx2"))) static int64_t copy_max_avx2(char *dst, const char *src, int64_t nbytes,
                                                              const int64_t lanes[4]) {
    const __m256i mask = _mm256_loadu_si256((const __m256i *)lanes);
    __m256i h0 = _mm256_set1_epi64x(INT64_MIN), h1 = h0;
    for (int64_t i = 0; i < nbytes; i += 64) {
        _mm_prefetch(src + i + 1024, _MM_HINT_T0);
        const __m256i a = _mm256_loadu_si256((const __m256i *)(src + i));
        const __m256i b = _mm256_loadu_si256((const __m256i *)(src + i + 32));
        _mm256_storeu_si256((__m256i *)(dst + i), a);
        _mm256_storeu_si256((__m256i *)(dst + i + 32), b);
        h0 = _mm256_blendv_epi8(h0, a, _mm256_and_si256(_mm256_cmpgt_epi64(a, h0), mask));
        h1 = _mm256_blendv_epi8(h1, b, _mm256_and_si256(_mm256_cmpgt_epi64(b, h1), mask));
    }
    h0 = _mm256_blendv_epi8(h0, h1, _mm256_cmpgt_epi64(h1, h0));
    int64_t out[4];
    _mm256_storeu_si256((__m256i *)out, h0);
    int64_t hi = INT64_MIN;
    for (int u = 0; u < 4; u++) hi = out[u] > hi ? out[u] : hi;
    return hi;
}
#endif

int64_t columns_copy_rows_max(const field_view *dst, const char *src, int64_t row_bytes, int64_t record_size,
                              int64_t field_offset) {
    int64_t hi = INT64_MIN;
#ifdef COLUMNS_HAVE_AVX2
    /* the one-pass vector loop: records whose size divides 32 with an 8-aligned field */
    int64_t lanes[4] = {0, 0, 0, 0};
    const int vec = field_offset >= 0 && record_size > 0 && 32 % record_size == 0 && field_offset % 8 == 0 &&
                    field_offset + 8 <= record_size && __builtin_cpu_supports("avx2");
    if (vec)
        for (int64_t b = field_offset; b < 32; b += record_size) lanes[b / 8] = -1;
#endif
    /* else: copy a block at a time and read its times back while the block is in L1 */
    const int64_t block = record_size > 0 && record_size <= 4096 ? 4096 / record_size * record_size : row_bytes;
    for (int64_t r = 0; r < dst->rows; r++) {
        char *row = (char *)dst->base + r * dst->row_stride;
        const char *srow = src + r * row_bytes;
        if (field_offset < 0) {
            memcpy(row, srow, (size_t)row_bytes);
            continue;
        }
        int64_t b = 0;
#ifdef COLUMNS_HAVE_AVX2
        if (vec) {
            const int64_t nv = row_bytes / 64 * 64; /* a multiple of 32: whole records */
            const int64_t m = copy_max_avx2(row, srow, nv, lanes);
            hi = m > hi ? m : hi;
            b = nv;
        }
#endif
        for (; b < row_bytes; b += block) {
            const int64_t nb = row_bytes - b < block ? row_bytes - b : block;
            memcpy(row + b, srow + b, (size_t)nb);
            int64_t m;
            if (((uintptr_t)(row + b + field_offset) & 7) == 0 && record_size % 8 == 0) {
                const int64_t nrec = (nb - field_offset + record_size - 8) / record_size;
                m = nrec > 0 ? max_strided_i64((const int64_t *)(row + b + field_offset), nrec, record_size / 8)
                             : INT64_MIN;
            } else {
                m = max_field(row + b, nb, record_size, field_offset);
            }
            hi = m > hi ? m : hi;
        }
    }
    return hi;
}

/* ---- routing rows to the executors leading their keys' partitions ---------------------- */

int columns_route(const int64_t *keys, const int64_t *counts, const uint64_t *vals, int64_t n,
                  const int64_t *leaders, int64_t partitions, int64_t owners, char *keys_out,
                  char *counts_out, char *vals_out, ptrdiff_t out_stride, int64_t *offsets) {
    int32_t *own = (int32_t *)malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    int64_t *pos = (int64_t *)malloc((size_t)owners * sizeof(int64_t));
    if (!own || !pos) {
        free(own);
        free(pos);
        return -1;
    }
    for (int64_t o = 0; o <= owners; o++) offsets[o] = 0;
    /* partition = high 32 bits of the Fibonacci hash scaled to [0, partitions): the same
     * arithmetic as Partitioning.partition_of */
    for (int64_t i = 0; i < n; i++) {
        uint64_t h = ((uint64_t)keys[i] * 0x9E3779B97F4A7C15ULL) >> 32;
        h = (h * (uint64_t)partitions) >> 32;
        const int32_t o = (int32_t)leaders[h];
        own[i] = o;
        offsets[o + 1]++;
    }
    for (int64_t o = 0; o < owners; o++) {
        offsets[o + 1] += offsets[o];
        pos[o] = offsets[o];
    }
    for (int64_t i = 0; i < n; i++) { /* stable: rows keep their order within an owner */
        const ptrdiff_t at = (ptrdiff_t)pos[own[i]]++ * out_stride;
        memcpy(keys_out + at, &keys[i], 8);
        memcpy(counts_out + at, &counts[i], 8);
        memcpy(vals_out + at, &vals[i], 8);
    }
    free(own);
    free(pos);
    return 0;
}
