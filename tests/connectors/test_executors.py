"""Connector sources on several executors (real agent processes, a real redis-server): a
FileSource reads file k on executor k mod N, a RedisStream shares one stream by its entries'
ids (`owner`; bounded, and followed to its end entry); over shm on 2 executors and tcp on 3,
with rings far smaller than the data, the output equals one executor's; a resume on as many
executors rewinds each to its own position; each executor's watermark comes from what it read; a SIGKILLed
executor is restarted from the last checkpoint and the committed output has every record
exactly once (its final checkpoint resumed on 3 executors reads nothing more: test_file_rescale.py
rescales mid-file, tests/connectors/test_rescale.py a RedisStream); and
`slashrt bench chaos --redis` (a short form) puts the Redis source and sink under kills."""

import json
from pathlib import Path

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Schema, Tumbling, sinks
from slashrt.bench import chaos
from slashrt.bench.chaos import ChaosCsv, published
from slashrt.connectors import FileSource, RedisStream, RedisStreamSink, read_stream, write_stream
from slashrt.connectors.redis_streams import owner
from slashrt.errors import SlashError

from tests.snapshot._paced import Paced, behind, until_fired

SCHEMA = Schema({"t": "<i8", "k": "<i8", "v": "<i8"})
RING = {"slots": 4, "slot_size": 1024}  # 42 records a slot: the data goes round each ring hundreds of times
N = 30_000
FILES = 7  # of unequal sizes: 2 executors read 4 and 3 of them, 3 executors 3, 2 and 2


def records(n: int = N, start: int = 0) -> np.ndarray:
    out = np.zeros(n, SCHEMA.dtype)
    out["t"] = np.arange(start, start + n)
    out["k"] = out["t"] * 7919 % 13
    out["v"] = out["t"] % 101 - 50
    return out


def windowed(name: str, sink, pace=None) -> Dataflow:
    """`pace`: a pass-through filter behind the source (`tests.snapshot._paced.Paced`), or none."""
    flow = Dataflow(name)
    events = flow.source("events", SCHEMA, time="t", max_delay=20)
    events = behind(events, pace)
    events.window(Tumbling(ms=100)).sum("v", key="k", output="total").sink(sink, name="out")
    return flow


def passthrough(name: str, sink) -> Dataflow:
    flow = Dataflow(name)
    flow.source("events", SCHEMA, time="t", max_delay=20).sink(sink, name="out")
    return flow


FLOWS = {"windowed": windowed, "passthrough": passthrough}


def equals_one_executor(kind: str, got: np.ndarray, data: np.ndarray) -> bool:
    """`got` (a run's output on several executors, in any order) is one executor's over `data`."""
    if kind == "passthrough":
        return np.array_equal(np.sort(got, order="t"), data)
    return np.array_equal(np.sort(got, order=["window_start", "k"]), one_executor(data))


def one_executor(data: np.ndarray) -> np.ndarray:
    out = sinks.Collect()
    slashrt.run(windowed("w", out), {"events": data})
    return np.sort(out.records, order=["window_start", "k"])


def write_files(directory: Path, data: np.ndarray) -> list[int]:
    """`data` in FILES .npy files in order (part-0 ... part-6), sizes growing; returns the sizes."""
    directory.mkdir()
    cuts = np.cumsum(np.arange(1, FILES + 1)) * len(data) // (FILES * (FILES + 1) // 2)
    parts = np.split(data, cuts[:-1])
    for i, part in enumerate(parts):
        np.save(directory / f"part-{i}.npy", part)
    return [len(p) for p in parts]


# a windowed flow (state exchanged between the executors), and one without an exchange, whose
# executors' record counts are their sources' alone: the assignment rule, checked
SHAPES = [(2, "shm", "windowed"), (3, "tcp", "passthrough")]


@pytest.mark.parametrize("executors, transport, kind", SHAPES)
def test_file_sources_on_several_executors_equal_one_executor(tmp_path, executors, transport, kind):
    data = records()
    sizes = write_files(tmp_path / "in", data)
    out = sinks.Collect()
    result = slashrt.run(FLOWS[kind]("w", out), {"events": FileSource(tmp_path / "in", batch_records=500)},
                         executors=executors, transport=transport, **RING)
    if kind == "passthrough":  # file k on executor k mod N, whole
        assert [s.records for s in result.stats] == [sum(sizes[i::executors]) for i in range(executors)]
    assert min(s.buffers for s in result.stats) > 20 * RING["slots"]
    assert equals_one_executor(kind, out.records, data)
    assert sum(result.late_records.values()) == 0


@pytest.mark.parametrize("executors, transport, kind", SHAPES)
def test_a_redis_stream_on_several_executors_equals_one_executor(redis, executors, transport, kind):
    data = records()
    follow = kind == "passthrough"  # then following the stream: every executor ends at its end entry
    ids = write_stream(redis.url, "events", data, entry_bytes=24 * 40, end=follow)  # 40 records an entry: 750 entries
    sink = RedisStreamSink(redis.url, "out")
    source = RedisStream(redis.url, "events", count=16, stop_at_end=not follow)
    result = slashrt.run(FLOWS[kind]("w", sink), {"events": source}, executors=executors, transport=transport, **RING)
    if kind == "passthrough":  # the entries whose id's CRC-32 is i mod N on executor i, each entry whole
        mine = np.array([owner(i.encode(), executors) for i in ids[:-1]])
        assert [s.records for s in result.stats] == [40 * int((mine == i).sum()) for i in range(executors)]
        assert min(s.records for s in result.stats) > 0.2 * N
    assert min(s.buffers for s in result.stats) > 20 * RING["slots"]
    assert equals_one_executor(kind, read_stream(redis.url, "out", sink.record_dtype), data)


def test_each_executor_judges_lateness_by_what_it_read(tmp_path):
    # part-0 holds the later half of the time range: read before part-1 on one executor, it
    # makes all of part-1 late; on two executors each reads one file and nothing is late
    later, earlier = records(5000, 5000), records(5000, 0)
    (tmp_path / "in").mkdir()
    np.save(tmp_path / "in" / "part-0.npy", later)
    np.save(tmp_path / "in" / "part-1.npy", earlier)
    alone, both = sinks.Collect(), sinks.Collect()
    one = slashrt.run(windowed("w", alone), {"events": FileSource(tmp_path / "in")}, **RING)
    two = slashrt.run(windowed("w", both), {"events": FileSource(tmp_path / "in")}, executors=2, **RING)
    assert sum(one.late_records.values()) == len(earlier)
    assert sum(two.late_records.values()) == 0
    whole = one_executor(np.concatenate([earlier, later]))
    assert np.array_equal(np.sort(both.records, order=["window_start", "k"]), whole)


def test_a_killed_executor_reading_files_restarts_and_commits_every_record_once(tmp_path, monkeypatch):
    data = records()
    write_files(tmp_path / "in", data)
    slashrt.run(windowed("w", ChaosCsv(tmp_path / "ref", transactional=True)), {"events": data},
                checkpoint_dir=tmp_path / "ref-chk")
    reference = published(tmp_path / "ref")  # one executor, no failure
    assert sum(reference.values()) == len(one_executor(data)) and max(reference.values()) == 1

    (tmp_path / "marks").mkdir()
    # during the first alignment either executor goes through (the chaos test below kills at
    # every chosen point): a second one in the same process may never come on a loaded machine,
    # where one executor's files can end before the coordinator triggers again
    kills = "align:1"
    monkeypatch.setenv(chaos.KILLS_ENV, kills)
    monkeypatch.setenv(chaos.MARKS_ENV, str(tmp_path / "marks"))
    # (until it fired the job cannot end: a run at full speed aligns once per executor)
    paced = windowed("w", ChaosCsv(tmp_path / "out", transactional=True), until_fired(tmp_path / "marks", kills))
    result = slashrt.run(paced, {"events": FileSource(tmp_path / "in", batch_records=500)}, executors=2,
                         checkpoint={"interval": 0.01, "keep": 3}, checkpoint_dir=tmp_path / "chk",
                         restart="fixed-delay:attempts=5,delay=0", **RING)
    assert len(list((tmp_path / "marks").iterdir())) == 1 and len(result.recoveries) == 1
    assert all("killed by signal 9 (SIGKILL)" in r["cause"] for r in result.recoveries), result.recoveries
    assert published(tmp_path / "out") == reference

    monkeypatch.delenv(chaos.KILLS_ENV)  # its final checkpoint resumed on 3 (rescaled): every file was read
    again = slashrt.run(windowed("w", ChaosCsv(tmp_path / "out", transactional=True)),
                        {"events": FileSource(tmp_path / "in")}, executors=3, checkpoint_dir=tmp_path / "chk",
                        resume_from="latest", **RING)
    assert again.resumed_from is not None and sum(s.records for s in again.stats) == 0
    assert published(tmp_path / "out") == reference


def test_bench_chaos_with_redis_on_the_command_line(capsys):
    from slashrt.cli import main

    # checkpoints every 5 ms: the chosen points need several per attempt, also on an idle
    # machine, where the whole run lasts a tenth of a second
    assert main(["bench", "chaos", "--redis", "--kills", "1", "--events", "200000", "--executors", "2",
                 "--seed", "1", "--interval", "0.005", "--json"]) == 0
    fields = json.loads(capsys.readouterr().out)
    assert fields["redis"] is True and fields["executors"] == 2 and fields["interval_s"] == 0.005
    # every chosen point fired (alignment, async write, between pre-commit and commit, twice in a row)
    assert fields["chosen_kills"] == len(chaos.CHOSEN.split(";")) <= fields["recoveries"] <= fields["kills"], fields
    assert fields["correct"] and fields["duplicates"] == fields["missing"] == 0 and fields["rows"] > 0, fields


def test_a_bad_file_on_one_executor_fails_the_run_naming_that_executors_share(tmp_path):
    (tmp_path / "in").mkdir()
    np.save(tmp_path / "in" / "part-0.npy", records(1000))
    lines = ["t,k,v", *(f"{t},1,1" for t in range(500)), "oops,1,1"]
    (tmp_path / "in" / "part-1.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(SlashError, match=r"part-1.csv'?, line 502 \(record 500\).*; executor 1 of 2 had delivered 500 "
                                         r"records \(up to record 500 of file 1\): run it with checkpoint_dir= to "
                                         r"resume every executor where it was"):
        slashrt.run(passthrough("w", sinks.Collect()), {"events": FileSource(tmp_path / "in")}, executors=2, **RING)


def counting(name: str, pace=None) -> tuple[Dataflow, sinks.Collect]:
    """One window over the whole stream counting per key: its state is what went in. `pace`: a
    pass-through filter behind the source (`tests.snapshot._paced.Paced`), or none."""
    flow = Dataflow(name)
    out = sinks.Collect(transactional=True)
    events = flow.source("events", SCHEMA, time="t")
    events = behind(events, pace)
    events.window(Tumbling(ms=10**9)).count(key="k").sink(out, name="out")
    return flow, out


def checkpoints_in_the_middle(make, options: dict, n: int, resume_from=None) -> list[int]:
    """Run checkpointed every 2 ms (resuming `resume_from`, if given); every checkpoint it takes
    has a position per executor, each sharing among them all; returns those taken while every
    executor was in the middle of its input. Past its first 1000 records each executor's batches
    take 4 ms more until 3 more checkpoints completed, so there are some however fast the machine
    or slow the fsyncs (with 50 ms fsyncs 5 runs in a row had none)."""
    from slashrt.snapshot import SnapshotStore

    manifests = Path(options["checkpoint_dir"]) / "c" / "chk-*" / "_manifest.json"
    flow, _ = counting("c", Paced(after=1000, seconds=0.004, until=(manifests, 3), fresh=True))
    executors = options["executors"]
    store = SnapshotStore(options["checkpoint_dir"], job="c", keep=1000)
    before = set(store.checkpoints())
    slashrt.run(flow, {"events": make()}, checkpoint={"interval": 0.002, "keep": 1000}, resume_from=resume_from,
                **options)
    middle = []
    for m in [m for m in store.checkpoints() if m not in before][:-1]:
        positions = store.load(m, executor=None).meta["sources"]["c.events"]
        assert sorted(positions) == [str(i) for i in range(executors)]
        assert {p["cursor"]["executors"] for p in positions.values()} == {executors}
        if 0 < sum(p["fed"] for p in positions.values()) < n and len({str(p["cursor"]) for p in positions.values()}) == executors:
            middle.append(m)
    return middle


@pytest.mark.parametrize("kind", ["files", "redis"])
def test_a_resume_on_as_many_executors_rewinds_each_to_its_own_position(request, tmp_path, kind):
    data = records(200_000)  # long enough for checkpoints in the middle, also on a loaded machine
    if kind == "files":
        write_files(tmp_path / "in", data)
        make = lambda: FileSource(tmp_path / "in", batch_records=500)  # noqa: E731
    else:
        url = request.getfixturevalue("redis").url
        write_stream(url, "events", data, entry_bytes=24 * 40)
        make = lambda: RedisStream(url, "events", count=16)  # noqa: E731
    options = dict(executors=2, checkpoint_dir=tmp_path / "chk", **RING)
    middle = checkpoints_in_the_middle(make, options, len(data))  # taken while both executors were reading
    assert middle
    flow, out = counting("c")
    result = slashrt.run(flow, {"events": make()}, checkpoint={"keep": 1000}, resume_from=middle[len(middle) // 2],
                         **options)
    assert result.resumed_from == middle[len(middle) // 2]
    got = np.sort(out.records, order="k")  # every record counted once, under its key
    assert got["k"].tolist() == list(range(13)) and got["count"].tolist() == np.bincount(data["k"]).tolist()


def test_a_connector_without_readers_per_executor_is_refused_on_several_in_one_sentence():
    from slashrt.errors import DataflowError

    class OneReader:  # a user's connector: feed, but no for_executor
        rewinds = True

        async def feed(self, sender, spec, *, watermark_every, resume=None, barriers=None):
            raise AssertionError("never started")

        def __repr__(self):
            return "OneReader()"

    with pytest.raises(DataflowError, match=r"^source 'events': OneReader\(\) feeds one executor only; run with "
                                            r"executors=1$"):
        slashrt.run(passthrough("w", sinks.Collect()), {"events": OneReader()}, executors=2)
