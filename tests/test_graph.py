"""Dataflow graphs on one executor: union, connect, user operators, fan-in and fan-out, the
progress modes (pointstamp and watermark give identical results on tree flows), the report and
the debug lines (a frontier moved; an idle executor's open frontiers and what holds them)."""

import json

import numpy as np
import pytest
import structlog
import trio
import trio.testing

import slashrt
from slashrt import Dataflow, Operator, Timestamp, Tumbling, sinks
from slashrt._buffer import Control
from slashrt.bench import nexmark, ysb
from slashrt.errors import DataflowError, SchemaError, SlashError

REC = np.dtype([("k", "<i8"), ("t", "<i8")])


def records(keys, times) -> np.ndarray:
    a = np.zeros(len(keys), REC)
    a["k"], a["t"] = keys, times
    return a


def sorted_rows(a: np.ndarray) -> list:
    return sorted(map(tuple, a.tolist()))


def test_union_merges_every_input_and_fans_out():
    flow = Dataflow("u")
    a, b, c = (flow.source(n, REC, time="t") for n in "abc")
    both = a.union(b, c)
    left, right = sinks.Collect(), sinks.Collect()
    both.filter(lambda x: x["k"] % 2 == 0).sink(left, name="even")
    both.sink(right, name="all")
    ins = {"a": records(range(0, 50), range(50)), "b": records(range(50, 80), range(30)), "c": records([99], [0])}
    slashrt.run(flow, ins)
    every = np.concatenate(list(ins.values()))
    assert sorted_rows(right.records) == sorted_rows(every)
    assert sorted_rows(left.records) == sorted_rows(every[every["k"] % 2 == 0])


def test_union_refuses_other_columns_and_other_flows():
    flow = Dataflow("u")
    a = flow.source("a", REC, time="t")
    b = flow.source("b", np.dtype([("k", "<i4"), ("t", "<i8")]), time="t")
    with pytest.raises(SchemaError, match=r"union: step 'u\.b' has columns"):
        a.union(b)
    other = Dataflow("v").source("a", REC)
    with pytest.raises(DataflowError, match="no stream of dataflow 'u'"):
        a.union(other)


def test_connect_apply_sees_ports():
    flow = Dataflow("c")
    a, b = flow.source("a", REC, time="t"), flow.source("b", REC, time="t")
    seen = []

    def tag(batch, port):
        seen.append((port, sorted(batch["k"].tolist())))
        out = batch.to_numpy(REC).copy()
        out["k"] += 1000 * port
        return out

    out = sinks.Collect()
    a.connect(b).apply(tag).sink(out)
    slashrt.run(flow, {"a": records([1, 2], [0, 0]), "b": records([3], [0])})
    assert sorted(k for port, ks in seen for k in ks if port == 0) == [1, 2]
    assert sorted(k for port, ks in seen for k in ks if port == 1) == [3]
    assert sorted(out.records["k"].tolist()) == [1, 2, 1003]


class PerPortCount(Operator):
    """Counts records per port and time; emits the counts when the time is complete."""

    per_time = True  # one call per time: every record at ctx.time

    def __init__(self):
        self.counts = {}

    async def on_batch(self, ctx, port, batch):
        key = (ctx.time, port)
        self.counts[key] = self.counts.get(key, 0) + len(batch)
        ctx.notify_at(ctx.time)

    async def on_notify(self, ctx, time):
        rows = [(port, n) for (t, port), n in sorted(self.counts.items(), key=lambda kv: kv[0][1]) if t == time]
        out = np.array([(time.epoch, port, n) for port, n in rows], dtype=[("t", "<i8"), ("port", "<i8"), ("n", "<i8")])
        await ctx.emit(out)


def test_two_input_operator_is_notified_once_per_time_with_both_inputs_complete():
    flow = Dataflow("c")
    a, b = flow.source("a", REC, time="t"), flow.source("b", REC, time="t")
    out = sinks.Collect()
    schema = {"t": "i8", "port": "i8", "n": "i8"}
    a.connect(b).operator(PerPortCount(), schema=schema).sink(out)
    ta, tb = np.repeat(np.arange(5), 3), np.repeat(np.arange(5), 2)
    slashrt.run(flow, {"a": records(np.zeros(15), ta), "b": records(np.zeros(10), tb)}, slot_size=64, slots=4)
    got = sorted(map(tuple, out.records.tolist()))
    assert got == sorted([(t, 0, 3) for t in range(5)] + [(t, 1, 2) for t in range(5)])


class TimeLog(Operator):
    """Logs each batch's time and the values of `column`, asks to be notified at the batch's
    time, passes the batch on; `per_time` False: a stateless operator, taking whole batches."""

    def __init__(self, column: str, per_time: bool = True):
        self.column, self.per_time, self.log = column, per_time, []

    async def on_batch(self, ctx, port, batch):
        self.log.append(("batch", ctx.time, batch[self.column].tolist()))
        ctx.notify_at(ctx.time)
        await ctx.emit(batch)

    async def on_notify(self, ctx, time):
        self.log.append(("notify", time, []))

    def check_never_early(self):
        """No batch at a time <= t after on_notify(t); every batch's time notified."""
        for i, (what, t, _) in enumerate(self.log):
            if what == "notify":
                assert not any(w == "batch" and u.less_equal(t) for w, u, _ in self.log[i + 1:])
        assert {t for what, t, _ in self.log if what == "notify"} == {t for what, t, _ in self.log if what == "batch"}


@pytest.mark.parametrize("max_delay", [0, 2])
def test_stateless_two_input_steps_take_whole_batches_at_their_lower_bound_time(max_delay):
    """connect(...).apply and operators with per_time False are not cut where the watermark
    changes: a batch comes whole, at the watermark before its first record (a lower bound of
    every record's), and a notification at it still comes after every record at or below it."""
    calls = []

    def same(batch, port):
        calls.append(len(batch))
        return batch

    flow = Dataflow("whole")
    a, b = flow.source("a", REC, time="t", max_delay=max_delay), flow.source("b", REC, time="t", max_delay=max_delay)
    op, out = TimeLog("t", per_time=False), sinks.Collect()
    a.connect(b).apply(same).connect(b).operator(op, name="op").sink(out)
    times = np.array([5, 6, 7, 3, 8, 9, 10, 11] * 25) + np.repeat(np.arange(25) * 10, 8)
    ins = {"a": records(np.arange(200), times), "b": records(np.arange(200, 400), times)}
    slashrt.run(flow, ins, slot_size=4096, slots=8)
    assert sorted(out.records["k"].tolist()) == sorted([*range(200), *range(200, 400), *range(200, 400)])
    assert sum(calls) == 400 and len(calls) <= 8  # a few slots' batches, not one call per event time
    batches = [(t, ts) for what, t, ts in op.log if what == "batch"]
    assert len(batches) <= 16
    for t, ts in batches:  # the time is the watermark before the batch's first record, a lower bound
        assert t.epoch <= ts[0] - max_delay
    op.check_never_early()


def test_operator_must_be_an_instance():
    flow = Dataflow("o")
    a = flow.source("a", REC)
    with pytest.raises(DataflowError, match="no slashrt.Operator instance"):
        a.operator(PerPortCount)
    op = PerPortCount()
    a.operator(op, name="once")
    with pytest.raises(DataflowError, match="instance already runs step 'o.once'"):
        a.operator(op)


def test_the_removed_progress_option_is_refused_in_one_sentence():
    flow = Dataflow("g")
    a, b = flow.source("a", REC), flow.source("b", REC)
    a.union(b).sink(sinks.Collect())
    ins = {"a": records([1], [1]), "b": records([2], [2])}
    for executors in (1, 2):
        with pytest.raises(DataflowError, match="progress= was removed: every dataflow runs on pointstamp progress"):
            slashrt.run(flow, ins, executors=executors, progress="watermark")


def _advances(monkeypatch):
    """Count the source capability moves the pointstamp tracker is told of."""
    from slashrt.scheduler._pointstamp import PointstampProgress

    moves = []
    advance = PointstampProgress.advance

    async def counted(self, source, old, new):
        moves.append((old.epoch, new.epoch))
        await advance(self, source, old, new)

    monkeypatch.setattr(PointstampProgress, "advance", counted)
    return moves


def test_in_band_watermarks_move_the_capability_only_at_window_ends(monkeypatch):
    # a watermark in every slot (hundreds per window): the tracker, settled at each capability
    # move, would pay for each; only those reaching a window's end can fire anything
    moves = _advances(monkeypatch)
    events = ysb.generate(100_000, campaigns=20, events_per_ms=1)
    out = sinks.Collect()
    slashrt.run(ysb.dataflow(ysb.campaign_map(20), out), {"events": events},
                slot_size=4096, slots=8, watermark_every=1)
    got = ysb.to_result(out.records)
    assert np.array_equal(got, ysb.reference(events, ysb.campaign_map(20)))
    windows = len(np.unique(got["window_start_ms"]))
    assert windows >= 5
    assert len(moves) <= windows + 2, f"{len(moves)} capability moves for {windows} windows"


def test_a_sink_passing_watermarks_on_gets_every_in_band_watermark():
    class Forwarding(sinks.Collect):
        def __init__(self):
            super().__init__()
            self.watermarks = []

        async def awatermark(self, watermark):
            self.watermarks.append(watermark)

    flow = Dataflow("fw")
    events = flow.source("e", REC, time="t")
    out, forwarding = sinks.Collect(), Forwarding()
    events.window(Tumbling(ms=1_000)).count(key="k").sink(out)
    events.sink(forwarding, name="forward")
    n = 20_000
    slashrt.run(flow, {"e": records(np.arange(n) % 7, np.arange(n) // 4)},
                slot_size=256, slots=8, watermark_every=1)
    # five windows of 1 s (times 0-4999) and about 1,300 slots, each with a watermark after it
    assert len(forwarding.watermarks) > 100
    assert forwarding.watermarks == sorted(forwarding.watermarks)
    assert sum(out.records["count"]) == n


def test_nexmark_q7_equals_its_reference():
    bids = nexmark.generate(30_000, auctions=100)
    out = sinks.Collect()
    slashrt.run(nexmark.dataflow(out), {"bids": bids}, slot_size=4096, slots=8)
    assert np.array_equal(nexmark.to_result(out.records), nexmark.reference(bids))


def test_windows_after_a_union_fire_on_the_least_watermark():
    flow = Dataflow("w")
    a, b = flow.source("a", REC, time="t"), flow.source("b", REC, time="t")
    out = sinks.Collect()
    a.union(b).window(Tumbling(ms=10)).count(key="k", name="win").sink(out)
    # b lags far behind a: a window of b's records is complete only once b passed it
    ta, tb = np.arange(0, 100), np.arange(0, 100) // 10
    result = slashrt.run(flow, {"a": records(np.zeros(100), ta), "b": records(np.ones(100), tb)}, slot_size=64, slots=4)
    got = {(r["window_start"], r["k"]): r["count"] for r in out.records}
    assert got[(0, 1)] == 100 and all(got[(s, 0)] == 10 for s in range(0, 100, 10))
    assert result.late_records == {"w.win": 0}
    assert result.frontiers["w.win.in0"] == []


def test_an_operator_after_a_window_takes_the_windows_times_and_the_source_is_not_cut():
    """A window's results are at their window's end, so a per-time operator after it needs no
    cut at the source: the steps before the window see whole batches, the operator one batch
    per window end, each notified after its last batch."""
    calls = []

    def seen(batch):
        calls.append(len(batch))
        return batch

    flow = Dataflow("after")
    op, out = TimeLog("window_end"), sinks.Collect()
    flow.source("a", REC, time="t").apply(seen).window(Tumbling(ms=10)).count(key="k", name="win").operator(
        op, name="op"
    ).sink(out)
    times = np.arange(1000) // 2
    slashrt.run(flow, {"a": records(np.arange(1000) % 3, times)}, slot_size=4096, slots=8)
    assert sum(calls) == 1000 and len(calls) < 100  # not one piece per watermark change (500)
    batches = [(t, ends) for what, t, ends in op.log if what == "batch"]
    assert all(set(ends) == {t.epoch} for t, ends in batches)
    assert sorted(t.epoch for t, _ in batches) == list(range(10, 501, 10))
    op.check_never_early()
    assert len(out.records) == 150 and out.records["count"].sum() == 1000


def test_report_shows_frontiers_and_what_holds_them():
    import json

    import trio
    import trio.testing

    from slashrt._runtime import run_async

    released = trio.Event()
    reports = []

    class Hold(Operator):
        async def on_batch(self, ctx, port, batch):
            ctx.notify_at(Timestamp(ctx.time.epoch + 1000))
            await released.wait()  # the run stands still here until a report was seen
            await ctx.emit(batch)

    def on_report(report):
        reports.append(report)
        released.set()

    flow = Dataflow("r")
    a = flow.source("a", REC, time="t")
    a.operator(Hold(), name="hold").sink(sinks.Collect(), name="out")

    async def main():
        return await run_async(flow, {"a": records(range(20), range(20))}, on_report=on_report, report_every=0.01)

    result = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert result.frontiers == {"r.hold.in0": [], "r.out.in0": []}
    report = reports[0]
    json.dumps(report)
    assert set(report["frontiers"]) == {"r.hold.in0", "r.out.in0"}
    held = {(p["at"], p["what"]) for p in report["pointstamps"]}
    assert ("r.a.out0", "capability of source r.a (its watermark)") in held
    assert ("r.hold.out0", "notification requested by r.hold") in held
    assert report["frontiers"]["r.out.in0"] == [[0]]
    # what holds each frontier back: the source's capability; the notification lies above it
    assert {h["what"] for h in report["holding"]["r.out.in0"]} == {"capability of source r.a (its watermark)"}


def test_frontier_changes_are_logged_at_debug_level(capsys):
    flow = Dataflow("lg")
    a, b = flow.source("a", REC, time="t"), flow.source("b", REC, time="t")
    a.union(b, name="both").sink(sinks.Collect(), name="out")
    slashrt.configure_logging("debug")
    try:
        slashrt.run(flow, {"a": records([1], [5]), "b": records([2], [7])})
    finally:
        slashrt.configure_logging("warning")
    err = capsys.readouterr().err
    assert "frontier moved" in err and "lg.both" in err


class NotifyEach(Operator):
    """Asks to be notified at each batch's time, and passes the batch on."""

    async def on_batch(self, ctx, port, batch):
        ctx.notify_at(ctx.time)
        await ctx.emit(batch)


IDLE = "idle, frontiers held"


@pytest.mark.parametrize("level", ["debug", "warning"])
async def test_an_idle_executor_logs_what_holds_each_open_frontier_at_debug_level_only(level):
    """The source's input comes from a channel the test writes: once what was sent is done
    the executor has nothing to do and parks (deterministic: every task is blocked then)."""
    from slashrt._runtime import run_async
    from slashrt.transport import RingSpec, open_inproc_channel

    flow = Dataflow("idle")
    flow.source("a", REC, time="t").operator(NotifyEach(), name="note").sink(sinks.Collect(), name="out")
    tx, rx = open_inproc_channel(RingSpec(slots=4, slot_size=256, record_size=REC.itemsize))
    slashrt.configure_logging(level)
    try:
        with structlog.testing.capture_logs() as logs:
            done = []

            async def run():
                done.append(await run_async(flow, {"a": rx}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
                await tx.send_control(Control.WATERMARK, 3)  # the batches after it are at time 3
                await tx.send_records(records(range(40), [3] * 40))
                await trio.testing.wait_all_tasks_blocked()
                parked = [e for e in logs if e["event"] == IDLE]
                await tx.aclose()
    finally:
        slashrt.configure_logging("warning")
    assert all(f == [] for f in done[0].frontiers.values()) and len(done[0].outputs["idle.out"]) == 40
    if level == "warning":
        assert parked == [] and not any(e["event"] == IDLE for e in logs)  # not even computed
        return
    source = {"at": "idle.a.out0", "time": [3], "what": "capability of source idle.a (its watermark)"}
    note = {"at": "idle.note.out0", "time": [3], "what": "notification requested by idle.note"}
    # the last line before the end: each input's frontier at the watermark, and what holds it
    assert parked[-1]["executor"] == 0 and parked[-1]["log_level"] == "debug"
    assert parked[-1]["inputs"] == {
        "idle.note.in0": {"frontier": [[3]], "held_by": [source]},
        "idle.out.in0": {"frontier": [[3]], "held_by": [source, note]},
    }
    assert all(e["inputs"] != f["inputs"] for e, f in zip(parked, parked[1:]))  # once per change
    assert not any(e["event"] == IDLE for e in logs[logs.index(parked[-1]) + 1:])  # the end holds nothing


def test_a_stream_unioned_with_itself_arrives_twice_and_async_connect_functions_work():
    flow = Dataflow("self")
    a = flow.source("a", REC, time="t")
    out, both = sinks.Collect(), sinks.Collect()
    a.union(a).sink(out, name="twice")

    async def first_port_only(batch, port):
        return batch if port == 0 else None

    a.connect(a.filter(lambda b: b["k"] > 1)).apply(first_port_only).sink(both, name="zero")
    slashrt.run(flow, {"a": records([1, 2, 3], [0, 1, 2])})
    assert sorted(out.records["k"].tolist()) == [1, 1, 2, 2, 3, 3]
    assert sorted(both.records["k"].tolist()) == [1, 2, 3]


def test_exchange_is_refused_on_a_wide_key_and_untyped_columns_on_clusters():
    flow = Dataflow("x")
    a = flow.source("a", np.dtype([("f", "<f8"), ("k", "<i8"), ("t", "<i8"), ("w", "S16")]), time="t")
    with pytest.raises(SchemaError, match=r"exchange\(key='w'\): column 'w' is \|S16, 16 bytes wide: a key is at most 8"):
        a.exchange(key="w")
    with pytest.raises(SchemaError, match=r"exchange\(key=...\): unknown column 'nope'"):
        a.exchange(key="nope")
    a.with_column("g", lambda b: b["k"] * 2).exchange(key="k").sink(sinks.Collect())
    ins = {"a": np.zeros(3, np.dtype([("f", "<f8"), ("k", "<i8"), ("t", "<i8"), ("w", "S16")]))}
    assert len(slashrt.run(flow, ins).outputs) == 1  # one executor: a pass-through
    with pytest.raises(DataflowError, match=r"exchange steps \['x.exchange_\d+'\] ship records between executors.*schema="):
        slashrt.run(flow, ins, executors=2)


def test_a_report_file_shows_where_a_run_stands_and_the_cli_reads_it(tmp_path, capsys):
    import json

    import trio
    import trio.testing

    from slashrt._runtime import run_async
    from slashrt.cli import main

    path = tmp_path / "job.json"
    seen = []

    class Hold(Operator):
        async def on_batch(self, ctx, port, batch):
            ctx.notify_at(Timestamp(ctx.time.epoch + 1000))
            while not path.exists():  # the run stands still here until a report was written
                await trio.sleep(0.01)
            seen.append(json.loads(path.read_text()))
            await ctx.emit(batch)

    flow = Dataflow("rf")
    flow.source("a", REC, time="t").operator(Hold(), name="hold").sink(sinks.Collect(), name="out")

    async def main_():
        return await run_async(flow, {"a": records(range(20), range(20))}, on_report=str(path), report_every=0.05)

    trio.run(main_, clock=trio.testing.MockClock(autojump_threshold=0))
    running = seen[0]
    assert running["state"] == "running" and running["flow"] == "rf"
    assert {h["what"] for h in running["holding"]["rf.out.in0"]} == {"capability of source rf.a (its watermark)"}
    assert main(["frontiers", str(path), "--json"]) == 0
    final = json.loads(capsys.readouterr().out)
    assert final["state"] == "finished" and all(f == [] for f in final["frontiers"].values())
    path.write_text(json.dumps(running))
    assert main(["frontiers", str(path)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == "flow rf: running"
    assert "held by capability of source rf.a (its watermark) at rf.a.out0 (0)" in text


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "no such report"), ("{", "not a progress report (JSONDecodeError"), ('{"flow": 1}', "it needs the keys")],
)
def test_frontiers_refuses_a_missing_or_foreign_report_in_one_line(tmp_path, capsys, content, message):
    from slashrt.cli import main

    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    assert main(["frontiers", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err


def test_a_report_file_in_a_missing_directory_is_refused_before_the_run(tmp_path):
    class Pass(Operator):
        async def on_batch(self, ctx, port, batch):
            await ctx.emit(batch)

    flow = Dataflow("rm")
    flow.source("a", REC, time="t").operator(Pass(), name="op").sink(sinks.Collect(), name="out")
    with pytest.raises(SlashError, match="directory .* does not exist"):
        slashrt.run(flow, {"a": records(range(3), range(3))}, on_report=str(tmp_path / "no" / "r.json"))


def test_bench_graph_ops_times_connect_apply_beside_union_and_checks_both(capsys):
    from slashrt.bench import graph_ops

    assert graph_ops.main(["--records", "500", "--same-time", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["records_per_source"] == 500 and result["records_per_event_time"] == 3
    assert result["correct"] is True
    assert result["union_seconds"] > 0 and result["connect_apply_seconds"] > 0
    assert graph_ops.main(["--records", "50"]) == 0
    assert "connect_over_union" in capsys.readouterr().out
    for bad in (["--records", "0"], ["--same-time", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            graph_ops.main(bad)
        assert exit_info.value.code == 2
        assert "must be at least 1" in capsys.readouterr().err
