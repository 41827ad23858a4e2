"""SnapshotStore: the manifest rule, verification and fallback, retention, fsspec URLs, async writes."""

import json
import os
import re
import threading
import uuid
import zlib

import fsspec
import numpy as np
import pytest
import structlog
import structlog.testing
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from slashrt.errors import OptionError, SnapshotCorrupt, SnapshotError, SnapshotVersionError
from slashrt.snapshot import SnapshotStore


def _state(n: int, executor: int = 0):
    keys = np.arange(100 * n, dtype=np.uint64)
    slices = np.zeros(n, [("window", "<i8"), ("sum", "<f8")])
    slices["window"] = np.arange(n)
    return {"keys": keys, "slices": slices}


def _write_checkpoint(store: SnapshotStore, n: int, executors: int = 2) -> None:
    for executor in range(executors):
        store.write_part(n, "ysb.window", executor, _state(n, executor), {"watermark": 10 * n})
        store.write_part(n, "ysb/source", executor, {"offset": np.array([n * 1000 + executor])})
    store.complete(n, {"sources": {"ysb/source": [n * 1000, n * 1000 + 1]}, "executors": executors})


def _assert_is(checkpoint, n: int, executors: int = 2) -> None:
    assert checkpoint.number == n
    assert checkpoint.meta == {"sources": {"ysb/source": [n * 1000, n * 1000 + 1]}, "executors": executors}
    for executor in range(executors):
        state = checkpoint.state("ysb.window", executor)
        expected = _state(n, executor)
        assert state.meta == {"watermark": 10 * n}
        for name in expected:
            np.testing.assert_array_equal(state.arrays[name], expected[name])
        assert checkpoint.state("ysb/source", executor).arrays["offset"][0] == n * 1000 + executor


@pytest.fixture
def store(tmp_path):
    return SnapshotStore(tmp_path, job="ysb", keep=3)


def _part_path(store, n, step="ysb.window", executor=0) -> str:
    return f"{store.checkpoint_dir(n)}/{store.part_name(step, executor)}"


def test_layout_and_round_trip(store, tmp_path):
    _write_checkpoint(store, 1)
    assert sorted(os.listdir(tmp_path / "ysb" / "chk-1")) == [
        "_manifest.json", "ysb%2Fsource.0.state", "ysb%2Fsource.1.state", "ysb.window.0.state", "ysb.window.1.state",
    ]
    manifest = json.loads((tmp_path / "ysb" / "chk-1" / "_manifest.json").read_text())
    assert manifest["job"] == "ysb" and manifest["checkpoint"] == 1 and manifest["slashrt"] == "0.1.0"
    assert {(p["step"], p["executor"]) for p in manifest["parts"]} == {
        (s, e) for s in ("ysb.window", "ysb/source") for e in (0, 1)
    }
    assert store.checkpoints() == [1]
    _assert_is(store.load(1), 1)
    _assert_is(SnapshotStore(tmp_path, job="ysb").latest(), 1)  # a new process finds it


def test_a_checkpoint_without_manifest_is_not_complete(store):
    _write_checkpoint(store, 1)
    store.write_part(2, "ysb.window", 0, _state(2))
    assert store.checkpoints() == [1]
    assert store.latest().number == 1 and store.skipped == []
    with pytest.raises(SnapshotCorrupt, match="checkpoint 2 has no manifest .*incomplete"):
        store.load(2)
    assert store.next_checkpoint() == 3


def test_parts_written_by_other_processes_are_listed_when_given(tmp_path):
    coordinator = SnapshotStore(tmp_path, job="j")
    executors = [SnapshotStore(tmp_path, job="j") for _ in range(2)]
    parts = [s.write_part(1, "op", i, {"x": np.full(3, i)}) for i, s in enumerate(executors)]
    coordinator.complete(1, {"executors": 2}, parts=parts)
    checkpoint = SnapshotStore(tmp_path, job="j").load(1)
    assert [checkpoint.state("op", i).arrays["x"].tolist() for i in range(2)] == [[0] * 3, [1] * 3]
    mine = SnapshotStore(tmp_path, job="j").load(1, executor=1)
    assert list(mine.states) == [("op", 1)]


def test_complete_refuses_a_part_that_is_not_there(store):
    part = store.write_part(1, "op", 0, {"x": np.arange(3)})
    os.remove(_part_path(store, 1, "op"))
    with pytest.raises(SnapshotError, match="checkpoint 1 cannot complete: part .*op.0.state is missing"):
        store.complete(1, parts=[part])
    assert store.checkpoints() == []
    store.write_part(1, "op", 0, {"x": np.arange(3)})  # written again: the checkpoint completes
    store.complete(1)
    assert store.load(1).state("op", 0).arrays["x"].tolist() == [0, 1, 2]


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize(
    "damage, error",
    [
        ("flip_part_lengths", "snapshot .*ysb.window.0.state is truncated or corrupt: .* its header says"),
        ("flip_part_index", "snapshot .*ysb.window.0.state is corrupt: its checksum does not match"),
        ("flip_part_payload", "snapshot .*ysb.window.0.state is corrupt: its checksum does not match"),
        ("flip_part_trailer", "ysb.window.0.state is corrupt: its checksum does not match"),
        ("truncate_part", "part .*ysb.window.0.state is truncated"),
        ("extend_part", "part .*ysb.window.0.state is longer than listed"),
        ("remove_part", "part .*ysb.window.0.state is missing"),
        ("swap_part", "not the file its manifest lists"),
        ("later_part", "snapshot .*ysb.window.0.state has format version 2, this slashrt reads version 1"),
        ("flip_manifest", "manifest .*chk-2/_manifest.json is corrupt"),
        ("truncate_manifest", "manifest .*chk-2/_manifest.json is corrupt"),
        ("later_manifest", "written by slashrt 9.0 .*manifest version 2"),
    ],
)
def test_latest_falls_back_past_a_damaged_checkpoint(store, damage, error, caplog):
    _write_checkpoint(store, 1)
    _write_checkpoint(store, 2)
    part = _part_path(store, 2)
    manifest = f"{store.checkpoint_dir(2)}/_manifest.json"
    size = os.path.getsize(part)
    if damage == "flip_part_lengths":
        _flip(part, 20)
    elif damage == "flip_part_index":
        _flip(part, 40)
    elif damage == "flip_part_payload":
        _flip(part, size - 100)
    elif damage == "flip_part_trailer":
        _flip(part, size - 1)
    elif damage == "truncate_part":
        os.truncate(part, size // 2)
    elif damage == "extend_part":
        with open(part, "ab") as f:
            f.write(b"\0")
    elif damage == "remove_part":
        os.remove(part)
    elif damage == "swap_part":  # a valid snapshot, but not the one the manifest lists
        store.write_part(3, "ysb.window", 0, _state(2) | {"keys": np.arange(200, dtype=np.uint64)[::-1].copy()})
        os.replace(_part_path(store, 3), part)
    elif damage == "later_part":  # a part in a format a later slashrt writes
        with open(part, "r+b") as f:
            body = b"SLASHSNP" + (2).to_bytes(4, "little")
            f.write(body + zlib.crc32(body).to_bytes(4, "little"))
    elif damage == "flip_manifest":
        _flip(manifest, os.path.getsize(manifest) // 2)
    elif damage == "truncate_manifest":
        os.truncate(manifest, os.path.getsize(manifest) - 5)
    elif damage == "later_manifest":
        body = json.loads(open(manifest).read())
        del body["checksum"]
        body["manifest"], body["slashrt"] = 2, "9.0"
        body["checksum"] = zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
        with open(manifest, "w") as f:
            json.dump(body, f)
    expected_error = SnapshotVersionError if damage.startswith("later") else SnapshotCorrupt
    with pytest.raises(expected_error, match=error):
        store.load(2)
    _assert_is(store.latest(), 1)
    assert [s.checkpoint for s in store.skipped] == [2]
    assert re.search(error, store.skipped[0].reason)


def test_a_manifest_naming_a_file_outside_its_checkpoint_is_corrupt(store):
    _write_checkpoint(store, 1)
    manifest = f"{store.checkpoint_dir(1)}/_manifest.json"
    body = json.loads(open(manifest).read())
    del body["checksum"]
    body["parts"][0]["file"] = "../../elsewhere.state"
    body["checksum"] = zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    with open(manifest, "w") as f:
        json.dump(body, f)
    with pytest.raises(SnapshotCorrupt, match="_manifest.json is corrupt: its list of parts is malformed"):
        store.load(1)


async def test_async_complete_and_latest(store):
    part = await store.awrite_part(1, "op", 0, {"x": np.arange(5)}, {"w": 3})
    await store.acomplete(1, {"executors": 1}, parts=[part])
    checkpoint = await store.alatest()
    assert checkpoint.meta == {"executors": 1} and checkpoint.state("op", 0).meta == {"w": 3}
    assert (await store.aload(1, executor=0)).state("op", 0).arrays["x"].tolist() == [0, 1, 2, 3, 4]


async def test_a_checkpoint_whose_completion_began_survives_a_newer_ones_retention(tmp_path, monkeypatch):
    """Forced interleaving (a cluster's coordinator completing acks of two executors): 11 is
    complete in the coordinator's eyes and its manifest is due in a worker thread, but 12's
    completion, with keep=1, runs its retention first. That pass must leave 11 (its parts were
    written by other processes, so this store's writes do not mark it): 11 completes, then 12
    and 11 are both in the store (the next pass keeps the newest only)."""
    coordinator = SnapshotStore(tmp_path, job="j", keep=1)
    agent = SnapshotStore(tmp_path, job="j", keep=1)
    parts = {n: [agent.write_part(n, "op", 0, {"x": np.full(3, n)})] for n in (11, 12)}
    real, go = coordinator.complete, threading.Event()

    def complete(n, meta=None, parts=()):
        if n == 11:
            assert go.wait(30)  # (12 completes meanwhile)
        return real(n, meta, parts)

    monkeypatch.setattr(coordinator, "complete", complete)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(coordinator.acomplete, 11, {}, parts[11])
        await trio.testing.wait_all_tasks_blocked()
        await trio.to_thread.run_sync(real, 12, {}, parts[12])
        go.set()
    assert coordinator.checkpoints() == [11, 12]
    assert SnapshotStore(tmp_path, job="j").load(11).state("op", 0).arrays["x"].tolist() == [11] * 3


def test_latest_is_none_when_nothing_verifies_and_logs_each_skip(store):
    assert store.latest() is None
    _write_checkpoint(store, 1)
    os.remove(_part_path(store, 1))
    with structlog.testing.capture_logs() as logs:
        assert store.latest() is None
    assert [s.checkpoint for s in store.skipped] == [1]
    assert [(e["event"], e["log_level"], e["checkpoint"]) for e in logs] == [("snapshot.skipped", "warning", 1)]
    assert "ysb.window.0.state is missing" in logs[0]["reason"]


@settings(max_examples=25, deadline=None)
@given(states=st.lists(st.dictionaries(st.text(max_size=6), hnp.arrays(
    st.sampled_from(["<i8", ">u2", "<f4", "S3", "?", "<M8[ms]", "<i4,<f8,S2"]),
    hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=6)), max_size=3), min_size=1, max_size=4))
def test_random_states_round_trip_through_the_store(states):
    url = f"memory://roundtrip-{uuid.uuid4().hex}"
    try:
        store = SnapshotStore(url, job="j", keep=1)
        for executor, state in enumerate(states):
            store.write_part(7, "op.step", executor, state, {"executor": executor})
        store.complete(7, {"executors": len(states)})
        checkpoint = SnapshotStore(url, job="j").latest()
        for executor, state in enumerate(states):
            restored = checkpoint.state("op.step", executor)
            assert restored.meta == {"executor": executor} and list(restored.arrays) == list(state)
            for name, array in state.items():
                got = restored.arrays[name]
                assert got.dtype == array.dtype and got.shape == array.shape and got.tobytes() == array.tobytes()
    finally:
        fsspec.filesystem("memory").rm(url.removeprefix("memory://"), recursive=True)


def test_retention_keeps_the_last_k_complete(tmp_path):
    store = SnapshotStore(tmp_path, job="j", keep=2)
    for n in range(1, 6):
        _write_checkpoint(store, n)
        assert store.checkpoints() == list(range(max(1, n - 1), n + 1))
    assert sorted(n for n in os.listdir(tmp_path / "j") if n != "_highest") == ["chk-4", "chk-5"]


def test_incomplete_checkpoints_older_than_the_newest_complete_are_removed(tmp_path):
    store = SnapshotStore(tmp_path, job="j", keep=3)
    _write_checkpoint(store, 1)
    store.write_part(2, "op", 0, {"x": np.arange(3)})  # abandoned: never completed
    store.write_part(4, "op", 0, {"x": np.arange(3)})  # newer than any complete one: in progress
    _write_checkpoint(store, 3)
    assert sorted(n for n in os.listdir(tmp_path / "j") if n != "_highest") == ["chk-1", "chk-3", "chk-4"]


def test_opening_a_store_removes_stale_incomplete_checkpoints(tmp_path):
    store = SnapshotStore(tmp_path, job="j")
    store.write_part(1, "op", 0, {"x": np.arange(3)})
    _write_checkpoint(store, 2)
    os.makedirs(tmp_path / "j" / "chk-1")  # left by a crashed coordinator
    (tmp_path / "j" / "chk-1" / "op.0.state").write_bytes(b"half")
    SnapshotStore(tmp_path, job="j")
    assert sorted(n for n in os.listdir(tmp_path / "j") if n != "_highest") == ["chk-2"]


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_fsspec_urls(tmp_path, scheme):
    url = f"memory://snapshots-{uuid.uuid4().hex}" if scheme == "memory" else f"file://{tmp_path}/shared"
    try:
        store = SnapshotStore(url, job="ysb", keep=2)
        for n in (1, 2, 3):
            _write_checkpoint(store, n)
        reopened = SnapshotStore(url, job="ysb", keep=2)
        assert reopened.checkpoints() == [2, 3]
        _assert_is(reopened.latest(), 3)
        fs, root = fsspec.core.url_to_fs(url)
        part = f"{root}/ysb/chk-3/{store.part_name('ysb.window', 1)}"
        data = bytearray(fs.cat_file(part))
        data[len(data) // 2] ^= 1
        fs.pipe_file(part, bytes(data))
        _assert_is(reopened.latest(), 2)
        assert "checksum does not match" in reopened.skipped[0].reason
    finally:
        if scheme == "memory":
            fsspec.filesystem("memory").rm(url.removeprefix("memory://"), recursive=True)


def test_bad_options_are_named(tmp_path):
    with pytest.raises(OptionError, match="keep=0: keep at least 1"):
        SnapshotStore(tmp_path, keep=0)
    with pytest.raises(OptionError, match="job='a/b': a job name is one non-empty path component"):
        SnapshotStore(tmp_path, job="a/b")


class _Fifo:
    """A part file that is a named pipe: writing it blocks until someone reads it, so a test
    controls exactly when a write can progress (and a safety thread drains it if nobody does)."""

    def __init__(self, path):
        self.path = path
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkfifo(path)
        self.reader = None  # who drained it: "trio task" or "safety thread"
        self.data = b""
        self._lock = threading.Lock()
        self._safety = threading.Timer(20, self.drain, args=("safety thread",))
        self._safety.start()

    def drain(self, who: str) -> None:
        with self._lock:
            if self.reader is not None:
                return
            self.reader = who
        with open(self.path, "rb") as f:
            self.data = f.read()

    def close(self) -> None:
        self._safety.cancel()
        if self.reader is None:
            self.drain("cleanup")


async def test_awrite_part_leaves_the_event_loop_running(store):
    big = {"keys": np.arange(1 << 20, dtype=np.uint64)}  # 8 MiB: far more than a pipe holds
    fifo = _Fifo(_part_path(store, 1, "big"))
    steps = []
    try:
        async def other_task():
            steps.append("other task ran")
            # the write cannot finish before this task drains the pipe: if awrite_part
            # blocked the event loop, this line would never run and the safety thread drains
            await trio.to_thread.run_sync(fifo.drain, "trio task")
            steps.append("drained")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other_task)
            part = await store.awrite_part(1, "big", 0, big)
            steps.append("written")
    finally:
        fifo.close()
    assert fifo.reader == "trio task"
    assert steps[0] == "other task ran" and part.size == len(fifo.data) > 8 << 20


def test_retention_never_removes_a_checkpoint_being_written(store):
    _write_checkpoint(store, 1)
    path = _part_path(store, 2, "op")
    os.makedirs(os.path.dirname(path))
    os.mkfifo(path)  # the part's write blocks once the pipe is full, until this test reads on
    writer = threading.Thread(target=store.write_part, args=(2, "op", 0, {"x": np.arange(1 << 17)}))
    writer.start()
    try:
        with open(path, "rb") as pipe:  # returns once the writer opened the part
            first = pipe.read(1)  # the writer is inside write_part: checkpoint 2 is being written
            _write_checkpoint(store, 3)  # a newer complete checkpoint: 2 looks stale, but is in progress
            assert os.path.exists(store.checkpoint_dir(2))
            rest = pipe.read()
    finally:
        writer.join()
    assert len(first + rest) > 1 << 20
    _write_checkpoint(store, 4)  # now written and never completed: removed
    assert not os.path.exists(store.checkpoint_dir(2))


def test_a_checkpoint_being_completed_is_not_removed_by_a_newer_ones_retention(tmp_path, monkeypatch):
    """Forced interleaving: checkpoint 2's manifest is being written (in a worker thread, as the
    cluster coordinator completes checkpoints) when checkpoint 3 completes: 3's retention leaves 2,
    which then completes too."""
    store = SnapshotStore(tmp_path, job="j", keep=3)
    other = SnapshotStore(tmp_path, job="j", keep=3)  # the executors' parts, written elsewhere
    parts = {n: [other.write_part(n, "op", e, _state(n, e)) for e in range(2)] for n in (2, 3)}
    entered, release = threading.Event(), threading.Event()
    write_manifest = store._write_manifest

    def held(n, meta, given):
        if n == 2:
            entered.set()
            release.wait(10)
        return write_manifest(n, meta, given)

    monkeypatch.setattr(store, "_write_manifest", held)
    failed = []
    completing = threading.Thread(target=lambda: failed.extend(_raises(store.complete, 2, {}, parts[2])))
    completing.start()
    try:
        assert entered.wait(10)
        store.complete(3, {}, parts[3])
        assert os.path.exists(store.checkpoint_dir(2))
    finally:
        release.set()
        completing.join()
    assert failed == [] and store.checkpoints() == [2, 3]


def _raises(fn, *args) -> list:
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - reported by the test's assertion
        return [exc]
    return []


def test_retention_leaves_for_later_a_checkpoint_another_process_still_writes_into(tmp_path, monkeypatch, caplog):
    """Removing a stale checkpoint fails when another process writes a late part into it (an
    executor's part of a subsumed checkpoint): the completion that triggered the retention still
    succeeds, and a later retention removes it."""
    store = SnapshotStore(tmp_path, job="j", keep=3)
    _write_checkpoint(store, 1)
    SnapshotStore(tmp_path, job="j").write_part(2, "op", 0, {"x": np.arange(3)})  # subsumed, written elsewhere
    import shutil

    rmtree = shutil.rmtree

    def busy_directory(path, *args, **kwargs):
        raise OSError(39, "Directory not empty", path)

    monkeypatch.setattr(shutil, "rmtree", busy_directory)  # (a local store removes a directory with it)
    _write_checkpoint(store, 3)
    assert store.checkpoints() == [1, 3] and os.path.exists(store.checkpoint_dir(2))
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    _write_checkpoint(store, 4)
    assert sorted(n for n in os.listdir(tmp_path / "j") if n != "_highest") == ["chk-1", "chk-3", "chk-4"]


def test_a_local_checkpoint_is_written_in_few_system_calls_outside_fsspec(store, monkeypatch):
    """The writer thread takes the GIL back after each blocking call while the executor holds it:
    on a local disk a part is one writev of the state's buffers (then fsync), and neither a part,
    a manifest nor retention goes through fsspec's Python layers."""
    import sys

    writes = []
    writev = os.writev
    monkeypatch.setattr(os, "writev", lambda fd, buffers: writes.append(len(buffers)) or writev(fd, buffers))
    _write_checkpoint(store, 1)
    fsspec_calls = []

    def profile(frame, event, arg):
        if event == "call" and "fsspec" in frame.f_code.co_filename:
            fsspec_calls.append(frame.f_code.co_name)

    writes.clear()
    sys.setprofile(profile)
    try:
        for n in (2, 3, 4, 5):  # retention removes 1 and 2
            _write_checkpoint(store, n)
    finally:
        sys.setprofile(None)
    assert fsspec_calls == []
    assert len(writes) == 4 * (4 + 1 + 1)  # one writev a part (2 steps x 2 executors), a manifest, `_highest`
    assert store.checkpoints() == [3, 4, 5]
    assert np.array_equal(store.load(5).state("ysb.window", 1).arrays["keys"], _state(5, 1)["keys"])
