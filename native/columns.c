/* Column kernels: gather a field of a 2-D strided record view, min/max of an int64 field. */
#include "columns.h"

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

int64_t columns_copy_rows_max(const field_view *dst, const char *src, int64_t row_bytes, int64_t record_size,
                              int64_t field_offset) {
    /* four independent max chains (one chain would cost about two cycles a record) */
    int64_t hi[4] = {INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN};
    for (int64_t r = 0; r < dst->rows; r++) {
        char *row = (char *)dst->base + r * dst->row_stride;
        memcpy(row, src + r * row_bytes, (size_t)row_bytes);
        if (field_offset < 0) continue;
        int64_t off = field_offset;
        for (; off + 3 * record_size + 8 <= row_bytes; off += 4 * record_size) {
            for (int u = 0; u < 4; u++) {
                int64_t x;
                memcpy(&x, row + off + u * record_size, sizeof x);
                hi[u] = x > hi[u] ? x : hi[u];
            }
        }
        for (; off + 8 <= row_bytes; off += record_size) {
            int64_t x;
            memcpy(&x, row + off, sizeof x);
            hi[0] = x > hi[0] ? x : hi[0];
        }
    }
    for (int u = 1; u < 4; u++) hi[0] = hi[u] > hi[0] ? hi[u] : hi[0];
    return hi[0];
}
