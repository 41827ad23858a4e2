"""What transactional sinks published is never published again (`slashrt.snapshot.published`),
on one executor and on a cluster of 2 agent processes:

- a resume from "latest" that falls back past a corrupt or lost newest checkpoint, whose output a
  transactional CSV directory already published, is refused in one sentence naming the
  checkpoints, the sink and what to do; so is "latest" when every checkpoint is corrupt; the
  published files are left as they were;
- checkpoint numbers go on after the highest ever completed (a lost newest directory does not
  give its number away) and after what a sink published (a fresh run into a published directory
  names no part again); a commit never replaces a published part;
- a Redis sink's commit marker counts as published;
- a run without checkpoints with a transactional sink (Collect, CSV, Parquet) is refused.

Each job is deterministic, with no timing: a stop asked before the run starts gives savepoint 1,
and a resume from it runs to the end, whose final checkpoint 2 publishes the rest of the rows.
"""

import shutil

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, StopHandle, Tumbling
from slashrt.connectors.redis_sink import RedisStreamSink
from slashrt.errors import DataflowError, SnapshotError
from slashrt.ops.sinks import Collect, CsvFile, ParquetFile
from slashrt.snapshot import SnapshotStore
from slashrt.snapshot.commit import PartFiles

from tests.snapshot import _cluster_child

N = 20_000
RINGS = {"slots": 8, "slot_size": 1024}


def flow(sink, name: str = "published") -> Dataflow:
    job = Dataflow(name)
    source = job.source("r", _cluster_child.SCHEMA, time="t", max_delay=20)
    source.window(Tumbling(ms=100)).sum("v", key="k", output="total").sink(sink, name="out")
    return job


def run(tmp_path, executors: int, **options):
    more = {"executors": executors, "partitions": 16} if executors > 1 else {}
    return slashrt.run(flow(CsvFile(tmp_path / "out", transactional=True)), {"r": _cluster_child.records(N)},
                       checkpoint_dir=tmp_path / "chk", **RINGS, **more, **options)


def published_twice(tmp_path, executors: int) -> dict:
    """Savepoint 1 (nothing published), then the resumed run to its final checkpoint 2, which
    publishes every row: {part name: its bytes}."""
    stop = StopHandle()
    stop.request()
    assert run(tmp_path, executors, stop=stop).savepoint == 1
    assert run(tmp_path, executors, resume_from="latest").resumed_from == 1
    parts = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    assert {f"part-2-{i}.csv" for i in range(executors)} <= set(parts)
    return parts


def flip(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


def flip_every_part(directory) -> None:
    for part in directory.glob("*.state"):
        flip(part)


@pytest.mark.parametrize("executors", [1, 2])
@pytest.mark.parametrize("fault", ["corrupt-newest", "lose-newest", "corrupt-all"])
def test_a_resume_older_than_what_a_sink_published_is_refused(tmp_path, executors, fault):
    parts = published_twice(tmp_path, executors)
    job = tmp_path / "chk" / "published"
    if fault == "corrupt-newest":
        flip_every_part(job / "chk-2")
        why = r"checkpoint 2: snapshot .*chk-2/.* is corrupt"
    elif fault == "lose-newest":
        shutil.rmtree(job / "chk-2")
        why = r"checkpoint 2 is gone from .*/chk/published"
    else:
        flip_every_part(job / "chk-1")
        flip_every_part(job / "chk-2")
        why = r"checkpoint 2: .* is corrupt.*; checkpoint 1: .* is corrupt"
    older = "no checkpoint in .* verifies" if fault == "corrupt-all" else "the checkpoint to resume from is 1"
    with pytest.raises(SnapshotError, match=rf"^sink 'published.out' \(CsvFile\('.*/out', transactional=True\)\) already "
                                            rf"published the output of checkpoints up to 2, but {older} \({why}[^)]*\).*"
                                            r"restore checkpoint 2 .*or point the sink at a new directory"):
        run(tmp_path, executors, resume_from="latest")
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == parts  # nothing published, nothing dropped


def test_an_explicit_older_checkpoint_is_refused_too(tmp_path):
    published_twice(tmp_path, 1)
    with pytest.raises(SnapshotError, match=r"the checkpoint to resume from is 1, so the replay would publish "
                                            r"checkpoint 2's output again"):
        run(tmp_path, 1, resume_from=1)
    assert run(tmp_path, 1, resume_from=2).resumed_from == 2  # the newest one: nothing to publish again


def test_checkpoint_numbers_are_never_used_twice(tmp_path):
    parts = published_twice(tmp_path, 1)
    job = tmp_path / "chk" / "published"
    shutil.rmtree(job / "chk-2")
    assert SnapshotStore(tmp_path / "chk", job="published").next_checkpoint() == 3  # not chk-2's number again
    shutil.rmtree(tmp_path / "chk")  # the whole store lost: a fresh run is numbered after the sink's parts
    result = run(tmp_path, 1)
    assert [c["checkpoint"] for c in result.checkpoints] == [3]
    out = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    assert sorted(out) == sorted([*parts, "part-3-0.csv"]) and all(out[name] == parts[name] for name in parts)


def test_a_commit_never_replaces_a_published_part(tmp_path):
    sink = CsvFile(tmp_path, transactional=True)
    sink.open()
    sink.write(np.zeros(3, _cluster_child.SCHEMA.dtype))
    sink.pre_commit(4)
    published = b"t,k,v\n9,9,9\n"
    (tmp_path / "part-4-0.csv").write_bytes(published)  # another run's checkpoint 4
    with pytest.raises(SnapshotError, match=r"checkpoint 4: .*part-4-0.csv is already published .* stays unpublished "
                                            r"as part-4-0.csv.inprogress: point the sink at a new directory"):
        sink.commit(4)
    assert (tmp_path / "part-4-0.csv").read_bytes() == published
    assert PartFiles(tmp_path, 1, ".csv").published() == 4  # of any executor sharing the directory


def test_a_redis_sinks_commit_marker_is_what_it_published(redis):
    sinks = [RedisStreamSink(redis.url, "s", transactional=True).for_executor(i) for i in range(2)]
    assert sinks[0].published() is None
    for sink, n in zip(sinks, (3, 5)):
        sink.open()
        sink.write(np.zeros(2, _cluster_child.SCHEMA.dtype))
        sink.pre_commit(n)
        sink.commit(n)
    assert RedisStreamSink(redis.url, "s", transactional=True).published() == 5
    assert RedisStreamSink(redis.url, "s").published() is None  # not transactional: publishes at once


@pytest.mark.parametrize("executors", [1, 2])
@pytest.mark.parametrize("make", [lambda p: Collect(transactional=True), lambda p: CsvFile(p, transactional=True),
                                  lambda p: ParquetFile(p, transactional=True)], ids=["collect", "csv", "parquet"])
def test_a_transactional_sink_in_a_run_without_checkpoints_is_refused(tmp_path, executors, make):
    more = {"executors": executors} if executors > 1 else {}
    with pytest.raises(DataflowError, match=r"^run\(\): sink 'published.out' \(.*\) is transactional: it publishes only "
                                            r"what a checkpoint commits, and this run takes none; give checkpoint_dir="):
        slashrt.run(flow(make(tmp_path / "out")), {"r": _cluster_child.records(100)}, **more)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())  # refused before it started


def test_a_collect_is_judged_by_the_highest_checkpoint_the_store_completed(tmp_path):
    """A Collect cannot tell what it returned to earlier runs: "latest" falling back past the
    store's highest completed checkpoint is refused, an explicit older number takes it again."""
    def collect(**options):
        out = Collect(transactional=True)
        result = slashrt.run(flow(out), {"r": _cluster_child.records(N)}, checkpoint_dir=tmp_path, **RINGS, **options)
        return result, out.records

    stop = StopHandle()
    stop.request()
    assert collect(stop=stop)[0].savepoint == 1
    _, second = collect(resume_from="latest")
    flip_every_part(tmp_path / "published" / "chk-2")
    with pytest.raises(SnapshotError, match=r"^sink 'published.out' \(Collect\(transactional=True\)\) returned the output "
                                            r"of checkpoints up to 2 to the runs that took them, but the newest checkpoint "
                                            r"that verifies is 1 \(checkpoint 2: .* is corrupt[^)]*\), so this run would "
                                            r"return checkpoint 2's output again: .* or give resume_from=1 to take "
                                            r"it again knowingly$"):
        collect(resume_from="latest")
    again, records = collect(resume_from=1)  # knowingly
    assert again.resumed_from == 1 and np.array_equal(np.sort(records), np.sort(second))
