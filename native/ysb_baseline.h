/* The plain-C Yahoo Streaming Benchmark loop: the "what the hardware allows" yardstick.
 *
 * Record layout (78 bytes, packed, little-endian):
 *   event_time i8 @0 (ms), ad_id i8 @8, user_id i8 @16, page_id i8 @24,
 *   event_type u1 @32 (0 view, 1 click, 2 purchase), ad_type u1 @33, ip u4 @34, filler 40 B @38.
 * Query: keep views, campaign = ad_to_campaign[ad_id], count per (campaign, tumbling window).
 */
#ifndef SLASHRT_YSB_BASELINE_H
#define SLASHRT_YSB_BASELINE_H

#include <stddef.h>
#include <stdint.h>

#define YSB_RECORD_SIZE 78
#define YSB_MAX_CELLS (1ll << 27) /* dense grid limit: 1 GiB of int64 counters */

enum {
    YSB_OK = 0,
    YSB_BAD_AD = 1,       /* ad_id outside [0, n_map) */
    YSB_BAD_CAMPAIGN = 2, /* mapping gave a campaign outside [0, n_campaigns) */
    YSB_NOMEM = 3,
    YSB_SPAN = 4,    /* windows * campaigns would exceed YSB_MAX_CELLS */
    YSB_BAD_TIME = 5 /* window start of an event_time does not fit in int64 */
};

typedef struct {
    int64_t *grid;   /* [nwin][n_campaigns] counters, row r is window w0 + r; malloc'ed */
    int64_t w0;      /* first window index (window start = index * window_ms) */
    int64_t nwin;    /* rows allocated */
    size_t err_row;  /* on error: offending record */
    int64_t err_val; /* on error: offending ad_id or campaign */
} ysb_grid;

/* One pass over n records.  The mapping is an int64 vector of n_map entries with a byte
 * stride (unaligned-safe).  Returns a YSB_* code; on YSB_OK the caller frees g->grid. */
int ysb_count(const unsigned char *records, size_t n, const char *map, ptrdiff_t map_stride,
              int64_t n_map, int64_t n_campaigns, int64_t window_ms, ysb_grid *g);

#endif
