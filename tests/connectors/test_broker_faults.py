"""A Redis broker that fails under a running cluster job (2 executors, a real redis-server with
an append-only file): killed (SIGKILL) once checkpoints exist and brought back on the same port,
the job restarts from its last complete checkpoint and its output is exactly a failure-free
run's; one that never comes back fails the job, after the strategy's attempts, in a sentence
naming the broker; one that hangs (SIGSTOP) is named, not the executor waiting on it. The
stream is paced until the test has made its fault (`tests.snapshot._paced`), so the fault always
meets a running job."""

import contextlib
import os
import signal
import glob
import threading
import time

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Schema
from slashrt.cluster.coordinator import ClusterError
from slashrt.connectors import RedisStream, RedisStreamSink, read_stream, write_stream
from slashrt.errors import BrokerUnavailable
from slashrt.testing import redis_server

from tests.snapshot._paced import Paced, behind

SCHEMA = Schema({"t": "<i8", "k": "<i8", "v": "<i8"})
N = 12_000
RING = {"slots": 4, "slot_size": 1024}  # 42 records a buffer: hundreds of sink writes a run


def records(n: int = N) -> np.ndarray:
    out = np.zeros(n, SCHEMA.dtype)
    out["t"] = np.arange(n)
    out["k"] = out["t"] % 13
    out["v"] = out["t"] * 3
    return out


def flow(url: str, pace: Paced, timeout: float = 5.0) -> Dataflow:
    f = Dataflow("broker")
    events = behind(f.source("events", SCHEMA, time="t", max_delay=20), pace)
    events.sink(RedisStreamSink(url, "out", transactional=True, timeout=timeout), name="out")
    return f


@pytest.fixture
def broker():
    with redis_server(persistent=True) as server:
        write_stream(server.url, "in", records(), entry_bytes=2400)  # 100 records an entry
        yield server


@contextlib.contextmanager
def fault(make, marks):
    """Run `make(ended)` in a thread (the fault: kill, pause, ...) while the job runs here; it
    ends by creating `marks`/fired, which lets the paced stream go at full speed. `ended` is
    set when the job ended (a fault waiting for checkpoints then gives up: the test fails)."""
    errors, ended = [], threading.Event()

    def body():
        try:
            make(ended)
        except BaseException as exc:  # (seen by the test below)
            errors.append(exc)
        finally:
            (marks / "fired").touch()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    try:
        yield
    finally:
        ended.set()
        thread.join()
    assert not errors, errors


def checkpoints_exist(directory, n: int, ended: threading.Event) -> bool:
    """Wait until `n` checkpoints completed (True) or the job ended first (False)."""
    while len(glob.glob(f"{directory}/*/chk-*/_manifest.json")) < n:
        if ended.wait(0.01):
            return False
    return True


def exactly_once(url: str) -> tuple[int, int]:
    """(duplicates, missing) of the published output against the input."""
    return exactly_once_of(url, N)


def exactly_once_of(url: str, n: int) -> tuple[int, int]:
    got = read_stream(url, "out", SCHEMA)["t"]
    seen = np.bincount(got, minlength=n)
    return int((seen > 1).sum()), int((seen == 0).sum())


def run(broker, tmp_path, restart: str, timeout: float = 5.0, **options):
    (tmp_path / "marks").mkdir(exist_ok=True)
    pace = Paced(seconds=0.02, until=(tmp_path / "marks", 1))  # slow until the fault was made
    return slashrt.run(flow(broker.url, pace, timeout), {"events": RedisStream(broker.url, "in", count=4)},
                       executors=2, checkpoint={"interval": 0.05, "keep": 3}, checkpoint_dir=tmp_path / "chk",
                       restart=restart, **RING, **options)


def test_a_broker_killed_and_back_restarts_the_job_exactly_once(broker, tmp_path):
    def outage(ended):
        if not checkpoints_exist(tmp_path / "chk", 2, ended):
            return
        broker.kill()
        time.sleep(1.0)  # the outage: the job fails meanwhile, and its restarts find no broker
        broker.restart()

    with fault(outage, tmp_path / "marks"):
        result = run(broker, tmp_path, "fixed-delay:attempts=20,delay=0.5")
    assert result.recoveries, "the outage met no running job"
    cause = result.recoveries[0]["cause"]
    assert f"the Redis broker at 127.0.0.1:{broker.port} cannot be reached while " in cause, cause
    assert exactly_once(broker.url) == (0, 0)


def test_a_broker_that_never_returns_gives_up_after_the_attempts_naming_it(broker, tmp_path):
    def outage(ended):
        if checkpoints_exist(tmp_path / "chk", 2, ended):
            broker.kill()

    with fault(outage, tmp_path / "marks"), pytest.raises(ClusterError) as failed:
        run(broker, tmp_path, "fixed-delay:attempts=2,delay=0")
    message = str(failed.value)
    assert message.startswith("gave up recovering (FixedDelay(attempts=2, delay=0)): the job failed 3 times"), message
    assert f"the Redis broker at 127.0.0.1:{broker.port} cannot be reached while " in message, message


def test_a_hung_broker_is_named_not_the_executor_waiting_on_it(broker, tmp_path):
    def hang(ended):
        if checkpoints_exist(tmp_path / "chk", 1, ended):
            broker.pause()  # resumed by the fixture's kill whatever happens

    # the executors' heartbeats must go on while the broker hangs: a blocked loop would be
    # declared dead after 4 s, long before the sink's own 1 s timeout mattered
    with fault(hang, tmp_path / "marks"), pytest.raises(ClusterError) as failed:
        run(broker, tmp_path, "none", timeout=1.0, heartbeat_interval=0.5, heartbeat_timeout=4)
    message = str(failed.value)
    assert f"the Redis broker at 127.0.0.1:{broker.port} did not answer within 1 s while " in message, message
    assert "stopped answering" not in message, message


def test_the_broker_hang_trial_of_bench_chaos_faults_is_exact_and_names_the_broker():
    import types

    from slashrt.bench.faults import FAULTS

    got = FAULTS["broker-hang"](types.SimpleNamespace(executors=2, transport="shm", broker_records=6000))
    assert got["made"] and got["recoveries"] >= 1, got
    assert got["exact"] and not got["refused"] and got["duplicates"] == got["missing"] == 0, got
    assert "the Redis broker at 127.0.0.1:" in got["cause"] and " did not answer within 1 s while " in got["cause"], got


def test_writes_and_commits_wait_for_a_hung_broker_off_the_loop(broker):
    """With the server stopped, `awrite` and `acommit` fail after the sink's timeout naming the
    broker, and the trio loop goes on meanwhile (a ticking task keeps ticking)."""
    import trio

    from slashrt.errors import BrokerUnavailable

    sink = RedisStreamSink(broker.url, "out", transactional=True, timeout=1.0)
    sink.open()
    sink.write(records(100))
    sink.pre_commit(1)
    broker.pause()
    ticks, failures = [], []

    async def main():
        async def tick():
            while True:
                ticks.append(trio.current_time())
                await trio.sleep(0.05)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(tick)
            for call in (sink.acommit(1), sink.awrite(records(100))):
                before = len(ticks)
                with pytest.raises(BrokerUnavailable) as failed:
                    await call
                failures.append((str(failed.value), len(ticks) - before))
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        broker.resume()
    at = f"the Redis broker at 127.0.0.1:{broker.port} did not answer within 1 s while "
    assert failures[0][0] == at + "committing checkpoint 1 of stream 'out'", failures
    assert failures[1][0] == at + "writing to stream 'out:slashrt:open:0'", failures
    assert all(n >= 5 for _, n in failures), failures  # ~20 ticks a second while each call waited 1 s
    sink.commit(1)  # the broker is back: the checkpoint is published once
    assert exactly_once_of(broker.url, 100) == (0, 0)


class HangsAtBarrier(RedisStreamSink):
    """A transactional sink whose broker (`pid`) hangs (SIGSTOP) as executor 0's first
    pre-commit begins, wherever that call runs, and makes `hung` in `marks` (a directory) then.
    With `hang` (seconds) the broker goes on that long after (SIGCONT, from a timer thread: the
    fault's length), and `fired` is made in `marks` once the pre-commit returned (the stream,
    `Paced` until then, goes at full speed); without, the test resumes the broker."""

    def __init__(self, *args, pid: int = 0, marks=None, hang: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.pid, self.marks, self.hang = pid, marks, hang

    def for_executor(self, index: int):
        return type(self)(self.url, self.stream_key, transactional=self.transactional, executor=index,
                          entry_bytes=self.entry_bytes, timeout=self.timeout, pid=self.pid, marks=self.marks,
                          hang=self.hang)

    def pre_commit(self, checkpoint: int) -> None:
        if self.executor != 0 or (self.marks / "hung").exists():
            return super().pre_commit(checkpoint)
        os.kill(self.pid, signal.SIGSTOP)
        (self.marks / "hung").touch()
        if self.hang is not None:
            threading.Timer(self.hang, os.kill, (self.pid, signal.SIGCONT)).start()
        try:
            super().pre_commit(checkpoint)
        finally:
            (self.marks / "fired").touch()


def test_a_broker_hung_at_a_barrier_leaves_the_executors_loop_running(broker, tmp_path):
    """The broker hangs as the sink's pre-commit begins, and only a task on the executor's loop
    (run's `on_records`, called every 0.1 s) brings it back: with the pre-commit in the sink's
    worker thread the loop goes on, resumes the broker, and the checkpoint completes, exactly
    once. (A pre-commit on the loop blocked it until the sink's timeout: the job failed.)"""
    sink = HangsAtBarrier(broker.url, "out", transactional=True, timeout=10.0, pid=broker.process.pid, marks=tmp_path)
    resumed = []

    def tick(records: int) -> None:
        if (tmp_path / "hung").exists() and not resumed:
            resumed.append(records)
            broker.resume()

    f = Dataflow("barrier")
    f.source("events", SCHEMA, time="t", max_delay=20).sink(sink, name="out")
    try:
        result = slashrt.run(f, {"events": records()}, checkpoint={"interval": 0.05}, checkpoint_dir=tmp_path / "chk",
                             on_records=tick, **RING)
    finally:
        broker.resume()
    assert resumed, "the broker never hung"
    assert [c["status"] for c in result.checkpoints] == ["completed"] * len(result.checkpoints), result.checkpoints
    assert exactly_once(broker.url) == (0, 0)


def test_a_broker_hung_at_a_barrier_longer_than_the_heartbeat_timeout_is_no_frozen_executor(broker, tmp_path):
    """On a cluster: the broker hangs for 4.5 s from executor 0's first pre-commit, longer than
    the 3 s heartbeat timeout and shorter than the sink's own: the pre-commit waits in the sink's
    worker thread, heartbeats go on, and once the broker answers the checkpoint completes and the
    output is exact. (On the loop, the executor was declared frozen: "stopped answering".)"""
    (tmp_path / "marks").mkdir()
    pace = Paced(seconds=0.02, until=(tmp_path / "marks", 2))  # slow until the pre-commit returned (`fired`)
    f = Dataflow("broker")
    events = behind(f.source("events", SCHEMA, time="t", max_delay=20), pace)
    events.sink(HangsAtBarrier(broker.url, "out", transactional=True, timeout=10.0, pid=broker.process.pid,
                               marks=tmp_path / "marks", hang=4.5), name="out")
    result = slashrt.run(f, {"events": RedisStream(broker.url, "in", count=4)}, executors=2,
                         checkpoint={"interval": 0.05, "keep": 3}, checkpoint_dir=tmp_path / "chk",
                         heartbeat_interval=0.25, heartbeat_timeout=3, **RING)
    assert (tmp_path / "marks" / "hung").exists(), "the broker never hung"
    assert not [c for c in result.checkpoints if "Redis" in (c.get("reason") or "")], result.checkpoints
    assert result.checkpoints[-1]["status"] == "completed", result.checkpoints
    assert exactly_once(broker.url) == (0, 0)


@pytest.mark.parametrize("tolerated", [1, 0])
def test_a_pre_commit_the_broker_does_not_answer_in_time_declines_its_checkpoint(broker, tmp_path, tolerated):
    """The broker hangs past the sink's 1 s timeout from the first pre-commit, and comes back
    (from the executor's loop) once that pre-commit failed: its checkpoint is declined as one
    whose state could not be written; with a failure tolerated the run goes on to exact output,
    with none the job fails with a BrokerUnavailable naming the broker and the checkpoint."""
    marks = tmp_path / "marks"
    marks.mkdir()
    sink = HangsAtBarrier(broker.url, "out", transactional=True, timeout=1.0, pid=broker.process.pid, marks=marks)

    def tick(records: int) -> None:
        if (marks / "fired").exists():
            broker.resume()

    f = Dataflow("barrier")
    # slow until the pre-commit failed (`hung`, `fired`): the hang meets a periodic checkpoint, not the final one
    behind(f.source("events", SCHEMA, time="t", max_delay=20), Paced(seconds=0.01, until=(marks, 2))).sink(sink, name="out")
    with contextlib.ExitStack() as stack:
        stack.callback(broker.resume)
        if not tolerated:
            failed = stack.enter_context(pytest.raises(BrokerUnavailable))
        result = slashrt.run(f, {"events": records()}, checkpoint={"interval": 0.05, "tolerable_failures": tolerated},
                             checkpoint_dir=tmp_path / "chk", on_records=tick, **RING)
    hung = f"the Redis broker at 127.0.0.1:{broker.port} did not answer within 1 s while pre-committing checkpoint 1 of stream 'out'"
    if not tolerated:
        assert str(failed.value) == (
            f"{hung} (1 checkpoint in a row failed, more than the 0 tolerated), so the job fails: once the broker "
            "answers again, resume from the latest checkpoint (a restart strategy does so itself)"
        )
        return
    first = result.checkpoints[0]
    assert first["status"] == "aborted" and first["reason"].endswith(f": {hung}"), result.checkpoints
    assert result.checkpoints[-1]["status"] == "completed", result.checkpoints
    assert exactly_once(broker.url) == (0, 0)
