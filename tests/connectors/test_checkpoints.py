"""Sources in checkpointed runs (in process; the SIGKILL tests are in
tests/snapshot/test_checkpoint_run.py): the position an array, a FileSource or a RedisStream
records at a barrier requested at seeded random moments (inside reads too) resumes exactly at
the first record after that barrier; in runs, every checkpoint's recorded position is what its
window state counted and a resume from any of the checkpoints ends with every record counted
once; a resumed bounded stream ends where the checkpointed run would have, a resume after the
end entry reads nothing, files added later wait for a next source; a followed stream with
nothing new lets barriers through; what a resume cannot read again exactly (files changed
among those listed, stream entries deleted after the position) is refused in one sentence."""

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import redis as redis_py
import trio

import slashrt
from slashrt import Dataflow, Schema, Tumbling, sinks
from slashrt._plan import build_plan
from slashrt.connectors import ConnectorError, FileSource, RedisStream, end_stream, write_stream
from slashrt.errors import SnapshotError, unwrap_groups
from slashrt.ops.sinks import to_arrow
from slashrt.ops.sources import feed_array
from slashrt.snapshot import SnapshotStore
from slashrt.snapshot.runtime import SourceBarriers
from slashrt.snapshot.state_format import State
from slashrt.transport import RingSpec, open_inproc_channel

from tests.snapshot._channel import read_all

SCHEMA = Schema({"t": "<i8", "k": "<i8", "v": "<i8"})
RING = {"slots": 4, "slot_size": 1024}  # 42 records a slot, a ring of 168: reads span many turns


def records(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros(n, SCHEMA.dtype)
    out["t"] = np.arange(n)
    out["k"] = rng.integers(0, 2, n)
    out["v"] = rng.integers(-100, 100, n)
    return out


def write_files(directory: Path, data: np.ndarray) -> None:
    """`data` as three files, .npy, Parquet (row groups of 1000) and CSV, in that order."""
    directory.mkdir()
    np.save(directory / "part-0.npy", data[: len(data) // 3])
    pq.write_table(to_arrow(data[len(data) // 3 : 2 * len(data) // 3]), directory / "part-1.parquet", row_group_size=1000)
    csv = sinks.CsvFile(directory / "part-2.csv")
    csv.open()
    csv.write(data[2 * len(data) // 3 :])
    csv.close()


# -- a barrier's position, at the feed ------------------------------------------------------------
async def consume(receiver, barriers=None, request_after=()) -> tuple[np.ndarray, dict[int, int]]:
    """Read the channel to its end, requesting barrier 1, 2, ... of `barriers` right after the
    data buffers numbered in `request_after` (the feeder is then in the middle of its input).
    Returns the records and, per barrier, how many records came before it."""
    events: list = []
    points = sorted(request_after)
    await read_all(receiver, SCHEMA.dtype, events,
                   lambda k: k in request_after and barriers.request(points.index(k) + 1))
    got, before = [], {}
    for kind, value in events:
        if kind == "records":
            got.append(value)
        elif kind == "barrier":
            before[value] = sum(map(len, got))
    return (np.concatenate(got) if got else np.empty(0, SCHEMA.dtype)), before


def feeding(kind: str, data: np.ndarray, where):
    """A function feeding a fresh source of `kind` over `data` into a sender (resume, barriers)."""
    spec = build_plan(counting("feed")[0]).sources["feed.a"]

    def feed(sender, resume=None, barriers=None):
        if kind == "array":
            return feed_array(sender, data, time="t", max_delay=0, watermark_every=3, resume=resume, barriers=barriers)
        source = FileSource(where, batch_records=700) if kind == "files" else RedisStream(where, "a", count=3)
        return source.feed(sender, spec, watermark_every=3, resume=resume, barriers=barriers)

    return feed


async def feed_through(feed, resume=None, barriers=None, request_after=()):
    """`consume` what `feed` sends through a ring of 4 slots of 21 records."""
    sender, receiver = open_inproc_channel(RingSpec(slots=4, slot_size=512, record_size=SCHEMA.record_size))
    async with unwrap_groups(), trio.open_nursery() as nursery:
        nursery.start_soon(feed, sender, resume, barriers)
        return await consume(receiver, barriers, request_after)


async def redis_position(url: str, data: np.ndarray) -> tuple[dict, list[str]]:
    """`data` written to stream "a" (85 records an entry), and the position a RedisStream
    recorded at a barrier in the middle of it; the entries' ids."""
    ids = write_stream(url, "a", data, entry_bytes=2048)
    barriers = SourceBarriers("feed.a")
    await feed_through(feeding("redis", data, url), barriers=barriers, request_after={len(data) // 42})
    position = barriers.positions[1]
    assert 0 < position["cursor"]["entries"] == ids.index(position["cursor"]["after"]) + 1 < len(ids)
    return position, ids


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("kind", ["array", "files", "redis"])
async def test_a_position_recorded_at_a_barrier_resumes_at_the_first_record_after_it(kind, seed, tmp_path, request):
    data = records(12_000, seed)
    where = None
    if kind == "files":
        where = tmp_path / "in"
        write_files(where, data)
    elif kind == "redis":
        where = request.getfixturevalue("redis").url
        write_stream(where, "a", data, entry_bytes=2048)  # 85 records an entry, 3 entries a read
    feed = feeding(kind, data, where)
    points = set(np.random.default_rng(seed).choice(np.arange(1, len(data) // 21), 12, replace=False).tolist())
    barriers = SourceBarriers("feed.a")
    whole, before = await feed_through(feed, barriers=barriers, request_after=points)
    assert np.array_equal(whole, data) and sorted(before) == list(range(1, 13))
    assert kind == "array" or any(barriers.positions[n]["skip"] for n in before)  # inside a read
    for n, count in before.items():
        assert barriers.positions[n]["fed"] == count
        rest, _ = await feed_through(feed, resume=State({}, barriers.positions[n]))
        assert np.array_equal(rest, data[count:]), (n, count, barriers.positions[n])


# -- checkpointed runs --------------------------------------------------------------------------
def counting(name: str) -> tuple[Dataflow, sinks.Collect]:
    """One window over the whole stream counting per key: its state is what went in."""
    flow = Dataflow(name)
    out = sinks.Collect(transactional=True)
    flow.source("a", SCHEMA, time="t").window(Tumbling(ms=10**9)).count(key="k").sink(out, name="out")
    return flow, out


def checkpointed(flow, source, directory: Path, **options):
    return slashrt.run(flow, {"a": source}, checkpoint_dir=directory, **RING, **options)


def check_positions_and_resumes(name: str, make_source, data: np.ndarray, directory: Path) -> list[dict]:
    """Run checkpointed; every checkpoint's window counted exactly the records its position says
    were fed; a resume from each ends with every record counted once. Returns the positions."""
    flow, _ = counting(name)
    checkpointed(flow, make_source(), directory, checkpoint={"interval": 0.001, "max_in_flight": 4, "keep": 1000})
    store = SnapshotStore(directory, job=name, keep=1000)
    expected = np.bincount(data["k"], minlength=2).tolist()
    positions, before_end = [], []
    for n in store.checkpoints():
        checkpoint = store.load(n)
        position = checkpoint.meta["sources"][f"{name}.a"]["0"]
        if position["fed"] == len(data):  # taken once all was fed: the window may have fired (one or more of them)
            continue
        (window,) = [s for s in checkpoint.states.values() if "slices.keys" in s.arrays]
        # an unaligned checkpoint also holds records fed and not yet computed (channel state)
        flying = sum(len(s.arrays["records"]) for s in checkpoint.states.values() if s.meta.get("kind") == "channel_state")
        assert int(window.arrays["slices.counts"].sum()) + flying == position["fed"], (n, position)
        positions.append(position)
        before_end.append(n)
    assert positions, "no checkpoint before the end"
    for n in before_end[:: max(1, len(positions) // 6)]:
        flow, out = counting(name)
        checkpointed(flow, make_source(), directory, checkpoint={"keep": 1000}, resume_from=n)
        assert sorted(out.records["count"].tolist()) == sorted(expected), n
    return positions


def test_file_sources_resume_from_every_checkpoint_exactly(tmp_path):
    data = records(120_000, 1)
    write_files(tmp_path / "in", data)
    check_positions_and_resumes("files", lambda: FileSource(tmp_path / "in", batch_records=1500), data, tmp_path / "chk")


def test_redis_streams_resume_from_every_checkpoint_exactly(redis, tmp_path):
    data = records(120_000, 2)
    write_stream(redis.url, "a", data, entry_bytes=4096)  # 170 records an entry
    positions = check_positions_and_resumes("redis", lambda: RedisStream(redis.url, "a", count=8), data, tmp_path)
    ends = {p["cursor"]["end"] for p in positions}
    assert len(ends) == 1 and None not in ends  # the bounded read's end, fixed at the start


def test_a_resumed_bounded_read_ends_where_the_checkpointed_run_would_have(redis, tmp_path):
    data = records(20_000, 3)
    write_stream(redis.url, "a", data, entry_bytes=4096)
    flow, _ = counting("bounded")
    checkpointed(flow, RedisStream(redis.url, "a"), tmp_path, checkpoint={"interval": 0.001, "keep": 1000})
    store = SnapshotStore(tmp_path, job="bounded", keep=1000)
    first = store.checkpoints()[0]
    write_stream(redis.url, "a", records(5_000, 4))  # appended after that run's start
    flow, out = counting("bounded")
    checkpointed(flow, RedisStream(redis.url, "a"), tmp_path, checkpoint={"keep": 1000}, resume_from=first)
    assert sorted(out.records["count"].tolist()) == sorted(np.bincount(data["k"], minlength=2).tolist())


@pytest.mark.parametrize("stop_at_end", [True, False])
async def test_a_resume_after_the_end_entry_reads_nothing_more(redis, tmp_path, stop_at_end):
    data = records(4_000, 11)
    write_stream(redis.url, "a", data, end=True)
    write_stream(redis.url, "a", records(100, 12))  # after the end entry: never part of this input
    for resume in (None, "latest"):  # the second run resumes from the final checkpoint
        flow, _ = counting("ended")
        source = RedisStream(redis.url, "a", stop_at_end=stop_at_end, block_ms=20)
        with trio.fail_after(60):  # a followed stream must not wait for another end entry
            await slashrt.run_async(flow, {"a": source}, checkpoint_dir=tmp_path, resume_from=resume, **RING)
        assert source.delivered == (len(data) if resume is None else 0)


async def test_a_followed_stream_with_nothing_new_lets_barriers_through(redis, tmp_path):
    data = records(5_000, 5)
    last = write_stream(redis.url, "a", data)[-1]
    flow, out = counting("follow")
    store = SnapshotStore(tmp_path, job="follow")

    async def end_once_a_checkpoint_holds_everything():
        # the stream is idle from here on: only the source's empty reads can carry the barriers
        while not any(store.load(n).meta["sources"]["follow.a"]["0"]["cursor"]["after"] == last
                      for n in store.checkpoints()):
            await trio.sleep(0.01)  # polls the directory; the checkpoints come from the run
        end_stream(redis.url, "a")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(end_once_a_checkpoint_holds_everything)
        result = await slashrt.run_async(
            flow, {"a": RedisStream(redis.url, "a", stop_at_end=False, block_ms=20)}, checkpoint_dir=tmp_path,
            checkpoint={"interval": 0.02, "keep": 1000}, **RING,
        )
    assert sum(out.records["count"]) == len(data)
    assert sum(c["status"] == "completed" for c in result.checkpoints) >= 2


def test_a_resume_over_changed_files_is_refused(tmp_path):
    directory = tmp_path / "in"
    directory.mkdir()
    np.save(directory / "part-1.npy", records(3_000, 6))
    flow, _ = counting("changed")
    checkpointed(flow, FileSource(directory), tmp_path / "chk")
    np.save(directory / "part-0.npy", records(10, 7))  # sorts first: every index moved
    flow, _ = counting("changed")
    with pytest.raises(ConnectorError, match=r"taken over 1 files, which are not the first 1 listed now \(2\)"):
        checkpointed(flow, FileSource(directory), tmp_path / "chk", resume_from="latest")


def test_files_added_after_the_checkpointed_ones_wait_for_a_next_source(tmp_path):
    directory = tmp_path / "in"
    directory.mkdir()
    data = records(3_000, 8)
    np.save(directory / "part-0.npy", data)
    flow, _ = counting("later")
    checkpointed(flow, FileSource(directory), tmp_path / "chk", checkpoint={"interval": 0.001, "keep": 1000})
    np.save(directory / "part-1.npy", records(500, 9))  # not seen by the checkpointed run
    source = FileSource(directory)
    flow, out = counting("later")
    first = SnapshotStore(tmp_path / "chk", job="later", keep=1000).checkpoints()[0]
    checkpointed(flow, source, tmp_path / "chk", checkpoint={"keep": 1000}, resume_from=first)
    assert sum(out.records["count"]) == len(data) and source.position == (1, 0)


async def test_a_resume_from_a_stream_with_entries_deleted_after_its_position_is_refused(redis):
    data = records(12_000, 10)
    position, ids = await redis_position(redis.url, data)
    redis_py.Redis.from_url(redis.url).xdel("a", ids[-1])
    with pytest.raises(ConnectorError, match=f"had entries deleted after id .*, where the checkpoint resumes .*{ids[-1]}"):
        await feed_through(feeding("redis", data, redis.url), resume=State({}, position))


async def test_a_stream_trimmed_up_to_a_position_resumes_and_one_trimmed_past_it_is_refused(redis):
    data = records(12_000, 13)
    position, ids = await redis_position(redis.url, data)
    after, entries = position["cursor"]["after"], position["cursor"]["entries"]
    server = redis_py.Redis.from_url(redis.url)
    server.xtrim("a", minid=after, approximate=False)  # what the position had read, but its own entry
    server.xdel("a", after)  # and that one too: nothing after it is gone
    rest, _ = await feed_through(feeding("redis", data, redis.url), resume=State({}, position))
    assert np.array_equal(rest, data[position["fed"] :])
    server.xtrim("a", maxlen=len(ids) - entries - 1, approximate=False)  # one entry after it too
    with pytest.raises(ConnectorError, match=rf"had entries deleted after id {after}, where the checkpoint resumes "
                                             rf"\(trimmed: {entries + 1} entries removed, of which {entries} were added up to it\)"):
        await feed_through(feeding("redis", data, redis.url), resume=State({}, position))


@pytest.mark.parametrize("taken, resumed", [("array", "files"), ("files", "redis"), ("redis", "array")])
async def test_a_position_of_another_kind_of_input_is_refused(redis, tmp_path, taken, resumed):
    data = records(3_000, 14)
    write_files(tmp_path / "in", data)
    write_stream(redis.url, "a", data)
    where = {"files": tmp_path / "in", "redis": redis.url, "array": None}
    barriers = SourceBarriers("feed.a")
    await feed_through(feeding(taken, data, where[taken]), barriers=barriers, request_after={20})
    with pytest.raises(SnapshotError, match="source 'feed.a': the checkpoint's position was taken of another kind of "
                                            "input .*: resume with the input the checkpointed run had"):
        await feed_through(feeding(resumed, data, where[resumed]), resume=State({}, barriers.positions[1]))
