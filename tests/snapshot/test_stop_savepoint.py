"""Stop with a savepoint from Python (`run(..., stop=StopHandle())`), on one executor.

- the run stops with a final savepoint (sources stop after its barrier, the sinks commit it) and
  reports it; resuming from it continues exactly where it stopped: the committed output of the
  stopped run and of the resumed run, together, equals one uninterrupted run's (ABS and the
  stop-the-world mode; stop points drawn at random, seeded, in records seen by the dataflow);
- a stop asked before the run starts stops it at its first barrier;
- a stop asked from another thread works (the handle is thread-safe);
- a savepoint that aborts (forced) lets the job go on: the sources feed on, periodic checkpoints
  start again, the run finishes with all its output;
- the savepoint's manifest says it is one (kind "savepoint");
- `stop=` without a checkpoint directory, or not a StopHandle, is refused in one sentence.
(On clusters: test_cluster_stop.py.)
"""

import threading
import time

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Schema, StopHandle, Tumbling, sinks
from slashrt.errors import OptionError
from slashrt.snapshot import SnapshotStore

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
SIZES = {"a": 90_000, "b": 60_000, "c": 40_000}


def source_records(name: str) -> np.ndarray:
    rng = np.random.default_rng(ord(name))
    n = SIZES[name]
    out = np.zeros(n, SCHEMA.dtype)
    out["t"] = np.arange(n, dtype=np.int64) * 10_000 // n - rng.integers(0, 60 if name == "a" else 10, n)
    out["k"] = rng.integers(0, 20, n)
    out["v"] = rng.integers(-100, 100, n)
    return out


INPUTS = {name: source_records(name) for name in SIZES}


def run(directory, *, seen=None, **options):
    """The job (windows with late records, a union) with transactional Collect sinks; `seen`
    (a function of the records seen so far) is called by a pass-through filter after source a."""
    flow = Dataflow("stopped")
    a, b, c = (flow.source(name, SCHEMA, time="t", max_delay=20) for name in SIZES)
    if seen is not None:
        count = [0]

        def observe(batch):
            count[0] += len(batch)
            seen(count[0])
            return np.ones(len(batch), bool)

        a = a.filter(observe, name="observe")
    late = sinks.Collect(transactional=True)
    a.window(Tumbling(ms=50), late=late).sum("v", key="k").sink(sinks.Collect(transactional=True), name="sa")
    b.union(c).window(Tumbling(ms=50)).sum("v", key="k").sink(sinks.Collect(transactional=True), name="sbc")
    result = slashrt.run(flow, INPUTS, slots=8, slot_size=2048, checkpoint_dir=directory, **options)
    return result, {"sa": result["stopped.sa"], "sbc": result["stopped.sbc"], "late": late.records}


def rows(*outputs) -> dict:
    """Each sink's rows of several runs together, sorted (the order of a multiset)."""
    return {name: np.sort(np.concatenate([o[name] for o in outputs])) for name in outputs[0]}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    result, out = run(tmp_path_factory.mktemp("reference"))
    assert result.savepoint is None and all(len(v) for v in out.values())
    return rows(out)


def equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# where source a stands when the stop is asked (records): drawn at random, seeded
POINTS = [int(x) for x in np.random.default_rng(8).integers(1, SIZES["a"] - 10_000, 4)]


@pytest.mark.parametrize("point, mode", [*((p, "abs") for p in POINTS), (POINTS[0], "sync")])
def test_stop_with_a_savepoint_then_resume_is_exactly_once(tmp_path, reference, point, mode):
    stop = StopHandle()
    config = {"interval": 0.003 if mode == "abs" else 0.05, "mode": mode}  # stop-the-world is slow
    stopped, first = run(tmp_path, seen=lambda n: n >= point and stop.request(), checkpoint=config, stop=stop)
    assert stopped.savepoint is not None and stopped.records < sum(SIZES.values())
    ended = {c["checkpoint"]: c for c in stopped.checkpoints}
    assert ended[stopped.savepoint]["status"] == "completed" and ended[stopped.savepoint]["savepoint"]
    store = SnapshotStore(tmp_path, job="stopped")
    assert store.checkpoints()[-1] == stopped.savepoint
    saved = store.load(stopped.savepoint)
    assert saved.meta["kind"] == "savepoint" and saved.meta["sources"]["stopped.a"]["0"]["fed"] >= point
    resumed, second = run(tmp_path, seen=lambda n: None, checkpoint=config, resume_from=stopped.savepoint)
    assert resumed.resumed_from == stopped.savepoint and resumed.savepoint is None
    assert stopped.records + resumed.records == sum(SIZES.values())
    assert equal(rows(first, second), reference)


def test_a_stop_asked_before_the_run_stops_it_at_its_first_barrier(tmp_path, reference):
    stop = StopHandle()
    stop.request()
    stopped, first = run(tmp_path, stop=stop)
    assert stopped.savepoint == 1 and stopped.records < sum(SIZES.values())
    resumed, second = run(tmp_path, resume_from="latest")
    assert resumed.resumed_from == 1 and equal(rows(first, second), reference)


def test_a_stop_asked_from_another_thread(tmp_path, reference):
    stop = StopHandle()
    asked = threading.Event()

    def ask():
        asked.wait()
        stop.request()

    thread = threading.Thread(target=ask)
    thread.start()
    try:
        # the filter blocks the run until the other thread asked: the stop arrives mid-stream
        stopped, first = run(tmp_path, seen=lambda n: n >= 30_000 and not asked.is_set() and (asked.set(), thread.join()),
                             stop=stop)
    finally:
        asked.set()
        thread.join()
    assert stopped.savepoint is not None and stopped.records < sum(SIZES.values())
    resumed, second = run(tmp_path, resume_from="latest")
    assert equal(rows(first, second), reference)


def test_stop_needs_a_checkpoint_directory_and_a_handle(tmp_path):
    flow = Dataflow("opts")
    flow.source("a", SCHEMA, time="t").sink(sinks.Collect())
    with pytest.raises(OptionError, match="stop= need checkpoint_dir"):
        slashrt.run(flow, {"a": INPUTS["a"]}, stop=StopHandle())
    with pytest.raises(OptionError, match="stop= takes a slashrt.StopHandle, got Event"):
        slashrt.run(flow, {"a": INPUTS["a"]}, checkpoint_dir=tmp_path, stop=threading.Event())


def test_a_failed_savepoint_lets_the_job_go_on(tmp_path, reference, monkeypatch):
    from slashrt.snapshot import runtime

    take = runtime.Checkpointing._take

    declined = []

    def decline_the_savepoint(self, n, alignment, running=False):
        if self._kinds.get(n) != "savepoint":
            return take(self, n, alignment, running)
        self._taken.add(n)
        assert self.coordinator.decline(n, self._instances()[0], "forced by the test") is not None
        declined.append(n)
        self._signal()

    monkeypatch.setattr(runtime.Checkpointing, "_take", decline_the_savepoint)
    stop = StopHandle()
    store = SnapshotStore(tmp_path, job="stopped", readonly=True)

    def seen(n):
        """The stop at 20,000 records of a; from there each batch lasts more than an interval
        until a periodic checkpoint after the declined savepoint is complete (however long its
        write takes on a loaded disk), so the input cannot end before one is."""
        if n >= 20_000 and not (declined and any(m > declined[0] for m in store.checkpoints())):
            stop.request()
            time.sleep(0.004)

    result, out = run(tmp_path, seen=seen, checkpoint=0.003, stop=stop)
    assert result.savepoint is None and result.records == sum(SIZES.values())
    ended = {c["checkpoint"]: c for c in result.checkpoints}
    (failed,) = [n for n, c in ended.items() if c["savepoint"] and c["status"] == "aborted"]
    assert "forced by the test" in ended[failed]["reason"]
    after = [n for n, c in ended.items() if n > failed and c["status"] == "completed"]
    assert len(after) >= 2, result.checkpoints  # periodic ones, then the final one
    assert equal(rows(out), reference)
