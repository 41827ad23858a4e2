"""Redis Streams source and sink against a real redis-server (the `redis` fixture): a dataflow
round trip through many turns of a small ring, rewinding, following a stream to its end
entry, bad input (each one sentence), a server killed mid-read, and the sink's two-phase
commit, including a writer process SIGKILLed between pre-commit and commit."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import redis as redis_py
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import slashrt
from slashrt import Dataflow, DataflowError, Schema, SchemaError, sinks
from slashrt.bench import ysb
from slashrt.connectors import (
    ConnectorError,
    RedisStream,
    RedisStreamSink,
    end_stream,
    read_stream,
    write_stream,
)
from slashrt.connectors.redis_sink import RedisTransactions
from slashrt.errors import BrokerUnavailable, OptionError, SnapshotError
from slashrt.snapshot import TwoPhaseCommit, recover

ROWS = Schema({"t": "<i8", "key": "<i8", "value": "<f8"})


def rows(n: int, start: int = 0) -> np.ndarray:
    out = np.empty(n, ROWS.dtype)
    out["t"] = np.arange(start, start + n)
    out["key"] = out["t"] % 7
    out["value"] = out["t"] * 0.5
    return out


def passthrough(sink) -> Dataflow:
    flow = Dataflow("f")
    flow.source("events", ROWS, time="t").sink(sink, name="out")
    return flow


def client(server):
    return redis_py.Redis.from_url(server.url)


# -- the source in a dataflow ----------------------------------------------------------------------
def test_round_trip_through_a_window_and_the_sink_over_many_ring_turns(redis):
    ads = ysb.campaign_map(100)
    events = ysb.generate(200_000, 100, events_per_ms=2)
    ids = write_stream(redis.url, "events", events, entry_bytes=16 * 1024)
    assert len(ids) == -(-len(events) // (16 * 1024 // events.dtype.itemsize))
    source = RedisStream(redis.url, "events", count=8)
    sink = RedisStreamSink(redis.url, "counts")
    slot_size, slots = 4096, 8
    result = slashrt.run(ysb.dataflow(ads, sink), {"events": source}, slot_size=slot_size, slots=slots)
    # the data went round the ring of 8 slots many times over
    assert result.records == len(events) and result.stats[0].buffers > 50 * slots
    assert source.position == ids[-1] and source.delivered == len(events)

    collect = sinks.Collect()  # the same query over the array: the output's dtype and a second reference
    slashrt.run(ysb.dataflow(ads, collect), {"events": events})
    assert sink.record_dtype == collect.records.dtype
    counts = read_stream(redis.url, "counts", sink.record_dtype)
    expected = ysb.reference(events, ads)
    assert len(np.unique(expected["window_start_ms"])) == 10
    assert np.array_equal(ysb.to_result(counts), expected)
    assert np.array_equal(counts, collect.records)


def test_a_rewound_source_reads_exactly_the_rest(redis):
    parts = [rows(3000, 0), rows(2000, 3000), rows(5000, 5000)]
    ids = [write_stream(redis.url, "s", part, entry_bytes=1000) for part in parts]
    source = RedisStream(redis.url, "s")
    whole = sinks.Collect()
    slashrt.run(passthrough(whole), {"events": source}, slot_size=1024, slots=4)
    assert np.array_equal(whole.records, np.concatenate(parts))
    assert source.position == ids[-1][-1]

    again = sinks.Collect()  # the same object continues where it stopped: nothing new
    slashrt.run(passthrough(again), {"events": source})
    assert len(again.records) == 0

    for k in (0, 1):
        rest = sinks.Collect()
        slashrt.run(passthrough(rest), {"events": source.resume_from(ids[k][-1])}, slot_size=1024, slots=4)
        assert np.array_equal(rest.records, np.concatenate(parts[k + 1 :]))
    middle = ids[2][3]  # inside a write: from an entry on
    rest = sinks.Collect()
    slashrt.run(passthrough(rest), {"events": RedisStream(redis.url, "s", start=middle)})
    assert np.array_equal(rest.records, parts[2][4 * (1000 // ROWS.record_size) :])


def test_a_bounded_read_ends_at_the_last_entry_of_the_start(redis):
    first = rows(4000)
    write_stream(redis.url, "s", first, entry_bytes=800)
    late = rows(100, 4000)
    got = []

    def sink(records):  # runs while the source reads: later entries are not part of this run
        if not got:
            write_stream(redis.url, "s", late)
        got.append(records.copy())

    slashrt.run(passthrough(sinks.Callback(sink)), {"events": RedisStream(redis.url, "s", count=2)},
                slot_size=1024, slots=4)
    assert np.array_equal(np.concatenate(got), first)
    assert np.array_equal(read_stream(redis.url, "s", ROWS), np.concatenate([first, late]))


def test_an_end_entry_ends_a_bounded_read_too(redis):
    ids = write_stream(redis.url, "s", rows(300), entry_bytes=2400, end=True)
    write_stream(redis.url, "s", rows(5, 300))
    out = sinks.Collect()
    source = RedisStream(redis.url, "s")
    slashrt.run(passthrough(out), {"events": source})
    assert np.array_equal(out.records, rows(300)) and source.position == ids[-1]  # the end entry's
    assert np.array_equal(read_stream(redis.url, "s", ROWS), rows(300))  # so does read_stream


async def test_following_a_stream_waits_for_it_and_ends_at_its_end_entry(redis):
    parts = [rows(1000), rows(1500, 1000), rows(10, 2500)]
    out = sinks.Collect()
    source = RedisStream(redis.url, "later", stop_at_end=False, block_ms=50, count=4)

    async def producer():
        # the stream does not exist when the source starts following it
        for part in parts:
            await trio.to_thread.run_sync(lambda p=part: write_stream(redis.url, "later", p, entry_bytes=512))
        await trio.to_thread.run_sync(end_stream, redis.url, "later")
        await trio.to_thread.run_sync(write_stream, redis.url, "later", rows(5, 9000))  # after the end

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer)
            result = await slashrt.run_async(passthrough(out), {"events": source}, slot_size=1024, slots=4)
    assert np.array_equal(out.records, np.concatenate(parts))
    assert result.records == 2510
    end_id = client(redis).xrange("later")[-2][0].decode()
    assert source.position == end_id  # the end entry is consumed: a resumed follower waits for more


def test_start_at_the_end_reads_nothing_of_what_is_there(redis):
    write_stream(redis.url, "s", rows(100))
    out = sinks.Collect()
    source = RedisStream(redis.url, "s", start="$")
    slashrt.run(passthrough(out), {"events": source})
    assert len(out.records) == 0
    assert source.position == client(redis).xrange("s")[-1][0].decode()


def test_an_empty_stream_is_an_empty_input_a_missing_one_an_error(redis):
    c = client(redis)
    c.xadd("empty", {"x": 1})
    c.xtrim("empty", maxlen=0)
    out = sinks.Collect()
    slashrt.run(passthrough(out), {"events": RedisStream(redis.url, "empty")})
    assert len(out.records) == 0 and out.records.dtype == ROWS.dtype
    with pytest.raises(ConnectorError, match=r"^stream 'nope' does not exist at redis://.*stop_at_end=False"):
        slashrt.run(passthrough(sinks.Collect()), {"events": RedisStream(redis.url, "nope")})


# -- bad input: one sentence each ------------------------------------------------------------------
def test_without_redis_server_the_helper_says_how_to_install_it(monkeypatch, tmp_path):
    from slashrt.testing import redis_server

    monkeypatch.setenv("PATH", str(tmp_path))  # a machine where redis-server is not installed
    with pytest.raises(FileNotFoundError, match=r"^redis-server is not installed: run make install$"):
        with redis_server():
            pass


def test_options_and_urls_are_checked_when_made():
    with pytest.raises(OptionError, match=r"'http://x' is not a Redis URL"):
        RedisStream("http://x", "s")
    with pytest.raises(OptionError, match=r"'http://x' is not a Redis URL"):
        RedisStreamSink("http://x", "s")
    with pytest.raises(OptionError, match=r"start must be a stream id"):
        RedisStream("redis://127.0.0.1:1/0", "s", start="first")
    with pytest.raises(OptionError, match=r"count must be a positive"):
        RedisStream("redis://127.0.0.1:1/0", "s", count=0)


def test_an_unreachable_server_is_named(redis):
    url, at = redis.url, f"127.0.0.1:{redis.port}"
    redis.kill()
    with pytest.raises(BrokerUnavailable, match=rf"^the Redis broker at {at} cannot be reached while opening stream 's'"):
        slashrt.run(passthrough(sinks.Collect()), {"events": RedisStream(url, "s")})
    with pytest.raises(BrokerUnavailable,
                       match=rf"^the Redis broker at {at} cannot be reached while opening sink stream 'o'"):
        slashrt.run(passthrough(RedisStreamSink(url, "o")), {"events": rows(10)})
    with pytest.raises(BrokerUnavailable, match=rf"^the Redis broker at {at} cannot be reached while writing"):
        write_stream(url, "s", rows(10))


def test_messages_never_show_a_password(redis):
    url = redis.url.replace("redis://", "redis://:s3cret@")
    with pytest.raises(ConnectorError) as info:
        slashrt.run(passthrough(sinks.Collect()), {"events": RedisStream(url, "missing")})
    assert f"does not exist at {redis.url.replace('redis://', 'redis://:***@')}: " in str(info.value)
    for shown in (str(info.value), repr(RedisStream(url, "s")), repr(RedisStreamSink(url + "?password=s3cret", "o"))):
        assert "s3cret" not in shown


def test_a_key_that_is_not_a_stream_is_refused(redis):
    client(redis).rpush("alist", b"x")
    with pytest.raises(ConnectorError, match=r"key 'alist' at redis://\S+ holds a list, not a stream"):
        slashrt.run(passthrough(sinks.Collect()), {"events": RedisStream(redis.url, "alist")})


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"b": b"x" * 24, "n": 1}, r"has no field\(s\) schema \(it has: b, n\)"),
        ({"b": b"x" * 25, "n": 1, "schema": "SAME"}, r"holds 25 bytes for n=1 records of 24 bytes"),
        ({"b": b"x" * 48, "n": 3, "schema": "SAME"}, r"holds 48 bytes for n=3 records of 24 bytes"),
        ({"b": b"x" * 24, "n": "one", "schema": "SAME"}, r"has n=b'one', not a record count"),
    ],
)
def test_a_malformed_entry_fails_the_run_naming_it_after_what_came_before(redis, bad, message):
    good = rows(700)
    write_stream(redis.url, "s", good, entry_bytes=2400)
    from slashrt.connectors._redis import fingerprint

    fields = {k: (fingerprint(ROWS.dtype) if v == "SAME" else v) for k, v in bad.items()}
    bad_id = client(redis).xadd("s", fields).decode()
    write_stream(redis.url, "s", rows(50, 700))
    got = []
    source = RedisStream(redis.url, "s", count=3)
    with pytest.raises(ConnectorError, match=rf"^stream 's' at redis://\S+, entry {bad_id} {message}.*"
                                               r"resume_from\('\d+-\d+'\) reads on from there") as info:
        slashrt.run(passthrough(sinks.Callback(lambda r: got.append(r.copy()))), {"events": source},
                    slot_size=1024, slots=4)
    assert "\n" not in str(info.value)
    # every record before the bad entry reached the sink; the position is the entry before it
    assert np.array_equal(np.concatenate(got), good)
    assert source.position == client(redis).xrange("s", max=f"({bad_id}")[-1][0].decode()


def test_a_stream_written_with_another_schema_is_refused_naming_both(redis):
    other = np.zeros(10, [("t", "<i8"), ("key", "<i4"), ("value", "<f8")])
    write_stream(redis.url, "s", other)
    with pytest.raises(SchemaError, match=r"entry \S+ was written with schema fingerprint '[0-9a-f]{12}', but "
                                          r"source 'f.events' reads schema '[0-9a-f]{12}' \(\[t: <i8 @0"):
        slashrt.run(passthrough(sinks.Collect()), {"events": RedisStream(redis.url, "s")})


def test_a_server_killed_mid_read_fails_the_run_after_what_was_delivered(redis):
    data = rows(20_000)
    ids = write_stream(redis.url, "s", data, entry_bytes=4800)
    got = []

    def sink(records):
        got.append(records.copy())
        if sum(map(len, got)) >= 5000:
            redis.kill()  # the server vanishes in the middle of the run

    source = RedisStream(redis.url, "s", count=2, stop_at_end=False)
    with pytest.raises(ConnectorError, match=rf"^the Redis broker at 127.0.0.1:{redis.port} cannot be reached while "
                                             r"reading stream 's' "
                                             r"after id \S+: .*; the \d+ records before it were delivered"):
        slashrt.run(passthrough(sinks.Callback(sink)), {"events": source}, slot_size=1024, slots=4)
    delivered = np.concatenate(got)
    # everything read before the failure went through the dataflow, in order, none twice
    assert 5000 <= len(delivered) == source.delivered < len(data)
    assert np.array_equal(delivered, data[: len(delivered)])
    per_entry = 4800 // ROWS.record_size
    assert len(delivered) % per_entry == 0 and source.position == ids[len(delivered) // per_entry - 1]


# -- the packed format ---------------------------------------------------------------------------
FIELD_TYPES = st.sampled_from(["<i8", "<i4", "u1", "<f8", "<f4", "S5", "V3", "<u2", ">i4", "<i2"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(types=st.lists(FIELD_TYPES, min_size=1, max_size=5), n=st.integers(0, 3000),
       entry_bytes=st.integers(1, 5000), data=st.data())
def test_write_then_read_returns_the_records(redis, types, n, entry_bytes, data):
    dtype = np.dtype([(f"f{i}", t) for i, t in enumerate(types)])
    raw = data.draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize))
    records = np.frombuffer(raw, dtype)
    client(redis).flushdb()  # one server for every example
    write_stream(redis.url, "s", records, entry_bytes=entry_bytes)
    back = read_stream(redis.url, "s", dtype)
    assert back.tobytes() == Schema.from_dtype(dtype).conform(records, "x").tobytes()


# -- the sink ----------------------------------------------------------------------------------------
def test_the_sink_writes_each_batch_at_once_without_checkpoints(redis):
    data = rows(10_000)
    sink = RedisStreamSink(redis.url, "out")
    slashrt.run(passthrough(sink), {"events": data}, slot_size=1024, slots=4)
    assert np.array_equal(read_stream(redis.url, "out", ROWS), data)
    assert sink.written == len(data)


def test_a_sink_made_without_transactional_refuses_checkpoints_in_one_sentence(redis):
    sink = RedisStreamSink(redis.url, "out")
    assert isinstance(sink, TwoPhaseCommit) and sink.pending() == []
    with pytest.raises(SnapshotError, match=r"^checkpoint 1: this RedisStreamSink sink is not transactional; make it "
                                            r"with RedisStreamSink\(\.\.\., transactional=True\)"):
        sink.pre_commit(1)


def test_a_pre_commit_begun_at_the_barrier_keeps_its_place_among_the_writes_whoever_awaits_it(redis):
    """The calls of a sink's worker run in the order they were made, not awaited: a pre-commit
    begun between two writes takes exactly the first into its checkpoint, though the second
    write's task is awaited first and the pre-commit's last; a pre-commit the broker ran
    already (after a timeout) leaves nothing to rename, and the next one does not fail on it."""
    sink = RedisStreamSink(redis.url, "out", transactional=True)
    sink.open()
    a, b = rows(100), rows(60, 100)

    async def main():
        async with trio.open_nursery() as nursery:
            before, pre_commit, after = sink.awrite(a), sink.apre_commit(1), sink.awrite(b)
            nursery.start_soon(lambda: after)
            nursery.start_soon(lambda: before)
            await trio.testing.wait_all_tasks_blocked()
            await pre_commit
        await sink.apre_commit(2)  # checkpoint 2: b
        sink._transactions.open_entries = 1  # as after a pre-commit that timed out, then ran
        await sink.apre_commit(3)  # nothing on the server to rename

    trio.run(main)
    assert sink.pending() == [1, 2, 3]
    assert sink.commit(1) == 1 and np.array_equal(read_stream(redis.url, "out", ROWS), a)
    assert sink.commit(3) == 1 and np.array_equal(read_stream(redis.url, "out", ROWS), np.concatenate([a, b]))
    sink.close()


def test_two_phase_commit_publishes_each_checkpoint_once_and_aborts_drop(redis):
    sink = RedisStreamSink(redis.url, "out", transactional=True)
    sink.open()
    a, b, c, d = rows(100), rows(200, 100), rows(300, 300), rows(50, 600)

    def published():
        return read_stream(redis.url, "out", ROWS)

    sink.write(a)
    sink.pre_commit(1)
    sink.write(b[:150])
    sink.write(b[150:])
    sink.pre_commit(2)
    assert len(published()) == 0 and sink.pending() == [1, 2]
    assert sink.commit(1) == 1
    assert np.array_equal(published(), a)
    assert sink.commit(1) == 0 and sink.commit(0) == 0  # a repeat is a no-op
    sink.write(c)
    sink.pre_commit(3)
    sink.abort(3)
    sink.pre_commit(4)  # nothing written since: an empty checkpoint
    sink.write(d)
    sink.pre_commit(5)
    assert sink.pending() == [2, 4, 5]
    assert sink.commit(4) == 2  # subsumes checkpoint 2, in order
    assert np.array_equal(published(), np.concatenate([a, b]))
    assert sink.last_committed() == 4 and sink.pending() == [5]
    assert sink.commit(5) == 1 and sink.commit(5) == 0 and sink.commit(3) == 0
    assert np.array_equal(published(), np.concatenate([a, b, d]))
    assert sink.pending() == []
    sink.close()


def test_a_commit_racing_another_publishes_nothing_twice(redis):
    """Two committers of one writer (a recovering job and a late one): the second reads the
    pending entries, the first commits before the second's MULTI; the watched marker makes the
    second's EXEC fail, it looks again and finds nothing left to publish."""
    data = rows(500)
    first = RedisStreamSink(redis.url, "out", transactional=True, entry_bytes=480)
    first.open()
    first.write(data)
    first.pre_commit(1)
    raced = []

    class Interleaved(RedisTransactions):
        def _commit(self, pipe, checkpoint):
            multi = pipe.multi

            def other_commits_first():
                if not raced:  # between this committer's reads and its MULTI, once
                    raced.append(first.commit(checkpoint))
                multi()

            pipe.multi = other_commits_first
            return super()._commit(pipe, checkpoint)

    second = Interleaved(client(redis), redis.url, "out", executor=0)
    assert second.commit(1) == 0
    assert raced == [-(-data.nbytes // 480)]
    assert np.array_equal(read_stream(redis.url, "out", ROWS), data)


def test_writers_keep_their_own_checkpoints(redis):
    zero = RedisStreamSink(redis.url, "out", transactional=True)
    one = zero.for_executor(1)
    for sink, part in ((zero, rows(10)), (one, rows(20, 10))):
        sink.open()
        sink.write(part)
        sink.pre_commit(1)
    assert zero.commit(1) == 1 and zero.commit(1) == 0
    assert one.pending() == [1] and one.last_committed() is None
    assert one.commit(1) == 1
    assert np.array_equal(read_stream(redis.url, "out", ROWS), rows(30))


WRITER = textwrap.dedent(
    """
    import sys, threading
    import numpy as np
    from slashrt.connectors import RedisStreamSink

    url, key = sys.argv[1:3]
    dtype = np.dtype([("t", "<i8"), ("key", "<i8"), ("value", "<f8")])
    def rows(n, start):
        out = np.zeros(n, dtype)
        out["t"] = np.arange(start, start + n)
        out["key"] = out["t"] % 7
        out["value"] = out["t"] * 0.5
        return out
    sink = RedisStreamSink(url, key, transactional=True, entry_bytes=4096)
    sink.open()
    sink.write(rows(1000, 0))
    sink.pre_commit(1)
    sink.commit(1)
    sink.write(rows(2000, 1000))
    sink.pre_commit(2)
    print("pre-committed 2", flush=True)
    sink.write(rows(500, 3000))  # staged after the last barrier
    print("staged", flush=True)
    threading.Event().wait()  # killed here: checkpoint 2 is never committed by this process
    """
)


@pytest.mark.parametrize("restored", [1, 2])
def test_a_writer_killed_between_pre_commit_and_commit_loses_and_repeats_nothing(redis, tmp_path, restored):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen([sys.executable, str(script), redis.url, "out"], stdout=subprocess.PIPE, env=env,
                            text=True)
    try:
        assert proc.stdout.readline() == "pre-committed 2\n"
        assert proc.stdout.readline() == "staged\n"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
    everything = rows(3500)
    assert np.array_equal(read_stream(redis.url, "out", ROWS), everything[:1000])  # only checkpoint 1

    # recovery from checkpoint `restored`: a new writer (the restarted job's) settles the pending ones
    sink = RedisStreamSink(redis.url, "out", transactional=True)
    assert sink.pending() == [2] and sink.last_committed() == 1
    assert recover(sink, restored) == (([2], []) if restored == 2 else ([], [2]))
    assert recover(sink, restored) == ([], [])  # a crash during recovery repeats it: no effect
    assert sink.pending() == []
    published = read_stream(redis.url, "out", ROWS)
    assert np.array_equal(published, everything[: 1000 if restored == 1 else 3000])
    # the source rewinds to the restored position and the job writes the rest again
    sink.open()
    sink.write(everything[len(published) :])
    sink.pre_commit(3)
    sink.commit(3)
    sink.commit(3)
    sink.close()
    assert np.array_equal(read_stream(redis.url, "out", ROWS), everything)  # each record exactly once


def test_a_sink_whose_server_dies_fails_the_run_naming_the_step_and_the_server(redis):
    seen = []

    async def vanish_after_two_batches(batch):
        seen.append(len(batch))
        if len(seen) == 3:
            redis.kill()
        return batch

    flow = Dataflow("f")
    flow.source("events", ROWS, time="t").apply(vanish_after_two_batches).sink(RedisStreamSink(redis.url, "o"),
                                                                               name="out")
    with pytest.raises(slashrt.OperatorError, match=rf"^step 'f.out': sink failed: BrokerUnavailable: the Redis "
                                                    rf"broker at 127.0.0.1:{redis.port} cannot be reached while "
                                                    r"writing to stream 'o'"):
        slashrt.run(flow, {"events": rows(5000)}, slot_size=1024, slots=4, coalesce=1)


# one operation of a writer: (name, argument); checkpoints are numbered as a coordinator would
OPS = st.one_of(
    st.tuples(st.just("write"), st.integers(0, 300)),
    st.tuples(st.just("pre_commit"), st.none()),
    st.tuples(st.just("commit"), st.integers(0, 12)),
    st.tuples(st.just("abort"), st.integers(0, 12)),
    st.tuples(st.just("recover"), st.one_of(st.none(), st.integers(0, 12))),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, max_size=25))
def test_two_phase_commit_laws(redis, ops):
    """Whatever the order of writes, pre-commits, commits (repeated, out of order), aborts and
    crash recoveries, the stream holds exactly the committed checkpoints' records, each once,
    in checkpoint order: commit(n) publishes every pending checkpoint up to n not yet
    published; a commit at or below the last committed one publishes nothing; an aborted
    checkpoint never appears; recovery from r (slashrt.snapshot.recover) commits the
    pending ones up to r and drops the rest, and opening drops what followed the last barrier."""
    client(redis).flushdb()  # one server for every example
    stream = "out"
    sink = RedisStreamSink(redis.url, stream, transactional=True, entry_bytes=480)
    sink.open()
    written = 0  # rows(...) numbering: every record is distinct
    staged, pending, published, last, checkpoint = [], {}, [], -1, 0

    def commit(n):
        nonlocal last
        for m in sorted(pending):
            if m <= n:
                if m > last:
                    published.extend(pending[m])
                del pending[m]
        last = max(last, n)

    for op, arg in ops:
        if op == "write":
            sink.write(rows(arg, written))
            staged.extend(range(written, written + arg))
            written += arg
        elif op == "pre_commit":
            checkpoint += 1
            sink.pre_commit(checkpoint)
            pending[checkpoint], staged = staged, []
        elif op == "commit":
            sink.commit(arg)
            commit(arg)
        elif op == "abort":
            sink.abort(arg)
            pending.pop(arg, None)
        else:  # the writer crashed; its successor recovers from checkpoint `arg`
            sink = RedisStreamSink(redis.url, stream, transactional=True, entry_bytes=480)
            recover(sink, arg)
            sink.open()
            covered = [n for n in pending if arg is not None and n <= arg]
            if covered:
                commit(max(covered))
            pending, staged = {}, []
        assert read_stream(redis.url, stream, ROWS)["t"].tolist() == published
        assert sink.pending() == sorted(pending)
    sink.close()


def test_the_sink_on_two_executors_writes_each_record_once(redis):
    data = rows(10_000)
    slashrt.run(passthrough(RedisStreamSink(redis.url, "out")), {"events": data}, executors=2)
    back = read_stream(redis.url, "out", ROWS)
    assert np.array_equal(np.sort(back["t"]), data["t"])


def test_bench_redis_checks_itself_and_leaves_the_server_as_it_was(redis, capsys):
    import json

    from slashrt.cli import main

    client(redis).set("mine", b"x")
    assert main(["bench", "redis", "--events", "50000", "--repeat", "2", "--slot-size", "4096", "--json",
                 "--url", redis.url, "--checkpoint-interval", "0.001"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["correct"] is True and report["query"] == "redis-ysb" and report["events"] == 50_000
    assert report["records_per_s"] > 0 and report["write_records_per_s"] > 0 and report["checkpoints"] == 10
    assert report["records_per_s_checkpointed"] > 0 and report["checkpoint_interval_s"] == 0.001
    assert client(redis).keys("*") == [b"mine"]  # the transactional sink's keys are gone too


@pytest.mark.parametrize("query", ["redis", "files"])
@pytest.mark.parametrize("value, message", [("0", "'0' must be positive"), ("soon", "'soon' is not a number")])
def test_bench_checkpoint_interval_must_be_a_positive_number(capsys, query, value, message):
    from slashrt.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", query, "--checkpoint-interval", value])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and "--checkpoint-interval" in err
