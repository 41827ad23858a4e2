"""A full checkpoint disk (a real one: a small tmpfs filled until writes fail with ENOSPC), on one
executor and on two:

- while it is full, each checkpoint is declined (its partial directory removed), the stream goes
  on and the transactional sink publishes nothing for a declined checkpoint; once freed, the
  next checkpoint completes, and the output is exact;
- more failed checkpoints in a row than `tolerable_failures` fail the job in one sentence naming
  the checkpoint, its path and the count; so does a full disk at the final checkpoint or at a
  stop's savepoint (no later checkpoint can take its place), and `slashrt run` says it in one line;
- the option is checked (`CheckpointConfig.from_options`).
(The coordinator's counting itself: tests/snapshot/test_coordinator.py.)
"""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import structlog

import slashrt
from slashrt import Dataflow, Schema, Tumbling, sinks
from slashrt.errors import OptionError, SnapshotError
from slashrt.snapshot.coordinator import TOLERABLE_FAILURES, CheckpointConfig
from slashrt.testing._disk import can_mount, mounted
from tests.snapshot._paced import Paced

pytestmark = pytest.mark.skipif(not can_mount(), reason="needs root to mount a tmpfs (a real full disk)")

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
N = 120_000
RECORDS = np.zeros(N, SCHEMA.dtype)
RECORDS["t"] = np.arange(N) // 10
RECORDS["k"] = np.arange(N) % 500
RECORDS["v"] = np.arange(N) % 7
WAIT_S = 120  # a safety net only: each wait ends on the event it waits for


def flow(pace=None, transactional=True):
    f = Dataflow("full")
    s = f.source("s", SCHEMA, time="t", max_delay=0)
    if pace is not None:
        s = s.filter(pace, name="paced")
    s.window(Tumbling(ms=100)).sum("v", key="k").sink(sinks.Collect(transactional=transactional), name="out")
    return f


@pytest.fixture(scope="module")
def reference():
    return np.sort(slashrt.run(flow(transactional=False), {"s": RECORDS})["full.out"])


@pytest.fixture
def disk(tmp_path):
    with mounted(tmp_path / "disk", "8m") as disk:
        yield disk


class Job:
    """The job run in a thread (the test steers the disk meanwhile), its log captured; its stream
    paced until the test drops a file in `go`."""

    def __init__(self, tmp_path: Path, disk, **options):
        self.go = tmp_path / "go"
        self.go.mkdir()
        self.disk, self.options = disk, options
        self.result = self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            self.result = slashrt.run(flow(Paced(seconds=0.003, until=(self.go, 1))), {"s": RECORDS}, slots=8,
                                      slot_size=2048, checkpoint_dir=self.disk.path, **self.options)
        except Exception as exc:  # noqa: BLE001 (the test looks at it)
            self.error = exc

    def events(self, name: str) -> list[dict]:
        return [e for e in list(self.logs) if e["event"] == name]

    def wait(self, what, condition) -> None:
        deadline = time.monotonic() + WAIT_S
        while not condition():
            assert self.thread.is_alive() or condition(), f"the job ended before {what}: {self.error!r}"
            assert time.monotonic() < deadline, f"no {what} in {WAIT_S} s"
            time.sleep(0.01)

    def release(self) -> None:
        (self.go / "go").touch()

    def __enter__(self):
        self._capture = structlog.testing.capture_logs()
        self.logs = self._capture.__enter__()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.release()
        self.thread.join(WAIT_S)
        self._capture.__exit__(*exc)


def completed(job) -> int:
    return len(job.events("checkpoint completed"))


def decline_then_complete(job, disk, declined: int) -> None:
    """After a first checkpoint, fill the disk until `declined` checkpoints were declined (each
    refill takes what retention freed), then free it and wait for a checkpoint to complete."""
    job.wait("a first checkpoint", lambda: completed(job) >= 1)
    disk.fill()
    job.wait(f"{declined} declined checkpoints", lambda: (disk.fill(), len(job.events("checkpoint declined")))[1] >= declined)
    disk.free()
    done = completed(job)
    job.wait("a checkpoint after the disk was freed", lambda: completed(job) > done)


def test_full_disk_declines_checkpoints_then_they_resume_exactly_once(tmp_path, disk, reference):
    with Job(tmp_path, disk, checkpoint={"interval": 0.05, "tolerable_failures": 50}, executors=1) as job:
        decline_then_complete(job, disk, declined=3)
    assert job.error is None, job.error
    declined = job.events("checkpoint declined")
    assert all("No space left on device" in e["reason"] and str(disk.path) in e["reason"] for e in declined)
    aborted = [c for c in job.result.checkpoints if c["status"] == "aborted"]
    assert len(aborted) >= 3
    assert np.array_equal(np.sort(job.result["full.out"]), reference)  # exact: nothing twice, nothing lost
    job_dir = disk.path / "full"
    # retention removed every declined checkpoint's partial directory
    assert all((d / "_manifest.json").exists() for d in job_dir.glob("chk-*")), sorted(os.listdir(job_dir))


def test_declined_checkpoints_publish_nothing(tmp_path, disk):
    """The transactional sink commits only completed checkpoints: while every checkpoint is
    declined, nothing more is published (then all of it, with the next completed one)."""
    out = sinks.Collect(transactional=True)
    f = Dataflow("full")
    s = f.source("s", SCHEMA, time="t", max_delay=0)
    go = tmp_path / "go"
    go.mkdir()
    s.filter(Paced(seconds=0.003, until=(go, 1)), name="paced").sink(out, name="out")
    seen = {}

    def run():
        try:
            seen["result"] = slashrt.run(f, {"s": RECORDS}, slots=8, slot_size=2048, checkpoint_dir=disk.path,
                                         checkpoint={"interval": 0.05, "tolerable_failures": 50})
        except Exception as exc:  # noqa: BLE001
            seen["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    with structlog.testing.capture_logs() as logs:
        thread.start()
        deadline = time.monotonic() + WAIT_S
        while not any(e["event"] == "checkpoint completed" for e in list(logs)):
            assert thread.is_alive() and time.monotonic() < deadline, seen
            time.sleep(0.01)
        disk.fill()
        while sum(e["event"] == "checkpoint declined" for e in list(logs)) < 1:
            assert thread.is_alive() and time.monotonic() < deadline, seen
            time.sleep(0.01)
        published = len(out.records)
        completions = sum(e["event"] == "checkpoint completed" for e in list(logs))
        while sum(e["event"] == "checkpoint declined" for e in list(logs)) < 3:
            disk.fill()
            assert thread.is_alive() and time.monotonic() < deadline, seen
            time.sleep(0.01)
        # (unless one fitted into what a discarded one freed before the refill: then it published)
        if sum(e["event"] == "checkpoint completed" for e in list(logs)) == completions:
            assert len(out.records) == published  # declined checkpoints published nothing
        disk.free()
        (go / "go").touch()
        thread.join(WAIT_S)
    assert "error" not in seen, seen
    assert len(out.records) == N  # all of it, once


def test_too_many_failures_in_a_row_fail_the_job_in_one_sentence(tmp_path, disk):
    with Job(tmp_path, disk, checkpoint={"interval": 0.05, "tolerable_failures": 2}) as job:
        job.wait("a first checkpoint", lambda: completed(job) >= 1)
        job.wait("the job's failure", lambda: (disk.fill(), job.error is not None)[1])
    message = str(job.error)
    assert isinstance(job.error, SnapshotError), repr(job.error)
    assert f"could not be written to {disk.path}/full/chk-" in message and "No space left on device" in message
    assert "3 checkpoints in a row failed, more than the 2 tolerated" in message
    assert "\n" not in message


def test_full_disk_at_the_final_checkpoint_fails_the_job_in_one_sentence(tmp_path, disk):
    with Job(tmp_path, disk) as job:  # no interval: the final checkpoint only
        disk.fill()
        job.release()
        job.wait("the job's failure", lambda: job.error is not None)
    message = str(job.error)
    assert isinstance(job.error, SnapshotError), repr(job.error)
    assert f"checkpoint 1 could not be written to {disk.path}/full/chk-1" in message
    assert "it was the run's final checkpoint, so the job fails" in message
    assert not list((disk.path / "full").glob("chk-*"))  # its partial directory removed


def test_full_disk_at_a_stops_savepoint_fails_the_job_in_one_sentence(tmp_path, disk):
    stop = slashrt.StopHandle()
    with Job(tmp_path, disk, stop=stop) as job:
        disk.fill()
        stop.request()
        job.wait("the job's failure", lambda: job.error is not None)
    message = str(job.error)
    assert isinstance(job.error, SnapshotError), repr(job.error)
    assert f"checkpoint 1 could not be written to {disk.path}/full/chk-1" in message and "No space left" in message
    assert "it was the run's savepoint, so the job fails" in message


def test_two_executors_full_disk_at_a_stops_savepoint_fails_the_job_in_one_sentence(tmp_path, disk):
    stop = slashrt.StopHandle()
    with Job(tmp_path, disk, stop=stop, executors=2) as job:
        disk.fill()
        stop.request()
        job.wait("the job's failure", lambda: job.error is not None)
    message = str(job.error)
    assert f"checkpoint 1 could not be written to {disk.path}/full/chk-1" in message and "No space left" in message
    assert "it was the run's savepoint, so the job fails" in message


def test_two_executors_decline_then_resume_exactly_once(tmp_path, disk, reference):
    with Job(tmp_path, disk, checkpoint={"interval": 0.1, "tolerable_failures": 50}, executors=2) as job:
        decline_then_complete(job, disk, declined=2)
    assert job.error is None, job.error
    assert all("No space left on device" in e["reason"] for e in job.events("checkpoint declined"))
    assert np.array_equal(np.sort(job.result["full.out"]), reference)


def test_two_executors_fail_after_too_many_failures(tmp_path, disk):
    with Job(tmp_path, disk, checkpoint={"interval": 0.1, "tolerable_failures": 1}, executors=2) as job:
        job.wait("a first checkpoint", lambda: completed(job) >= 1)
        job.wait("the job's failure", lambda: (disk.fill(), job.error is not None)[1])
    message = str(job.error)
    assert "could not be written to" in message and str(disk.path) in message, message
    assert "2 checkpoints in a row failed, more than the 1 tolerated" in message, message


def test_the_command_line_says_the_sentence_on_a_full_disk(disk):
    """`slashrt run` on a full checkpoint disk: one line naming the checkpoint and the path, no traceback."""
    tests = Path(__file__).parents[1]
    disk.fill()
    done = subprocess.run(
        [sys.executable, "-m", "slashrt", "run", str(tests / "_cli_jobs.py"), "--checkpoint-dir", str(disk.path),
         "--checkpoint-interval", "1ms", "--tolerable-checkpoint-failures", "0"],
        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(tests.parent)},
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode != 0 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"could not be written to {disk.path}/counts/chk-" in lines[0] and "No space left on device" in lines[0]


def test_tolerable_failures_option():
    assert CheckpointConfig.from_options(interval=1).tolerable_failures == TOLERABLE_FAILURES == 3
    assert CheckpointConfig.from_options(interval=1, tolerable_failures=0).tolerable_failures == 0
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(OptionError, match="tolerable_failures must be a whole number >= 0"):
            CheckpointConfig.from_options(interval=1, tolerable_failures=bad)
