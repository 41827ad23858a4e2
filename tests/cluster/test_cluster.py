"""Multi-executor runs in real processes: results equal a sequential run (P2), windows never
fire early (P1), failures fail the job, bad arguments are refused."""

import os
import signal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import slashrt
from slashrt import Dataflow, Schema, Sliding, Tumbling
from slashrt.bench._common import sort_rows, zipf_choice
from slashrt.cluster import ClusterError, PerExecutor, share
from slashrt.errors import DataflowError
from slashrt.ops.sinks import Collect, CsvFile
from slashrt.testing import EXCHANGE_MODES, WRAPS, check_exchanges

SCHEMA = Schema([("ts", "<i8"), ("key", "<i8"), ("value", "<i8")])
KINDS = ("count", "sum", "min", "max", "mean")


def records(n: int, *, keys: int, zipf: float, disorder: int, seed: int, per_ms: int = 20) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros(n, SCHEMA.dtype)
    t = np.arange(n, dtype=np.int64) // per_ms
    if disorder:
        t = np.maximum(t - rng.integers(0, disorder + 1, n), 0)
    out["ts"] = t
    out["key"] = zipf_choice(rng, keys, n, zipf) * 7919 - keys  # negative and sparse keys too
    out["value"] = rng.integers(-1000, 1000, n)
    return out


def flow(sink, *, kind: str, assigner, max_delay: int) -> Dataflow:
    f = Dataflow("p2")
    s = f.source("r", SCHEMA, time="ts", max_delay=max_delay)
    w = s.window(assigner)
    agg = w.count(key="key") if kind == "count" else getattr(w, kind)("value", key="key", output="out")
    agg.sink(sink, name="out")
    return f


def result(sink) -> np.ndarray:
    rows = sink.records
    assert rows is not None
    return sort_rows(rows, "window_start", "key")


def sequential(kind, assigner, data, max_delay) -> np.ndarray:
    sink = Collect()
    slashrt.run(flow(sink, kind=kind, assigner=assigner, max_delay=max_delay), {"r": data})
    return result(sink)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(
    executors=st.integers(1, 4),
    epoch_bytes=st.sampled_from([512, 64 << 10, 64 << 20]),
    zipf=st.sampled_from([0.0, 1.5]),
    n=st.integers(1, 40_000),
    keys=st.sampled_from([3, 1000]),
    kind=st.sampled_from(KINDS),
    sliding=st.booleans(),
    mode=st.sampled_from(["slash", "uppar"]),
    routing=st.sampled_from(["auto", "fragments", "direct"]),
    seed=st.integers(0, 1000),
)
def test_p2_cluster_equals_sequential(executors, epoch_bytes, zipf, n, keys, kind, sliding, mode, routing, seed):
    data = records(n, keys=keys, zipf=zipf, disorder=30, seed=seed)
    assigner = Sliding(size_ms=300, slide_ms=100) if sliding else Tumbling(ms=250)
    expected = sequential(kind, assigner, data, 30)
    sink = Collect()
    r = slashrt.run(
        flow(sink, kind=kind, assigner=assigner, max_delay=30),
        {"r": data},
        executors=executors,
        mode=mode,
        epoch_bytes=epoch_bytes,
        partitions=16,
        ssb_routing=routing,
    )
    got = result(sink)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
    assert sum(r.late_records.values()) == 0
    assert len(r.stats) == executors


def union_flow(sink) -> Dataflow:
    """`flow`'s count of 1 s windows with fan-in: two sources (the records' halves) in a union."""
    f = Dataflow("p2")
    a, b = (f.source(name, SCHEMA, time="ts", max_delay=0) for name in "ab")
    a.union(b).window(Tumbling(ms=1000)).count(key="key").sink(sink, name="out")
    return f


@pytest.mark.parametrize("union", [False, True], ids=["linear", "union"])
def test_state_shipped_per_epoch_follows_distinct_keys_not_input(union):
    # 2 executors, 5 distinct keys, epochs of 16 KiB (an epoch ends after the batch that
    # crosses the bound: one 64 KiB buffer per batch here): each epoch ships at most 5 keys per
    # slice, in rows of 40 bytes (slice, key, count, value and its time), with a union or without
    data = records(200_000, keys=5, zipf=0.0, disorder=0, seed=3, per_ms=1000)
    sink = Collect()
    if union:
        job, inputs = union_flow(sink), {"a": data[: len(data) // 2], "b": data[len(data) // 2 :]}
    else:
        job, inputs = flow(sink, kind="count", assigner=Tumbling(ms=1000), max_delay=0), {"r": data}
    r = slashrt.run(job, inputs, executors=2, epoch_bytes=16 << 10, coalesce=1)
    np.testing.assert_array_equal(result(sink), sequential("count", Tumbling(ms=1000), data, 0))
    (per_executor,) = r.epochs.values()
    epochs = [e for ex in per_executor for e in ex]
    # many epochs of the 16 KiB bound, not only window ends (an epoch also ends at each
    # shipment of due fragments: those read less)
    assert sum(e.input_bytes >= 16 << 10 for e in epochs) > 20
    assert sum(e.input_bytes for e in epochs) == data.nbytes
    for e in epochs:
        assert e.keys_touched <= 5 * 2  # distinct (slice, key) pairs: an epoch spans at most 2 slices
        assert e.shipped_bytes == e.shipped_rows * 40
    assert sum(e.shipped_rows for e in epochs) > 0
    assert max(e.shipped_bytes for e in epochs) < 1000


def test_auto_routing_goes_direct_while_epochs_bring_mostly_new_keys_and_back_when_they_repeat():
    """First half: keys from a range of ten million (every record a new key), second half: five
    keys. Auto routing folds the first epoch into fragments, sees a delta as large as its input
    and routes directly; once the own records it routes stop bringing new keys, it folds again.
    The result is the sequential one throughout."""
    half = 120_000
    data = records(2 * half, keys=5, zipf=0.0, disorder=0, seed=9, per_ms=4000)
    data["key"][:half] = np.random.default_rng(1).integers(0, 10_000_000, half)
    sink = Collect()
    r = slashrt.run(
        flow(sink, kind="sum", assigner=Tumbling(ms=10), max_delay=0), {"r": data},
        executors=2, epoch_bytes=64 << 10, coalesce=1,
    )
    np.testing.assert_array_equal(result(sink), sequential("sum", Tumbling(ms=10), data, 0))
    (per_executor,) = r.epochs.values()
    for epochs in per_executor:
        epochs = [e for e in epochs if e.records]
        modes = [e.direct for e in epochs]
        assert modes[:2] == [False, True] and modes[-1] is False, modes
        assert epochs[0].keys_touched > 0.9 * epochs[0].records
        direct = [e for e in epochs if e.direct]
        assert all(e.shipped_rows <= e.records for e in direct)  # one row per record led elsewhere
        assert sum(e.shipped_rows for e in direct) > 0.3 * sum(e.records for e in direct)
    assert sum(e.records for ex in per_executor for e in ex) == len(data)


def test_per_executor_inputs_and_tcp_transport():
    def make(index, executors):
        return records(30_000, keys=50, zipf=0.0, disorder=0, seed=100 + index)

    sink = Collect()
    slashrt.run(
        flow(sink, kind="sum", assigner=Tumbling(ms=500), max_delay=0), {"r": PerExecutor(make)}, executors=3, transport="tcp"
    )
    whole = np.concatenate([make(i, 3) for i in range(3)])
    whole = whole[np.argsort(whole["ts"], kind="stable")]
    np.testing.assert_array_equal(result(sink), sequential("sum", Tumbling(ms=500), whole, 0))


def test_share_is_disjoint_and_complete():
    data = np.arange(10_001)
    parts = [share(data, i, 3, block=100) for i in range(3)]
    assert sorted(np.concatenate(parts).tolist()) == data.tolist()
    assert all((np.diff(p) > 0).all() for p in parts)  # each executor's stream keeps its order
    assert parts[1][:3].tolist() == [100, 101, 102]


def _slow_on_executor_1(batch):
    # executor 1's stream (marked by odd values) is slow: every batch takes a while
    if len(batch) and batch["value"][0] % 2:
        import time

        time.sleep(0.02)
    return batch


def test_p1_a_slow_executor_holds_back_every_window():
    def make(index, executors):
        d = records(20_000, keys=20, zipf=0.0, disorder=0, seed=7 + index, per_ms=10)
        d["value"] = d["value"] * 2 + index  # odd values mark executor 1's stream
        return d

    fired = Collect()
    f = Dataflow("p1")
    s = f.source("r", SCHEMA, time="ts").apply(_slow_on_executor_1)
    s.window(Tumbling(ms=100)).sum("value", key="key", output="out").sink(fired, name="out")
    # one 4 KiB buffer per batch and a watermark after each: executor 0 races ahead, epoch after epoch
    r = slashrt.run(
        f, {"r": PerExecutor(make)}, executors=2, epoch_bytes=4096, coalesce=1, watermark_every=1, slot_size=4096
    )
    whole = np.concatenate([make(i, 2) for i in range(2)])
    whole = whole[np.argsort(whole["ts"], kind="stable")]
    np.testing.assert_array_equal(result(fired), sequential("sum", Tumbling(ms=100), whole, 0))
    assert sum(r.late_records.values()) == 0
    # the slow executor shipped many epochs; had a leader fired before its watermark passed,
    # its later deltas would have been refused as arriving after their windows fired
    (per_executor,) = r.epochs.values()
    assert len(per_executor[1]) > 10
    assert [e.epoch for e in per_executor[1]] == list(range(1, len(per_executor[1]) + 1))


def _die_on_executor_1(batch):
    if len(batch) and batch["value"][0] == -1 and batch["ts"][0] > 50:
        os.kill(os.getpid(), signal.SIGKILL)
    return batch


def test_a_helper_dying_mid_epoch_fails_the_job():
    def make(index, executors):
        d = records(20_000, keys=20, zipf=0.0, disorder=0, seed=index, per_ms=10)
        d["value"] = -1 if index == 1 else 1
        return d

    f = Dataflow("dies")
    f.source("r", SCHEMA, time="ts").apply(_die_on_executor_1).window(Tumbling(ms=100)).count(key="key").sink(
        Collect(), name="out"
    )
    with pytest.raises(ClusterError, match="executor 1"):
        slashrt.run(f, {"r": PerExecutor(make)}, executors=2, epoch_bytes=4096)


def test_an_operator_error_on_one_executor_fails_the_job_naming_it():
    def make(index, executors):
        return records(5000, keys=5, zipf=0.0, disorder=0, seed=index)

    def boom(batch):
        if batch["ts"][0] > 100:
            raise ValueError("bad record")
        return batch

    f = Dataflow("boom")
    f.source("r", SCHEMA, time="ts").apply(boom, name="check").window(Tumbling(ms=100)).count(key="key").sink(Collect())
    with pytest.raises(ClusterError, match=r"^step 'boom\.check': user function raised ValueError: bad record \(on executor \d\)$"):
        slashrt.run(f, {"r": PerExecutor(make)}, executors=2)


def test_a_failure_on_several_executors_prints_no_exception_groups(capfd):
    # the agents share this process's stderr: a failed job is one log line there, not a traceback
    def make(index, executors):
        return records(5000, keys=5, zipf=0.0, disorder=0, seed=index)

    f = Dataflow("boom")
    f.source("r", SCHEMA, time="ts").apply(_always_fails, name="check").window(Tumbling(ms=100)).count(key="key").sink(
        Collect()
    )
    with pytest.raises(ClusterError, match="always"):
        slashrt.run(f, {"r": PerExecutor(make)}, executors=2)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception Group" not in err


def _always_fails(batch):
    raise ValueError("always")


def test_callback_sinks_are_called_in_the_driver_with_each_executors_records():
    data = records(10_000, keys=10, zipf=0.0, disorder=0, seed=4)
    got = []
    slashrt.run(flow(slashrt.sinks.Callback(got.append), kind="count", assigner=Tumbling(ms=100), max_delay=0), {"r": data}, executors=2)
    assert 1 <= len(got) <= 2  # once per executor that had results
    whole = sort_rows(np.concatenate(got), "window_start", "key")
    np.testing.assert_array_equal(whole, sequential("count", Tumbling(ms=100), data, 0))


def test_an_empty_cluster_result_is_an_empty_array_of_the_result_dtype():
    f = Dataflow("empty")
    out, late = Collect(), Collect()
    s = f.source("r", SCHEMA, time="ts").filter(lambda b: b["key"] > 10**12)
    s.window(Tumbling(ms=100), late=late).sum("value", key="key", output="out").sink(out, name="out")
    slashrt.run(f, {"r": records(1000, keys=5, zipf=0.0, disorder=0, seed=2)}, executors=2)
    assert out.records.dtype.names == ("window_start", "window_end", "key", "out") and len(out.records) == 0
    assert late.records.dtype == SCHEMA.dtype and len(late.records) == 0


def test_an_untyped_aggregated_column_is_refused_before_executors_start():
    f = Dataflow("untyped")
    s = f.source("r", SCHEMA, time="ts").with_column("double", lambda b: b["value"] * 2, name="twice")
    s.window(Tumbling(ms=100)).sum("double", key="key", name="sums").sink(Collect())
    with pytest.raises(
        DataflowError,
        match=r"step 'untyped\.sums': a multi-executor run needs the type of the aggregated column 'double' .* "
        r"give with_column\('double', \.\.\., dtype=\.\.\.\) in step 'untyped\.twice' a dtype",
    ):
        slashrt.run(f, {"r": records(10, keys=2, zipf=0, disorder=0, seed=0)}, executors=2)


def test_file_sinks_write_one_part_per_executor(tmp_path):
    data = records(10_000, keys=10, zipf=0.0, disorder=0, seed=1)
    f = flow(CsvFile(tmp_path / "out.csv"), kind="count", assigner=Tumbling(ms=100), max_delay=0)
    slashrt.run(f, {"r": data}, executors=2)
    parts = sorted(p.name for p in tmp_path.iterdir())
    assert parts == ["out-0.csv", "out-1.csv"]
    lines = sum(len((tmp_path / p).read_text().splitlines()) - 1 for p in parts)
    assert lines == len(sequential("count", Tumbling(ms=100), data, 0))


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(executors=2, mode="hash"), "unknown mode"),
        (dict(executors=2, transport="carrier-pigeon"), "unknown transport"),
        (dict(executors=0), "at least one executor"),
        (dict(executors=["nohost"]), "HOST:PORT"),
        (dict(executors=["10.1.2.3:7000"], transport="shm"), "one machine"),
        (dict(executors=2, partitions=0), "must be positive"),
        (dict(executors=2, ssb_routing="sideways"), "unknown SSB routing 'sideways'"),
        (dict(executors=2, progress="watermark"), "progress= was removed"),
    ],
)
def test_bad_cluster_arguments_are_refused(options, message):
    f = flow(Collect(), kind="count", assigner=Tumbling(ms=100), max_delay=0)
    with pytest.raises(DataflowError, match=message):
        slashrt.run(f, {"r": records(10, keys=2, zipf=0, disorder=0, seed=0)}, **options)


def test_unreachable_executor_is_a_clear_error():
    f = flow(Collect(), kind="count", assigner=Tumbling(ms=100), max_delay=0)
    with pytest.raises(ClusterError, match="cannot reach executor 0"):
        slashrt.run(f, {"r": records(10, keys=2, zipf=0, disorder=0, seed=0)}, executors=["127.0.0.1:1"], transport="tcp")


def test_uppar_executors_routing_into_each_other_through_small_rings_do_not_deadlock():
    # 4 KiB slots: the exchange rings hold 32 x 4 KiB while each executor routes ~3 MB to the
    # other; both block on credits unless each keeps consuming what the other sends (lane 1)
    data = records(250_000, keys=1000, zipf=0.0, disorder=0, seed=5, per_ms=100)
    sink = Collect()
    slashrt.run(
        flow(sink, kind="sum", assigner=Tumbling(ms=1000), max_delay=0), {"r": data}, executors=2, mode="uppar", slot_size=4096
    )
    np.testing.assert_array_equal(result(sink), sequential("sum", Tumbling(ms=1000), data, 0))


CTRL_C_SCRIPT = """
import os, time, numpy as np, slashrt, sys
from pathlib import Path
from slashrt import Dataflow, Schema, Tumbling
from slashrt.cluster import PerExecutor
from slashrt.ops.sinks import Collect

S = Schema([("ts", "<i8"), ("key", "<i8")])
RUNNING = Path(sys.argv[1])

def make(index, executors):
    out = np.zeros(2_000_000, S.dtype)
    out["ts"] = np.arange(len(out)) // 100
    return out

def crawl(batch):
    (RUNNING / str(os.getpid())).touch()  # this executor computes: the test may interrupt now
    time.sleep(1.0)  # a slow job (16 batches): still running when Ctrl-C comes
    return batch

f = Dataflow("slow")
f.source("r", S, time="ts").apply(crawl).window(Tumbling(ms=100)).count(key="key").sink(Collect())
print("starting", flush=True)
slashrt.run(f, {"r": PerExecutor(make)}, executors=2)
"""


def test_ctrl_c_stops_the_job_and_every_executor(tmp_path):
    import subprocess
    import sys
    import time

    script, running = tmp_path / "job.py", tmp_path / "running"
    script.write_text(CTRL_C_SCRIPT)
    running.mkdir()
    # Ctrl-C as at a terminal: a suite started in the background by a shell inherits SIGINT
    # ignored, and so would the job (Python then raises no KeyboardInterrupt at all)
    proc = subprocess.Popen([sys.executable, str(script), str(running)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout.readline().strip() == "starting"
        # interrupted once both executors compute (a marker each), not after a fixed time: a
        # loaded machine may start them late, and the job must still be running at the SIGINT
        deadline = time.monotonic() + 120
        while len(os.listdir(running)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        children = [int(p) for p in os.listdir(running)]
        assert len(children) == 2, "the executors did not start computing"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) != 0  # interrupted, no result
        deadline = time.monotonic() + 10  # reaped when the driver ended: allow the kernel to finish
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in children)
    finally:
        if proc.poll() is None:
            proc.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("mode", list(EXCHANGE_MODES))
@pytest.mark.parametrize("transport", ["shm", "tcp"])
async def test_every_exchange_wraps_its_small_ring_many_times_and_equals_one_executor(transport, mode):
    # rings of 4 x 4 KiB, each channel carrying >= 100 of them before its stream ends: a medium
    # whose bytes move only when a stream ends (an undriven tcp sender) stalls and fails here
    report = await check_exchanges(transport, mode, executors=2, deadline=120)
    assert report["rings"] >= WRAPS


@pytest.mark.parametrize("mode", ["slash", "uppar"])
@pytest.mark.parametrize("query", ["ysb", "q7"])
def test_two_executors_give_one_executors_windows_and_late_records(query, mode):
    """The SSB's epochs (and UpPar's routes) on the pointstamp frontier of two executors: the
    windows and late records of one executor, on out-of-order input with late records (the
    executors read the input's halves in its order, so lateness is judged as on one)."""
    from slashrt.bench import nexmark, ysb

    if query == "ysb":
        data = ysb.generate(60_000, campaigns=50, events_per_ms=1, disorder_ms=400, seed=3)
        make, inputs = (lambda sink: ysb.dataflow(ysb.campaign_map(50), sink, max_delay=10)), {"events": data}
    else:
        data = nexmark.generate(60_000, auctions=100, events_per_ms=1, seed=3)
        data["date_time"] *= 10  # 600 s: ten windows
        data["date_time"] = np.maximum(data["date_time"] - np.random.default_rng(3).integers(0, 4000, len(data)), 0)
        make, inputs = nexmark.dataflow, {"bids": data}
    runs = {}
    for executors in (1, 2):
        sink = Collect()
        r = slashrt.run(make(sink), inputs, executors=executors, mode=mode, epoch_bytes=8192)
        runs[executors] = (sort_rows(sink.records, *sink.records.dtype.names[:3]), r.late_records)
    (rows_v, late_v), (rows_p, late_p) = runs[1], runs[2]
    assert len(rows_v) >= 10
    np.testing.assert_array_equal(rows_v, rows_p)
    assert late_v == late_p
    assert sum(late_v.values()) > 0  # the input is late-heavy enough to tell lateness apart


def test_auto_routing_ends_a_folding_epoch_once_a_sample_shows_keys_do_not_repeat():
    """One 10 s window, 150,000 records an executor: five keys in the first 30,000, then every
    key new; epochs of 64 MiB. `auto` folds until an epoch's `SAMPLE_RECORDS` records held as
    many entries as `DIRECT_AT` a record (`keys_unrepeated`), ends that epoch and routes the
    rest directly, instead of folding the whole window first."""
    from slashrt.ssb.epochs import SAMPLE_RECORDS

    data = records(300_000, keys=5, zipf=0.0, disorder=0, seed=9, per_ms=100)
    data["key"][30_000:] = np.random.default_rng(2).permutation(10_000_000)[: len(data) - 30_000]
    sink = Collect()
    f = Dataflow("sample")
    f.source("r", SCHEMA, time="ts").window(Tumbling(ms=10_000)).count(key="key").sink(sink)
    r = slashrt.run(f, {"r": data}, executors=2, coalesce=4)
    assert sink.records["count"].sum() == len(data) and len(sink.records) == len(np.unique(data["key"]))
    (per_executor,) = r.epochs.values()
    for epochs in per_executor:
        epochs = [e for e in epochs if e.records]
        folded = [e for e in epochs if not e.direct]
        assert epochs[:len(folded)] == folded and len(folded) <= 2, epochs  # folding, then direct
        assert SAMPLE_RECORDS <= folded[-1].records < SAMPLE_RECORDS + 20_000, folded
        assert sum(e.records for e in epochs[len(folded):]) > 50_000
