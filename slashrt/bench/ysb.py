"""Yahoo Streaming Benchmark as in the Slash paper.

78-byte packed little-endian records; keep views, map ad to campaign, count per campaign per
10-second tumbling event-time window. The reference (`reference`) is plain numpy, written
without any runtime code, and the C loop (`slashrt._kernels.ysb_baseline`) is the yardstick
for what the hardware allows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from slashrt._dataflow import Dataflow
from slashrt._schema import Schema
from slashrt.bench._common import generate_chunked, sort_rows, zipf_choice
from slashrt.errors import SchemaError
from slashrt.ops.window import Tumbling

__all__ = ["YSB_SCHEMA", "READ_SCHEMA", "VIEW", "WINDOW_MS", "generate", "campaign_map", "dataflow", "reference", "load_input"]

YSB_SCHEMA = Schema(
    [
        ("event_time", "<i8"),
        ("ad_id", "<i8"),
        ("user_id", "<i8"),
        ("page_id", "<i8"),
        ("event_type", "u1"),
        ("ad_type", "u1"),
        ("ip", "<u4"),
        ("filler", "V40"),
    ]
)
assert YSB_SCHEMA.record_size == 78
VIEW, CLICK, PURCHASE = 0, 1, 2
ADS_PER_CAMPAIGN = 10
WINDOW_MS = 10_000
RESULT_DTYPE = np.dtype([("window_start_ms", "<i8"), ("campaign_id", "<i8"), ("count", "<i8")])


def campaign_map(campaigns: int) -> np.ndarray:
    """The default mapping: ad_id -> ad_id // 10 (ten ads per campaign)."""
    return np.arange(campaigns * ADS_PER_CAMPAIGN, dtype=np.int64) // ADS_PER_CAMPAIGN


def generate(
    events: int,
    campaigns: int = 1000,
    *,
    zipf: float = 0.0,
    events_per_ms: int = 100,
    disorder_ms: int = 0,
    seed: int = 42,
) -> np.ndarray:
    """YSB events, `events_per_ms` per millisecond of event time, optionally out of order by up
    to `disorder_ms` (each event's time moved back by a uniform amount below it)."""
    n_ads = campaigns * ADS_PER_CAMPAIGN

    def fill(out, first, rng):
        n = len(out)
        t = (np.arange(first, first + n, dtype=np.int64)) // events_per_ms
        if disorder_ms:
            t = np.maximum(t - rng.integers(0, disorder_ms, n), 0)
        out["event_time"] = t
        out["ad_id"] = zipf_choice(rng, n_ads, n, zipf)
        out["user_id"] = rng.integers(0, 1 << 40, n)
        out["page_id"] = rng.integers(0, 1 << 40, n)
        out["event_type"] = rng.integers(0, 3, n, dtype=np.uint8)
        out["ad_type"] = rng.integers(0, 5, n, dtype=np.uint8)
        out["ip"] = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)

    return generate_chunked(YSB_SCHEMA.dtype, events, fill, seed)


def _load_npy(path: str | Path, what: str, **kwargs) -> np.ndarray:
    """The array in a .npy file; SchemaError naming the file for anything else (missing, not a
    regular file (a FIFO would block), empty, not .npy, a .npz archive)."""
    path = Path(path)
    if not path.is_file():
        reason = "does not exist" if not path.exists() else "is not a regular file"
        raise SchemaError(f"{what} {path} {reason}")
    try:
        arr = np.load(path, allow_pickle=False, **kwargs)
    except (OSError, ValueError, EOFError) as exc:
        raise SchemaError(f"{what} {path}: cannot read as a .npy array: {exc or 'the file is empty'}") from None
    if not isinstance(arr, np.ndarray):
        arr.close()
        raise SchemaError(f"{what} {path} is a .npz archive; give one array saved with numpy.save (.npy)")
    return arr


def load_input(path: str | Path) -> np.ndarray:
    """Load YSB records from a .npy structured array (any dtype with YSB's field names and
    sizes, in any order or byte order; the filler may be bytes or void). Raises SchemaError
    naming the file."""
    arr = _load_npy(path, "--input", mmap_mode="r")
    if arr.dtype.names is None or arr.ndim != 1:
        raise SchemaError(f"{path}: expected a 1-D array of records, got {arr.dtype} of shape {arr.shape}")
    if len(arr) == 0:
        raise SchemaError(f"--input {path} holds no records")
    # the same check (and reordering, byte-swapping) as every run input
    return YSB_SCHEMA.conform(arr, str(path)).view(YSB_SCHEMA.dtype)


def load_ads(path: str | Path, n_ads_needed: int | None = None) -> np.ndarray:
    ads = _load_npy(path, "--ads")
    if ads.ndim != 1 or ads.dtype.kind not in "iu":
        raise SchemaError(f"{path}: the ad mapping must be a 1-D integer array indexed by ad_id, got {ads.dtype} {ads.shape}")
    return ads.astype(np.int64)


# the columns the query reads: a source of these alone reads only them from columnar files
READ_SCHEMA = Schema([("event_time", "<i8"), ("ad_id", "<i8"), ("event_type", "u1")])


def dataflow(ad_to_campaign: np.ndarray, sink, *, max_delay: int = 0, step=None, schema: Schema = YSB_SCHEMA,
             window_ms: int = WINDOW_MS) -> Dataflow:
    """The YSB query written against the public API; `step`: a filter put right after the
    source (bench checkpoint's slow step); `schema`: the source's (`READ_SCHEMA`: the columns
    the query reads); `window_ms`: its windows' length (bench latency's are shorter)."""
    flow = Dataflow("ysb")
    events = flow.source("events", schema, time="event_time", max_delay=max_delay)
    if step is not None:
        events = events.filter(step, name="step")

    async def views(batch):
        return batch[batch["event_type"] == VIEW]

    counts = (
        events.apply(views)
        .with_column("campaign_id", lambda b: ad_to_campaign[b["ad_id"]])
        .window(Tumbling(ms=window_ms))
        .count(key="campaign_id")
    )
    counts.sink(sink, name="counts")
    return flow


def to_result(records: np.ndarray | None) -> np.ndarray:
    """Runtime output (window_start, window_end, campaign_id, count) as sorted result rows."""
    if records is None:
        return np.empty(0, RESULT_DTYPE)
    out = np.empty(len(records), RESULT_DTYPE)
    out["window_start_ms"] = records["window_start"]
    out["campaign_id"] = records["campaign_id"]
    out["count"] = records["count"]
    return sort_rows(out, "window_start_ms", "campaign_id")


def reference(records: np.ndarray, ad_to_campaign: np.ndarray) -> np.ndarray:
    """Plain numpy: the same query, sorted by window then campaign."""
    views = records["event_type"] == VIEW
    campaign = ad_to_campaign[records["ad_id"][views]]
    window = records["event_time"][views] // WINDOW_MS
    pairs = np.stack([window, campaign], axis=1)
    uniq, counts = np.unique(pairs, axis=0, return_counts=True)
    out = np.empty(len(uniq), RESULT_DTYPE)
    out["window_start_ms"] = uniq[:, 0] * WINDOW_MS
    out["campaign_id"] = uniq[:, 1]
    out["count"] = counts
    return out


def write_csv(result: np.ndarray, path: str | Path) -> None:
    import pyarrow.csv

    from slashrt.ops.sinks import to_arrow

    pyarrow.csv.write_csv(
        to_arrow(result), str(path), pyarrow.csv.WriteOptions(quoting_style="none")
    )


def check_ads(records: np.ndarray, ads: np.ndarray, source: str) -> None:
    """Every ad_id must index the mapping: fail clearly before running, not deep in an operator."""
    if len(records) == 0:
        return
    lo, hi = int(records["ad_id"].min()), int(records["ad_id"].max())
    if lo < 0 or hi >= len(ads):
        raise SchemaError(f"{source}: ad_id values span [{lo}, {hi}] but the ad mapping covers [0, {len(ads) - 1}]")


def bench(**kwargs) -> dict:
    """Run the YSB benchmark (see `bench_with_result`) and return its report."""
    return bench_with_result(**kwargs)[0]


def bench_with_result(
    *,
    events: int,
    campaigns: int,
    zipf: float = 0.0,
    input: str | None = None,
    output: str | None = None,
    ads: str | None = None,
    disorder_ms: int = 0,
    seed: int = 42,
    repeat: int = 1,
    show_progress: bool = False,
    **options,
) -> tuple[dict, np.ndarray]:
    """Generate (or load) YSB events, run the query `repeat` times, check every run against the
    numpy reference and time the C loop on the same records. Returns the report and the
    result rows (window_start_ms, campaign_id, count) sorted by window then campaign."""
    from slashrt._kernels import ysb_baseline
    from slashrt.bench._common import lazy, run_best, throughput_fields

    if input is not None:
        records = load_input(input)
    else:
        records = generate(events, campaigns, zipf=zipf, disorder_ms=disorder_ms, seed=seed)
    mapping = load_ads(ads) if ads is not None else campaign_map(campaigns)
    check_ads(records, mapping, input or "generated events")
    expected = lazy(lambda: reference(records, mapping))
    m = run_best(
        lambda sink: dataflow(mapping, sink, max_delay=disorder_ms),
        {"events": records},
        repeat=repeat,
        to_result=to_result,
        check=lambda got: np.array_equal(got, expected()),
        show_progress=show_progress,
        **options,
    )
    got = m.output
    fields = throughput_fields(
        "ysb",
        len(records),
        m.result,
        correct=m.correct,
        campaigns=int(mapping.max()) + 1 if len(mapping) else 0,
        windows=int(len(np.unique(got["window_start_ms"]))),
        result_rows=len(got),
        late_records=sum(m.result.late_records.values()),
        repeat=repeat,
        peak_rss_bytes=m.peak_rss_bytes,
        input_bytes=int(records.nbytes),
        peak_rss_over_input=round(m.peak_rss_bytes / max(records.nbytes, 1), 3),
    )
    if ysb_baseline is not None:
        fields.update(_c_loop_fields(records, mapping, fields, repeat, expected))
    if output is not None:
        write_csv(got, output)
        fields["output"] = str(output)
    return fields, got


def _c_loop_fields(records, mapping, fields: dict, repeat: int, expected) -> dict:
    """The yardstick: one C loop over the same records, measured in this same run. Its dense
    [window][campaign] grid has a size limit (native/ysb_baseline.h): inputs beyond it (weeks
    of event time over many campaigns) or with negative campaign ids are reported as skipped,
    not failed: the run itself was checked against the numpy reference."""
    from slashrt._kernels import ysb_baseline
    from slashrt.bench._common import Timer

    best = None
    try:
        for _ in range(repeat):
            with Timer() as t:
                base = ysb_baseline(records, mapping, fields["campaigns"], WINDOW_MS)
            best = t.seconds if best is None else min(best, t.seconds)
    except ValueError as exc:
        return {"c_loop_skipped": str(exc)}
    c_loop = round(len(records) / best, 1)
    return {
        "c_loop_records_per_s": c_loop,
        "c_loop_over_slashrt": round(c_loop / fields["records_per_s"], 3),
        "c_loop_agrees": bool(
            np.array_equal(base[0], expected()["window_start_ms"])
            and np.array_equal(base[1], expected()["campaign_id"])
            and np.array_equal(base[2], expected()["count"])
        ),
    }
