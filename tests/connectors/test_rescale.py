"""A RedisStream checkpoint resumed on another number of executors (real agent processes, a
real redis-server, rings far smaller than the data): taken on 2 in the middle of the stream and
resumed on 1 and on 3 (a bounded read, and one following the stream to its end entry), taken
on 3 and resumed on 2, and a savepoint of such a rescaled run (its readers still keeping the old
positions) resumed on 1 and on 2: each counts every record exactly once, as one uninterrupted
run does; a savepoint (StopHandle) of 3 resumed on 2 into a transactional RedisStreamSink
writes what one uninterrupted run writes; an entry deleted that the resume would read is
refused in one sentence."""

import shutil

import numpy as np
import pytest

import slashrt
from slashrt.connectors import RedisStream, write_stream
from slashrt.errors import SlashError
from slashrt.snapshot import SnapshotStore
from tests.connectors.test_executors import RING, checkpoints_in_the_middle, counting, records
from tests.snapshot._paced import Paced

N = 200_000


def exact(out, data) -> bool:
    got = np.sort(out.records, order="k")
    return got["k"].tolist() == list(range(13)) and got["count"].tolist() == np.bincount(data["k"]).tolist()


def middle_of(make, tmp_path, executors: int) -> tuple:
    """(checkpoint directory, a checkpoint taken with every executor in the middle of its input)
    of a run on `executors`."""
    directory = tmp_path / f"chk{executors}"
    middle = checkpoints_in_the_middle(make, dict(executors=executors, checkpoint_dir=directory, **RING), N)
    assert middle, executors
    return directory, middle[len(middle) // 2]


def stopped_at_once(make, taken: tuple, tmp_path, executors: int) -> tuple:
    """(directory, savepoint) of a run resuming `taken` on `executors` stopped at its first
    barrier: its readers are at the least old position, still keeping the old ones."""
    from slashrt import StopHandle

    directory = tmp_path / f"stopped{executors}"
    shutil.copytree(taken[0], directory)
    stop = StopHandle()
    stop.request()
    flow, _ = counting("c")
    result = slashrt.run(flow, {"events": make()}, executors=executors, checkpoint={"keep": 1000},
                         checkpoint_dir=directory, resume_from=taken[1], stop=stop, **RING)
    assert result.savepoint is not None
    return directory, result.savepoint


def resume(make, taken: tuple, tmp_path, executors: int, attempt: int = 0):
    directory = tmp_path / f"resume{executors}-{taken[0].name}-{taken[1]}-{attempt}"
    shutil.copytree(taken[0], directory)
    flow, out = counting("c")
    result = slashrt.run(flow, {"events": make()}, executors=executors, checkpoint={"keep": 1000}, checkpoint_dir=directory,
                         resume_from=taken[1], **RING)
    assert result.resumed_from == taken[1]
    return out


@pytest.fixture(params=["bounded", "followed"])
def stream(request, redis):
    """(The records, a maker of RedisStreams reading them): bounded, or followed to an end entry."""
    data = records(N)
    follow = request.param == "followed"
    write_stream(redis.url, "events", data, entry_bytes=24 * 40, end=follow)  # 40 records an entry: 5000 entries
    return data, lambda: RedisStream(redis.url, "events", count=16, stop_at_end=not follow)


def redis_client(stream):
    from slashrt.connectors._redis import connect

    return connect(stream[1]().url)


def test_a_checkpoint_of_two_executors_resumes_on_one_and_on_three(stream, tmp_path):
    data, make = stream
    taken = middle_of(make, tmp_path, 2)
    for executors in (1, 3):
        assert exact(resume(make, taken, tmp_path, executors), data), executors
    # an entry the resume would read, deleted (the last but one): refused in one sentence
    client = redis_client(stream)
    gone = client.xrevrange("events", count=2)[-1][0].decode()  # (before a followed stream's end entry)
    client.xdel("events", gone)
    # (an old executor that had fed part of it finds fewer records after its own position)
    with pytest.raises(SlashError, match=rf"stream 'events' at \S+ (had entries deleted after id \d+-\d+, where the "
                                         rf"checkpoint resumes \(XDEL, up to id {gone}\)|holds fewer records after id "
                                         rf"\d+-\d+ than executor \d of 2 had fed from there: entries were deleted)"):
        resume(make, taken, tmp_path, 3, attempt=1)


@pytest.mark.parametrize("stream", ["bounded"], indirect=True)
def test_a_checkpoint_of_three_resumes_on_two_and_its_checkpoints_on_one(stream, tmp_path):
    data, make = stream
    taken = middle_of(make, tmp_path, 3)
    assert exact(resume(make, taken, tmp_path, 2), data)
    # a savepoint of a run rescaled to 2, its readers still keeping the positions on 3
    again = stopped_at_once(make, taken, tmp_path, 2)
    cursors = [p["cursor"] for p in SnapshotStore(again[0], job="c", keep=1000).load(again[1], executor=None)
               .meta["sources"]["c.events"].values()]
    assert any(c.get("stages") for c in cursors), cursors
    assert exact(resume(make, again, tmp_path, 1), data)
    assert exact(resume(make, again, tmp_path, 2), data)  # on its own count: each reader rewound with its stages


def test_a_savepoint_of_three_resumes_on_two_into_a_transactional_stream(redis, monkeypatch, tmp_path):
    from slashrt import StopHandle
    from slashrt.connectors import RedisStreamSink, read_stream
    from tests.connectors.test_executors import one_executor, windowed
    from tests.snapshot.test_cluster_stop import stop_after_manifest

    data = records(N)
    write_stream(redis.url, "events", data, entry_bytes=24 * 40)
    out, directory, stop = "out", tmp_path / "chk", StopHandle()
    stop_after_manifest(monkeypatch, stop, 2)
    # each batch 4 ms slower until the savepoint (the third checkpoint) completed: stopped in the
    # middle of the stream however fast the machine
    pace = Paced(seconds=0.004, until=(directory / "w" / "chk-*" / "_manifest.json", 3))
    stopped = slashrt.run(windowed("w", RedisStreamSink(redis.url, out, transactional=True), pace),
                          {"events": RedisStream(redis.url, "events", count=16)}, executors=3,
                          checkpoint=0.002, checkpoint_dir=directory, stop=stop, **RING)
    monkeypatch.undo()
    saved = SnapshotStore(directory, job="w").load(stopped.savepoint)
    fed = sum(p["fed"] for p in saved.meta["sources"]["w.events"].values())
    assert stopped.savepoint is not None and 0 < fed < N
    resumed = slashrt.run(windowed("w", RedisStreamSink(redis.url, out, transactional=True)),
                          {"events": RedisStream(redis.url, "events", count=16)}, executors=2,
                          checkpoint_dir=directory, resume_from="latest", **RING)
    assert resumed.resumed_from == stopped.savepoint and sum(resumed.late_records.values()) == 0
    reference = one_executor(data)
    got = read_stream(redis.url, out, reference.dtype)
    assert np.array_equal(np.sort(got, order=["window_start", "k"]), reference)
