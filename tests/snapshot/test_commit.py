"""Two-phase commit: the file sinks' and Collect's transactions, the recovery rule, and crash
windows with real processes killed between the phases (the published output is exactly once)."""

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.csv
import pyarrow.parquet
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slashrt.errors import SnapshotError
from slashrt.sinks import Collect, CsvFile, ParquetFile
from slashrt.snapshot import TwoPhaseCommit, recover

from ._sink_child import DTYPE, batch, sink_class

CHILD = Path(__file__).with_name("_sink_child.py")
ROOT = Path(__file__).resolve().parents[2]


def published(directory: Path, kind: str) -> np.ndarray:
    """Every committed record in the directory (what a reader of the output sees), by key."""
    read = pyarrow.parquet.read_table if kind == "parquet" else pyarrow.csv.read_csv
    tables = [read(str(p)) for p in sorted(directory.glob(f"part-*.{kind}"))]
    keys = np.concatenate([t.column("key").to_numpy() for t in tables]) if tables else np.empty(0, np.int64)
    return np.sort(keys)


def keys_of(*checkpoints: int) -> np.ndarray:
    return np.sort(np.concatenate([batch(c)["key"] for c in checkpoints]))


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_output_is_visible_only_once_committed(tmp_path, kind):
    sink = sink_class(kind)(tmp_path / "out", transactional=True).for_executor(0)
    assert isinstance(sink, TwoPhaseCommit)
    sink.open()
    sink.write(batch(1))
    sink.write(batch(2))
    assert published(tmp_path / "out", kind).size == 0
    sink.pre_commit(1)
    assert sink.pending() == [1] and published(tmp_path / "out", kind).size == 0
    sink.commit(1)
    assert sink.pending() == [] and np.array_equal(published(tmp_path / "out", kind), keys_of(1, 2))
    names = sorted(os.listdir(tmp_path / "out"))
    sink.commit(1)  # repeated (as after a crash during the first): nothing changes
    assert sorted(os.listdir(tmp_path / "out")) == names == [f"part-1-0.{kind}"]
    sink.pre_commit(2)  # nothing written since barrier 1: no part file
    sink.commit(2)
    assert sorted(os.listdir(tmp_path / "out")) == names


def test_parquet_part_is_a_whole_file_with_all_columns(tmp_path):
    sink = ParquetFile(tmp_path, transactional=True)
    sink.open()
    sink.write(batch(3))
    sink.pre_commit(3)
    sink.commit(3)
    table = pyarrow.parquet.read_table(tmp_path / "part-3-0.parquet")
    assert table.column_names == ["key", "name", "value"]
    assert table.column("name").to_pylist()[:2] == ["k300", "k301"]


def test_commit_publishes_earlier_pending_checkpoints_and_abort_drops(tmp_path):
    sink = CsvFile(tmp_path, transactional=True)
    sink.open()
    for c in (1, 2, 3):
        sink.write(batch(c))
        sink.pre_commit(c)
    sink.abort(3)
    sink.commit(2)  # checkpoint 1 was declined after this sink pre-committed it: it rides with 2
    assert sink.pending() == [] and np.array_equal(published(tmp_path, "csv"), keys_of(1, 2))


def test_executors_share_the_directory_but_not_their_transactions(tmp_path):
    sinks = [CsvFile(tmp_path, transactional=True).for_executor(i) for i in range(2)]
    for i, sink in enumerate(sinks):
        sink.open()
        sink.write(batch(i + 1))
        sink.pre_commit(5)
    assert recover(sinks[0], 4) == ([], [5])  # executor 0's pending output only
    assert sinks[1].pending() == [5]
    sinks[1].commit(5)
    assert sorted(os.listdir(tmp_path)) == ["part-5-1.csv"]


def test_recover_commits_up_to_the_restored_and_aborts_newer(tmp_path):
    sink = CsvFile(tmp_path, transactional=True)
    sink.open()
    for c in (2, 3, 5, 6):
        sink.write(batch(c))
        sink.pre_commit(c)
    assert recover(sink, 3) == ([2, 3], [5, 6])
    assert np.array_equal(published(tmp_path, "csv"), keys_of(2, 3))
    assert recover(sink, 3) == ([], [])  # settled: a second recovery changes nothing
    sink.write(batch(1))
    sink.pre_commit(1)
    assert recover(sink, None) == ([], [1])  # a fresh start commits nothing


@pytest.mark.parametrize("make", [lambda p: CsvFile(p / "out.csv"), lambda p: ParquetFile(p / "o.parquet"), lambda p: Collect()])
def test_a_sink_that_is_not_transactional_says_so(tmp_path, make):
    sink = make(tmp_path)
    assert sink.pending() == [] and recover(sink, 3) == ([], [])
    with pytest.raises(SnapshotError, match=r"checkpoint 4: this \w+ sink is not transactional; make it with \w+\(\.\.\., transactional=True\)"):
        sink.pre_commit(4)


def test_a_plain_file_sink_is_unchanged(tmp_path):
    sink = CsvFile(tmp_path / "out.csv")
    sink.open()
    sink.write(batch(1))
    sink.close()
    assert pyarrow.csv.read_csv(tmp_path / "out.csv").num_rows == 50 and sink.pending() == []
    assert CsvFile(tmp_path / "out.csv").for_executor(2).path == tmp_path / "out-2.csv"


def test_collect_shows_only_committed_records():
    sink = Collect(transactional=True)
    sink.expect(DTYPE)
    sink.open()
    sink.write(batch(1))
    assert len(sink.records) == 0
    sink.pre_commit(1)
    sink.write(batch(2))
    assert len(sink.records) == 0
    sink.commit(1)
    sink.commit(1)
    assert np.array_equal(np.sort(sink.records["key"]), keys_of(1))
    sink.pre_commit(2)
    sink.abort(2)
    sink.commit(2)
    assert np.array_equal(np.sort(sink.records["key"]), keys_of(1))
    plain = Collect()
    plain.open()
    plain.write(batch(1))
    assert len(plain.records) == 50  # today's behaviour stays the default


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(st.sampled_from(["write", "barrier", "complete", "crash"]), max_size=25),
    declined=st.sets(st.integers(1, 10), max_size=3),
)
def test_exactly_once_under_random_crashes(steps, declined):
    """A model run: the source emits batch(c) before barrier c; a checkpoint completes unless
    declined; a crash abandons the sink (as a dead process does), restores the last complete
    checkpoint and replays from it. The published output is always the batches of the complete
    checkpoints, each once."""
    with tempfile.TemporaryDirectory() as directory:
        sink = CsvFile(directory, transactional=True)
        sink.open()
        completed, barrier, written = 0, 0, False
        for step in steps:
            if step == "write" and not written:
                sink.write(batch(barrier + 1))
                written = True
            elif step == "barrier":
                if not written:
                    sink.write(batch(barrier + 1))
                barrier += 1
                written = False
                sink.pre_commit(barrier)
            elif step == "complete" and barrier > completed and barrier not in declined:
                completed = barrier
                sink.commit(completed)
            elif step == "crash":
                sink = CsvFile(directory, transactional=True)  # the old one is abandoned, not closed
                sink.open()
                recover(sink, completed)
                barrier, written = completed, False  # the source rewinds
            expected = keys_of(*range(1, completed + 1)) if completed else np.empty(0, np.int64)
            assert np.array_equal(published(Path(directory), "csv"), expected)


@pytest.fixture
def child():
    """Start the sink process up to a crash window; it is killed at the end whatever happens."""
    procs = []

    def start(kind, directory, window):
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), kind, str(directory), window],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        procs.append(proc)
        assert proc.stdout.readline() == b"ready\n"
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        proc.stdin.close()
        proc.stdout.close()


@pytest.mark.parametrize("kind", ["csv", "parquet"])
@pytest.mark.parametrize(
    "window, restored, settled",
    [
        ("open", 1, ([], [])),  # killed before barrier 2: its records are in no checkpoint
        ("pre_committed", 1, ([], [2])),  # killed after pre-commit, checkpoint 2 never completed
        ("pre_committed", 2, ([2], [])),  # checkpoint 2 completed, killed before the commit
        ("committed", 2, ([], [])),  # killed after the commit
    ],
)
def test_killed_between_the_phases_the_output_is_exactly_once(tmp_path, child, kind, window, restored, settled):
    proc = child(kind, tmp_path, window)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    before = published(tmp_path, kind)
    assert np.array_equal(before, keys_of(1, 2) if window == "committed" else keys_of(1))

    # recovery in a new process' place: restore checkpoint `restored`, settle the sink, replay
    sink = sink_class(kind)(tmp_path, transactional=True).for_executor(0)
    sink.open()  # drops what the dead run wrote after its last barrier
    assert recover(sink, restored) == settled
    for c in range(restored + 1, 3):
        sink.write(batch(c))
        sink.pre_commit(c)
        sink.commit(c)
    sink.close()
    assert np.array_equal(published(tmp_path, kind), keys_of(1, 2))
    assert sorted(os.listdir(tmp_path)) == [f"part-1-0.{kind}", f"part-2-0.{kind}"]
