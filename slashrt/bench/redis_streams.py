"""`slashrt bench redis`: YSB from a Redis stream to a Redis stream, through the connectors.

A producer writes the generated events into a stream (`write_stream`, packed entries); the
query reads them with `RedisStream` and writes its counts with `RedisStreamSink`; the counts
read back from the output stream must equal the numpy reference. It reports the end-to-end
throughput (best of `repeat` runs) and the producer's; then the events go through a
transactional sink, one checkpoint per tenth of them, committed at once (`commit_s`), and must
come out whole. With `checkpoint_interval`, the query also runs checkpointed (a checkpoint
every that many seconds, the sink transactional): `records_per_s_checkpointed`,
`checkpointed_over_plain`, `checkpoints_completed`. Against the server at `url` (its keys
under a fresh prefix, removed after), or a throw-away redis-server started for it.
"""

from __future__ import annotations

import contextlib
import time
import uuid

import numpy as np

from slashrt.bench import ysb
from slashrt.bench._common import best_interleaved, checkpoint_fields, checkpointing, throughput_fields

__all__ = ["bench"]


def bench(*, events: int, campaigns: int = 1000, url: str | None = None, repeat: int = 1,
          checkpoint_interval: float | None = None, **options) -> dict:
    from slashrt.testing import redis_server

    with contextlib.nullcontext(url) if url else _server(redis_server) as url:
        return _bench(url, events, campaigns, repeat, checkpoint_interval, options)


@contextlib.contextmanager
def _server(redis_server):
    with redis_server() as server:
        yield server.url


def _bench(url: str, events: int, campaigns: int, repeat: int, interval: float | None, options: dict) -> dict:
    import redis

    from slashrt._run import run
    from slashrt.connectors import RedisStream, RedisStreamSink, read_stream, write_stream

    records = ysb.generate(events, campaigns)
    ads = ysb.campaign_map(campaigns)
    prefix = f"slashrt-bench-{uuid.uuid4().hex[:8]}"  # nothing of a user's server is touched
    source_key, out_key = f"{prefix}:events", f"{prefix}:counts"
    client = redis.Redis.from_url(url)
    try:
        started = time.perf_counter()
        write_stream(url, source_key, records)
        write_s = time.perf_counter() - started
        expected = ysb.reference(records, ads)
        correct, fields = True, {}

        def clear_output() -> None:  # the output stream and a transactional sink's keys beside it
            client.delete(out_key, *client.scan_iter(match=f"{out_key}:*"))

        def run_once(interval: float | None):
            nonlocal correct
            clear_output()
            sink = RedisStreamSink(url, out_key, transactional=interval is not None)
            with checkpointing(interval) as checkpoints:
                result = run(ysb.dataflow(ads, sink), {"events": RedisStream(url, source_key)}, **options, **checkpoints)
            got = read_stream(url, out_key, sink.record_dtype)
            correct = correct and np.array_equal(ysb.to_result(got), expected)
            return result

        runs = best_interleaved(repeat, run_once, [None] if interval is None else [None, interval])
        best = runs[None]
        if interval is not None:  # the same query, checkpointed into a transactional sink
            fields = {**checkpoint_fields(events, best, runs[interval]), "checkpoint_interval_s": interval}

        clear_output()  # the same output, published by checkpoints
        sink = RedisStreamSink(url, out_key, transactional=True)
        tenth = max(1, events // 10)
        sink.open()
        for n, first in enumerate(range(0, events, tenth), 1):
            sink.write(records[first : first + tenth])
            sink.pre_commit(n)
        started = time.perf_counter()
        sink.commit(n)
        commit_s = time.perf_counter() - started
        sink.close()
        committed = read_stream(url, out_key, records.dtype)
        correct = correct and np.array_equal(committed, records)
    finally:
        stale = list(client.scan_iter(match=f"{prefix}:*"))
        if stale:
            client.delete(*stale)
        client.close()
    return throughput_fields(
        "redis-ysb", events, best, correct=correct, campaigns=campaigns, repeat=repeat,
        write_records_per_s=round(events / write_s, 1), input_bytes=records.nbytes,
        commit_s=round(commit_s, 6), checkpoints=n, **fields,
    )
