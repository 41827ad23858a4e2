/* The YSB baseline loop in plain C (see ysb_baseline.h).
 *
 * A single pass over the raw record bytes: fields are memcpy-loaded at their offsets,
 * views are counted into a dense [window][campaign] grid.  Event times are nearly
 * sorted in practice, so the current window's bounds are cached and the 64-bit division
 * runs only when a record leaves that window; the grid grows (doubling, at either end)
 * when a window falls outside it, so no separate min/max pass is needed.
 */
#include "ysb_baseline.h"

#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#define Y_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define Y_UNLIKELY(x) (x)
#endif

static inline int64_t ld64(const void *p) {
    int64_t x;
    memcpy(&x, p, 8);
    return x;
}

static inline int64_t floor_div(int64_t a, int64_t b) { /* b > 0 */
    int64_t q = a / b;
    if ((a % b) != 0 && a < 0) q--;
    return q;
}

/* Ensure window w has a row; returns 0 or a YSB_* error. */
static int grid_cover(ysb_grid *g, int64_t w, int64_t ncamp) {
    if (ncamp > YSB_MAX_CELLS) return YSB_SPAN;
    if (g->grid == NULL) {
        int64_t rows = 16;
        if (rows * ncamp > YSB_MAX_CELLS) rows = YSB_MAX_CELLS / ncamp;
        if (rows < 1) return YSB_SPAN;
        g->grid = (int64_t *)calloc((size_t)(rows * ncamp), sizeof(int64_t));
        if (!g->grid) return YSB_NOMEM;
        g->w0 = w;
        g->nwin = rows;
        return YSB_OK;
    }
    int64_t lo = g->w0, hi = g->w0 + g->nwin; /* [lo, hi) */
    int64_t d; /* distance to the far end; overflow means an absurd span */
    if (__builtin_sub_overflow(w < lo ? hi : w, w < lo ? w : lo, &d) || d >= YSB_MAX_CELLS / ncamp)
        return YSB_SPAN;
    int64_t nlo = w < lo ? w : lo, nhi = w >= hi ? w + 1 : hi;
    int64_t want = d + 1 > 2 * g->nwin ? d + 1 : 2 * g->nwin; /* double for amortised growth */
    if (want > YSB_MAX_CELLS / ncamp) want = YSB_MAX_CELLS / ncamp;
    /* extend towards the side that was hit; near the int64 ends keep the exact span */
    if (w < lo) {
        if (__builtin_sub_overflow(nhi, want, &nlo)) nlo = w;
    } else if (__builtin_add_overflow(nlo, want, &nhi)) {
        nhi = w + 1;
    }
    want = nhi - nlo;
    int64_t *ng = (int64_t *)calloc((size_t)(want * ncamp), sizeof(int64_t));
    if (!ng) return YSB_NOMEM;
    memcpy(ng + (lo - nlo) * ncamp, g->grid, (size_t)(g->nwin * ncamp) * sizeof(int64_t));
    free(g->grid);
    g->grid = ng;
    g->w0 = nlo;
    g->nwin = want;
    return YSB_OK;
}

int ysb_count(const unsigned char *rec, size_t n, const char *map, ptrdiff_t mstride,
              int64_t n_map, int64_t ncamp, int64_t W, ysb_grid *g) {
    memset(g, 0, sizeof(*g));
    int64_t lo = 1, hi = 0; /* bounds of the cached window: empty until the first view */
    int64_t *row = NULL;
    const uint64_t umap = (uint64_t)n_map, ucamp = (uint64_t)ncamp;
    int rc = YSB_OK;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *r = rec + i * YSB_RECORD_SIZE;
        if (r[32] != 0) continue; /* views only */
        const int64_t t = ld64(r), ad = ld64(r + 8);
        if (Y_UNLIKELY((uint64_t)ad >= umap)) {
            rc = YSB_BAD_AD;
            g->err_row = i;
            g->err_val = ad;
            break;
        }
        const int64_t c = ld64(map + ad * mstride);
        if (Y_UNLIKELY((uint64_t)c >= ucamp)) {
            rc = YSB_BAD_CAMPAIGN;
            g->err_row = i;
            g->err_val = c;
            break;
        }
        if (Y_UNLIKELY(t < lo || t > hi)) {
            const int64_t w = floor_div(t, W);
            int64_t start;
            /* window start must be representable; the quarter-range bound keeps the grid
             * arithmetic (w + 1, row offsets) far from overflow even for window_ms == 1 */
            if (__builtin_mul_overflow(w, W, &start) || w > INT64_MAX / 4 || w < INT64_MIN / 4) {
                rc = YSB_BAD_TIME;
                g->err_row = i;
                g->err_val = t;
                break;
            }
            if (g->grid == NULL || w < g->w0 || w >= g->w0 + g->nwin) {
                rc = grid_cover(g, w, ncamp);
                if (rc) {
                    g->err_row = i;
                    g->err_val = t;
                    break;
                }
            }
            row = g->grid + (w - g->w0) * ncamp;
            lo = start;
            hi = lo > INT64_MAX - (W - 1) ? INT64_MAX : lo + (W - 1); /* inclusive */
        }
        row[c]++;
    }
    if (rc != YSB_OK) {
        free(g->grid);
        g->grid = NULL;
    }
    return rc;
}
