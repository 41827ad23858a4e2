/* Column kernels: gather a field of a 2-D strided record view, min/max of an int64 field. */
#include "columns.h"

#include <string.h>

#define LOAD_STORE(T)                                                  \
    do {                                                               \
        T x;                                                           \
        memcpy(&x, src, sizeof(T));                                    \
        memcpy(out + i * (int64_t)sizeof(T), &x, sizeof(T));           \
    } while (0)

static inline void copy_elem(const char *src, char *out, int64_t i, int64_t itemsize) {
    switch (itemsize) {
        case 1: out[i] = *src; break;
        case 2: LOAD_STORE(uint16_t); break;
        case 4: LOAD_STORE(uint32_t); break;
        case 8: LOAD_STORE(uint64_t); break;
        default: memcpy(out + i * itemsize, src, (size_t)itemsize);
    }
}

int64_t columns_gather(const field_view *v, const int64_t *sel, int64_t m, char *out) {
    const int64_t cols = v->cols, total = v->rows * v->cols, isz = v->itemsize;
    if (sel == NULL) {
        int64_t i = 0;
        for (int64_t r = 0; r < v->rows; r++) {
            const char *row = v->base + r * v->row_stride;
            for (int64_t c = 0; c < cols; c++, i++) copy_elem(row + c * v->col_stride, out, i, isz);
        }
        return 0;
    }
    /* Selections come from filters and are ascending: track the current row instead of
     * dividing for every index; fall back to a division when an index jumps. */
    int64_t row = 0, row_first = 0;
    for (int64_t i = 0; i < m; i++) {
        int64_t idx = sel[i];
        if (idx < 0 || idx >= total) return i + 1;
        if (idx < row_first || idx >= row_first + cols) {
            row = (idx >= row_first + cols && idx < row_first + 2 * cols) ? row + 1 : idx / cols;
            row_first = row * cols;
        }
        copy_elem(v->base + row * v->row_stride + (idx - row_first) * v->col_stride, out, i, isz);
    }
    return 0;
}

void columns_minmax_i64(const field_view *v, int64_t *min_out, int64_t *max_out) {
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int64_t r = 0; r < v->rows; r++) {
        const char *row = v->base + r * v->row_stride;
        for (int64_t c = 0; c < v->cols; c++) {
            int64_t x;
            memcpy(&x, row + c * v->col_stride, sizeof x);
            lo = x < lo ? x : lo;
            hi = x > hi ? x : hi;
        }
    }
    *min_out = lo;
    *max_out = hi;
}

int64_t columns_copy_rows_max(const field_view *dst, const char *src, int64_t row_bytes, int64_t record_size,
                              int64_t field_offset) {
    int64_t hi = INT64_MIN;
    for (int64_t r = 0; r < dst->rows; r++) {
        char *row = (char *)dst->base + r * dst->row_stride;
        memcpy(row, src + r * row_bytes, (size_t)row_bytes);
        if (field_offset < 0) continue;
        for (int64_t off = field_offset; off + 8 <= row_bytes; off += record_size) {
            int64_t x;
            memcpy(&x, row + off, sizeof x);
            hi = x > hi ? x : hi;
        }
    }
    return hi;
}
