/* Column kernels over strided record layouts (numpy cannot do these in one pass).
 *
 * A field of records spread over consecutive ring slots is a 2-D strided array
 * (slots x records, strides slot_size x record_size). These kernels read such fields
 * in place, with no Python in them.
 */
#ifndef SLASHRT_COLUMNS_H
#define SLASHRT_COLUMNS_H

#include <stddef.h>
#include <stdint.h>

/* A field view: rows x cols elements of itemsize bytes at base + r*row_stride + c*col_stride. */
typedef struct {
    const char *base;
    int64_t rows, cols;
    int64_t row_stride, col_stride;
    int64_t itemsize;
} field_view;

/* out[i] = element number sel[i] (row-major flat index) of v, for i < m; sel == NULL takes
 * every element in order (m must be rows*cols). Returns the first bad position + 1 if an
 * index is out of range (nothing is guaranteed about out then), 0 on success. */
int64_t columns_gather(const field_view *v, const int64_t *sel, int64_t m, char *out);

/* Minimum and maximum of an int64 field (rows*cols >= 1). */
void columns_minmax_i64(const field_view *v, int64_t *min_out, int64_t *max_out);

/* Group n rows (key, count, 8-byte value) by the executor leading each key's partition
 * (leaders[partition], every entry < owners), stably; offsets[o]..offsets[o+1] are owner o's
 * rows in the outputs. The outputs are strided (`out_stride` bytes from one row to the next),
 * so they may be the fields of structured rows, e.g. an epoch's delta rows written in place.
 * Returns -1 if memory ran out. */
int columns_route(const int64_t *keys, const int64_t *counts, const uint64_t *vals, int64_t n,
                  const int64_t *leaders, int64_t partitions, int64_t owners, char *keys_out,
                  char *counts_out, char *vals_out, ptrdiff_t out_stride, int64_t *offsets);

/* Copy `rows` rows of `row_bytes` contiguous bytes from src into the rows of dst (a 2-D
 * uint8 view, e.g. the payload areas of k ring slots) and return the maximum of the int64
 * field at `field_offset` of each `record_size`-byte record copied (INT64_MIN if field_offset
 * < 0): one pass, each row read again while still in cache. */
int64_t columns_copy_rows_max(const field_view *dst, const char *src, int64_t row_bytes, int64_t record_size,
                              int64_t field_offset);

#endif
