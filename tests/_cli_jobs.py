"""Jobs for `slashrt run` in tests/test_cli_run.py: `slashrt run tests/_cli_jobs.py:NAME`.

`counts` (also `job`, the default name, and `PAIR`, the object form): a tumbling-window count
per key over generated records into a Collect sink; the others are the mistakes a user makes."""

import sys

import numpy as np

import slashrt
from slashrt import Dataflow, Schema, Tumbling, sinks

SCHEMA = Schema({"t": "i8", "k": "i8"})
EVENTS = 50_000
KEYS = 7
WINDOW_MS = 100


def records() -> np.ndarray:
    out = np.zeros(EVENTS, SCHEMA.dtype)
    out["t"] = np.arange(EVENTS, dtype=np.int64) * 2_000 // EVENTS  # 2 s of event time: 20 windows
    out["k"] = np.random.default_rng(3).integers(0, KEYS, EVENTS)
    return out


def expected_rows() -> int:
    """Rows the count gives: one per (window, key) that has records."""
    r = records()
    return len(np.unique(r["t"] // WINDOW_MS * KEYS + r["k"]))


def counts(source: str = "events"):
    flow = Dataflow("counts")
    flow.source(source, SCHEMA, time="t").window(Tumbling(ms=WINDOW_MS)).count(key="k").sink(sinks.Collect(), name="out")
    return flow, {source: records()}


def paced_counts():
    """`counts` with its records released at 100,000 per second (`slashrt.Paced`): the summary
    reports the sink's latency."""
    flow, inputs = counts()
    return flow, {"events": slashrt.Paced(lambda index, executors: records()[index::executors], rate=100_000)}


def csv_counts():
    """`counts` into a transactional CSV directory ($CLI_JOBS_OUT) whose executors carry the
    chaos bench's kill hooks (`slashrt.bench.chaos`): what `--restart` recovers. Until every
    planned kill fired (its marker in $SLASHRT_CHAOS_DIR) each batch takes 4 ms more, so that
    however fast the machine the job cannot end before them (a run at full speed completes only
    2-3 checkpoints, the last one at the end)."""
    import os

    from slashrt.bench.chaos import KILLS_ENV, MARKS_ENV, ChaosCsv

    from tests.snapshot._paced import until_fired

    flow = Dataflow("csv-counts")
    events = flow.source("events", SCHEMA, time="t")
    if os.environ.get(KILLS_ENV):
        events = events.filter(until_fired(os.environ[MARKS_ENV], os.environ[KILLS_ENV]), name="paced")
    events.window(Tumbling(ms=WINDOW_MS)).count(key="k").sink(
        ChaosCsv(os.environ["CLI_JOBS_OUT"], transactional=True), name="out")
    return flow, {"events": records()}


class Numbered(slashrt.Operator):
    """Each record with how many records its executor had seen up to it (state a restart must
    restore exactly)."""

    def __init__(self):
        self.seen = 0

    async def on_batch(self, ctx, port, batch):
        out = np.zeros(len(batch), [("t", "i8"), ("k", "i8"), ("seen", "i8")])
        out["t"], out["k"], out["seen"] = batch["t"], batch["k"], self.seen + np.arange(1, len(batch) + 1)
        self.seen += len(batch)
        await ctx.emit(out)

    def snapshot(self):
        return slashrt.State({}, {"seen": self.seen})

    def restore(self, state):
        self.seen = state.meta["seen"]


def numbered():
    """Every record numbered on its executor into a transactional Collect whose executors carry
    the chaos bench's kill hooks: executors that exchange nothing, what `--failover region`
    restarts alone. Until every planned kill fired each batch takes 10 ms more."""
    import os

    from slashrt.bench.chaos import KILLS_ENV, MARKS_ENV, ChaosCollect

    from tests.snapshot._paced import Paced

    flow = Dataflow("numbered")
    events = flow.source("events", SCHEMA, time="t")
    if os.environ.get(KILLS_ENV):
        events = events.filter(Paced(seconds=0.01, until=(os.environ[MARKS_ENV], 1)), name="paced")
    events.operator(Numbered(), schema={"t": "i8", "k": "i8", "seen": "i8"}).sink(
        ChaosCollect(transactional=True), name="out")
    return flow, {"events": records()}


def collect_counts():
    """`counts` into a transactional Collect whose executors carry the chaos bench's kill hooks:
    what `--restart` recovers for in-memory sinks."""
    from slashrt.bench.chaos import ChaosCollect

    flow = Dataflow("collect-counts")
    flow.source("events", SCHEMA, time="t").window(Tumbling(ms=WINDOW_MS)).count(key="k").sink(
        ChaosCollect(transactional=True), name="out")
    return flow, {"events": records()}


def slow_counts():
    """`counts` behind a step taking 1 ms per 30 records (a 512-byte slot's worth, about 1.7 s in
    all): small rings stay full, so a checkpoint taken unaligned at once (`--alignment-timeout 0`)
    holds records in flight."""
    import time

    _, inputs = counts()
    flow = Dataflow("slow-counts")

    def slow(batch):
        time.sleep(0.001 * -(-len(batch) // 30))
        return np.ones(len(batch), bool)

    flow.source("events", SCHEMA, time="t").filter(slow, name="slow").window(Tumbling(ms=WINDOW_MS)).count(
        key="k").sink(sinks.Collect(), name="out")
    return flow, inputs


job = counts
PAIR = counts()


def other_dataflow():
    """A dataflow of the same name whose source is another one: a checkpoint of `counts` is not its."""
    return counts("clicks")


def not_a_job():
    return 42


def needs_an_argument(n):
    return counts()


def broken():
    raise ValueError("no data today")


def paused():
    """`counts` that pauses at its first batch: prints "at batch", waits for a line on stdin."""
    _, inputs = counts()
    flow = Dataflow("paused")
    seen = []

    def pause(batch):
        if not seen:
            seen.append(True)
            print("at batch", flush=True)
            sys.stdin.readline()
        return np.ones(len(batch), bool)

    flow.source("events", SCHEMA, time="t").filter(pause).window(Tumbling(ms=WINDOW_MS)).count(key="k").sink(
        sinks.Collect(), name="out")
    return flow, inputs


def held_counts():
    """`counts` from chunks (`PerExecutor`), whose executor 1 (0 on one executor) makes its second
    chunk only once the report file $CLI_JOBS_REPORT names it as holding the window back; it
    keeps that report in $CLI_JOBS_REPORT.stuck (`slashrt run --report`)."""
    import functools
    import os

    from slashrt.cluster import PerExecutor

    flow, _ = counts()
    chunks = functools.partial(_held_chunks, os.environ["CLI_JOBS_REPORT"], HELD_WINDOW, "counts.events")
    return flow, {"events": PerExecutor(chunks)}


HELD_WINDOW = "counts.count_window_1.in0"


def held_union_counts():
    """`held_counts` with a union before the count: its source (its chunks, the executor that
    waits) and a second one."""
    import functools
    import os

    from slashrt.cluster import PerExecutor

    flow = Dataflow("ucounts")
    a, b = flow.source("events", SCHEMA, time="t"), flow.source("more", SCHEMA, time="t")
    a.union(b).window(Tumbling(ms=WINDOW_MS)).count(key="k", name="counts").sink(sinks.Collect(), name="out")
    chunks = functools.partial(_held_chunks, os.environ["CLI_JOBS_REPORT"], HELD_UNION_WINDOW, "ucounts.events")
    return flow, {"events": PerExecutor(chunks), "more": records()}


HELD_UNION_WINDOW = "ucounts.counts.in0"


def _held_chunks(report: str, window: str, source: str, index: int, executors: int):
    import json
    import time
    from pathlib import Path

    whole = records()
    first, rest = whole[: EVENTS // 2], whole[EVENTS // 2:]
    yield first
    if index == min(1, executors - 1):
        deadline, last = time.monotonic() + 60, int(first["t"].max())
        while True:
            try:
                stands = json.loads(Path(report).read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                stands = None
            if stands is not None and _held_by(stands, window, source, index, last):
                Path(report + ".stuck").write_text(json.dumps(stands))
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no report in {report} showed the window waiting for executor {index}")
            time.sleep(0.01)
    yield rest


def _held_by(report: dict, window: str, source: str, index: int, last: int) -> bool:
    """`window`'s frontier is inside the first chunk, held only by `source`'s capability, and
    the report names executor `index` (the waiting one) as its holder."""
    frontier, holds = report["frontiers"].get(window), report["holding"].get(window, [])
    return bool(frontier and holds) and 0 <= frontier[0][0] <= last and all(
        h["what"] == f"capability of source {source} (its watermark)" and h.get("held_by") == [index] for h in holds
    )


def union_window_counts():
    """A keyed window behind a union: on several executors on the state backend (`--mode
    slash`, the default) or routed by key (`--mode uppar`)."""
    flow = Dataflow("ucounts")
    a, b = flow.source("a", SCHEMA, time="t"), flow.source("b", SCHEMA, time="t")
    a.union(b).window(Tumbling(ms=WINDOW_MS)).count(key="k").sink(sinks.Collect(), name="out")
    return flow, {"a": records(), "b": records()}


def _poisoned(index: int, executors: int) -> np.ndarray:
    out = records()
    if index == 1:
        out["k"][EVENTS // 2:] = -1  # executor 1's second half: the records `_refuse` fails on
    return out


def _refuse(batch):
    if (batch["k"] < 0).any():
        raise ValueError("a negative key")
    return batch


def fails_on_one_executor():
    """`counts` on several executors whose step fails on executor 1 only, in the middle of its
    stream: the others lose their channels to it (echoes), the cause is executor 1's error."""
    from slashrt.cluster import PerExecutor

    flow = Dataflow("counts")
    (flow.source("events", SCHEMA, time="t").apply(_refuse, name="refuse").window(Tumbling(ms=WINDOW_MS))
     .count(key="k").sink(sinks.Collect(), name="out"))
    return flow, {"events": PerExecutor(_poisoned)}
