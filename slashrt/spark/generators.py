"""Benchmark streams generated on Spark: `spark.range(n)` plus an Arrow UDF, deterministic by seed.

Every value is a function of (seed, record index) only: a counter-based hash (splitmix64) of
the index, computed with numpy per Arrow batch. So the data does not depend on how Spark
partitions the range, a retried task regenerates exactly what the failed one did, and the
generation scales with the Spark cluster (each task makes its own slice).

    df = generators.spark_stream(spark, "ysb", events=10_000_000, seed=42)
    ingest(df, target, defaults=generators.STREAMS["ysb"].defaults, secret=secret)

Streams (their records are slashrt's schemas in slashrt/bench/; the DataFrame's columns have
the same names, in Spark types that `slashrt.spark` maps onto those fields):

    ysb       YSB_SCHEMA      event_time, ad_id, user_id, page_id, event_type, ad_type, ip
                              (the 40-byte filler is a default: zeros, as in bench/ysb.py)
    bids      BID_SCHEMA      NEXMark bids: auction, bidder, price, channel, date_time
    cm        CM_SCHEMA       cluster monitoring task usage
    ro        RO_SCHEMA       key, ts

`records(name, start, end, ...)` computes the same records directly into the slashrt schema,
without Spark or the converter: the reference the tests and benchmarks check against.
"""

from __future__ import annotations

import attrs
import numpy as np
import pyarrow as pa

from slashrt._schema import Schema
from slashrt.bench.cm import CM_SCHEMA
from slashrt.bench.nexmark import BID_SCHEMA, CHANNELS
from slashrt.bench.ro import RO_SCHEMA
from slashrt.bench.ysb import ADS_PER_CAMPAIGN, YSB_SCHEMA

__all__ = ["STREAMS", "GeneratedStream", "arrow_batch", "records", "spark_stream"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _hash(ids: np.ndarray, seed: int, salt: int) -> np.ndarray:
    """splitmix64 of (index, seed, salt): uniform 64-bit values, one per index."""
    with np.errstate(over="ignore"):
        z = ids.astype(np.uint64) * _GOLDEN + np.uint64((seed * 1_000_003 + salt * 7919) & (2**64 - 1))
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def _uniform(ids, seed, salt) -> np.ndarray:
    """Uniform in (0, 1)."""
    return ((_hash(ids, seed, salt) >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def _below(ids, seed, salt, n: int) -> np.ndarray:
    return (_hash(ids, seed, salt) % np.uint64(n)).astype(np.int64)


def _lognormal(ids, seed, salt, mu: float, sigma: float) -> np.ndarray:
    u1, u2 = _uniform(ids, seed, salt), _uniform(ids, seed, salt + 1)
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return np.exp(mu + sigma * z)


def _ysb(ids, seed, *, campaigns=1000, events_per_ms=100):
    return {
        "event_time": (ids // events_per_ms, pa.int64()),
        "ad_id": (_below(ids, seed, 1, campaigns * ADS_PER_CAMPAIGN), pa.int64()),
        "user_id": ((_hash(ids, seed, 2) >> np.uint64(24)).astype(np.int64), pa.int64()),
        "page_id": ((_hash(ids, seed, 3) >> np.uint64(24)).astype(np.int64), pa.int64()),
        "event_type": (_below(ids, seed, 4, 3).astype(np.int8), pa.int8()),
        "ad_type": (_below(ids, seed, 5, 5).astype(np.int8), pa.int8()),
        "ip": ((_hash(ids, seed, 6) >> np.uint64(32)).astype(np.int64), pa.int64()),
    }


def _bids(ids, seed, *, auctions=10_000, bidders=100_000, events_per_ms=100):
    channel = pa.array(list(CHANNELS), pa.binary()).cast(pa.string()).take(pa.array(_below(ids, seed, 4, len(CHANNELS))))
    return {
        "auction": (_below(ids, seed, 1, auctions) + 1000, pa.int64()),
        "bidder": (_below(ids, seed, 2, bidders) + 1000, pa.int64()),
        "price": (np.round(_lognormal(ids, seed, 3, 6.0, 1.0)).astype(np.int64), pa.int64()),
        "channel": (channel, pa.string()),
        "date_time": (ids // events_per_ms, pa.int64()),
    }


def _cm(ids, seed, *, jobs=10_000, events_per_ms=100):
    skewed = np.minimum((_uniform(ids, seed, 1) ** 3 * jobs).astype(np.int64), jobs - 1)  # a few jobs own most tasks
    return {
        "event_time": (ids // events_per_ms, pa.int64()),
        "job_id": (skewed + 6_000_000_000, pa.int64()),
        "task_id": (_below(ids, seed, 2, 2000), pa.int64()),
        "machine_id": (_below(ids, seed, 3, 12_500), pa.int64()),
        "cpu": (np.minimum(_lognormal(ids, seed, 4, -4.0, 1.0), 1.0), pa.float64()),
        "memory": (np.minimum(_lognormal(ids, seed, 6, -4.5, 1.0), 1.0), pa.float64()),
        "disk": (np.minimum(_lognormal(ids, seed, 8, -7.0, 1.5), 1.0), pa.float64()),
        "priority": (_below(ids, seed, 10, 12).astype(np.int32), pa.int32()),
        "event_type": (_below(ids, seed, 11, 9).astype(np.int32), pa.int32()),
    }


def _ro(ids, seed, *, key_range=100_000_000, events_per_ms=1000):
    return {"key": (_below(ids, seed, 1, key_range), pa.int64()), "ts": (ids // events_per_ms, pa.int64())}


@attrs.frozen
class GeneratedStream:
    name: str
    schema: Schema  # the slashrt source schema the stream fills
    make: object  # (ids, seed, **params) -> {column: (values, arrow type)}
    time: str
    defaults: dict = attrs.field(factory=dict)  # fields no column fills (constants)

    def arrow_schema(self) -> pa.Schema:
        cols = self.make(np.zeros(1, np.int64), 0)
        return pa.schema([pa.field(name, typ, nullable=False) for name, (_, typ) in cols.items()])

    def spark_schema(self):
        from pyspark.sql.types import StructType
        from pyspark.sql.pandas.types import from_arrow_schema

        schema = from_arrow_schema(self.arrow_schema())
        return StructType([f.__class__(f.name, f.dataType, False) for f in schema.fields])


STREAMS = {
    "ysb": GeneratedStream("ysb", YSB_SCHEMA, _ysb, "event_time", {"filler": 0}),
    "bids": GeneratedStream("bids", BID_SCHEMA, _bids, "date_time"),
    "cm": GeneratedStream("cm", CM_SCHEMA, _cm, "event_time"),
    "ro": GeneratedStream("ro", RO_SCHEMA, _ro, "ts"),
}


def _stream(name: str) -> GeneratedStream:
    try:
        return STREAMS[name]
    except KeyError:
        raise ValueError(f"unknown stream {name!r}; choose one of {sorted(STREAMS)}") from None


def arrow_batch(name: str, ids: np.ndarray, seed: int = 42, **params) -> pa.RecordBatch:
    """The stream's records with these indices, as the Arrow batch the Spark UDF produces."""
    cols = _stream(name).make(np.asarray(ids, np.int64), seed, **params)
    return pa.RecordBatch.from_arrays(
        [v if isinstance(v, pa.Array) else pa.array(v, typ) for v, typ in cols.values()],
        schema=_stream(name).arrow_schema(),
    )


def records(name: str, start: int, end: int, seed: int = 42, **params) -> np.ndarray:
    """Records start..end-1 directly in the slashrt schema (no Spark, no converter)."""
    stream = _stream(name)
    ids = np.arange(start, end, dtype=np.int64)
    out = np.zeros(len(ids), stream.schema.dtype)
    for column, (values, _) in stream.make(ids, seed, **params).items():
        if isinstance(values, pa.Array):
            values = np.array(values.to_pylist(), dtype=stream.schema.field(column))
        out[column] = values
    return out


class _Generate:
    """The mapInArrow UDF: Arrow batches of `id` in, the stream's columns out."""

    def __init__(self, name: str, seed: int, params: dict):
        self.name, self.seed, self.params = name, seed, params

    def __call__(self, batches):
        for batch in batches:
            ids = batch.column(0).to_numpy()
            yield arrow_batch(self.name, ids, self.seed, **self.params)


def spark_stream(spark, name: str, events: int, *, partitions: int | None = None, seed: int = 42, start: int = 0, **params):
    """A DataFrame of `events` records of the named stream (indices start..start+events-1),
    generated on the Spark executors."""
    stream = _stream(name)
    ids = spark.range(start, start + events, numPartitions=partitions or spark.sparkContext.defaultParallelism)
    return ids.mapInArrow(_Generate(name, seed, params), stream.spark_schema())
