"""The Spark side of ingestion: push a DataFrame into a running slashrt dataflow, exactly once.

    report = ingest(df, target, {"ts": "event_time"}, secret=secret)

1. On the driver: map the DataFrame's columns onto the target source's fields
   (`plan_columns`: missing columns and wrong types fail here, at once) and, when the data can
   still be wrong (nullable columns, strings, narrowing integers), check it in one Spark
   aggregation, so bad input fails before anything is sent.
2. On the executors: `mapInArrow` runs one task per partition; each task attempt connects to
   the ingest endpoint over an authenticated channel (verbs where the endpoint offers it and
   the task's host has an RDMA device, else TCP; `transport=` narrows the choice), converts its Arrow batches into
   packed records (vectorised, `ArrowConverter`), streams them in full slots, announces the
   end (`INGEST_PREPARE`), waits until the endpoint has taken everything, and returns one row:
   (ingest id, partition, attempt, rows, bytes, buffers, first and last sequence number).
3. On the driver: the job's rows name the one successful attempt of every partition; the
   driver commits exactly those (`INGEST_COMMIT`), and the endpoint forwards them to the
   dataflow and drops every other attempt. If the job fails, the ingest is aborted and nothing
   of it is counted.

The cluster secret travels inside the UDF (Spark ships it to the executors with the task);
on a cluster whose RPC is not encrypted (`spark.network.crypto.enabled`), pass `secret=None`
and give the executors `SLASHRT_SECRET_FILE` instead.
"""

from __future__ import annotations

import secrets as _secrets
import time

import attrs
import numpy as np
import pyarrow as pa
import structlog
import trio

from slashrt._buffer import Control
from slashrt.errors import ChannelClosed, unwrap_groups
from slashrt.spark._convert import ArrowConverter
from slashrt.spark._endpoint import IngestError
from slashrt.spark._mapping import ColumnPlan, IngestSchemaError, plan_columns
from slashrt.spark._protocol import IngestTarget, check_transport, ingest_id_for, send_message, verbs_unavailable
from slashrt.transport._auth import load_secret
from slashrt.transport._registry import open_channels

__all__ = ["ingest", "IngestReport", "finish", "stream_writer", "check_data", "RESULT_FIELDS"]

log = structlog.get_logger("slashrt.spark.ingest")

RESULT_FIELDS = [
    ("ingest_id", pa.int64()),
    ("partition", pa.int64()),
    ("attempt", pa.int64()),  # Spark's task attempt id (unique in the application)
    ("attempt_number", pa.int64()),  # 0 for the first attempt of the partition, 1 for its retry, ...
    ("rows", pa.int64()),
    ("bytes", pa.int64()),
    ("buffers", pa.int64()),
    ("first_seq", pa.int64()),  # sequence number of the partition stream's first data buffer
    ("last_seq", pa.int64()),  # ... and of its last (first_seq - 1 when there was no data)
    ("seconds", pa.float64()),  # the task's time inside the UDF
    ("wait_seconds", pa.float64()),  # ... of it waiting for Spark's next Arrow batch (upstream steps)
    ("convert_seconds", pa.float64()),  # ... converting Arrow batches to records (the rest: sending)
    ("verbs", pa.int64()),  # 1: the partition travelled over verbs (RDMA WRITEs), 0: over TCP
]
RESULT_ARROW = pa.schema(RESULT_FIELDS)
RESULT_DDL = ", ".join(f"{name} {'double' if typ == pa.float64() else 'long'}" for name, typ in RESULT_FIELDS)


@attrs.frozen
class IngestReport:
    """What one ingest delivered, from the Spark job's own result (one row per partition)."""

    ingest_id: int
    rows: int
    bytes: int
    partitions: list[dict]  # the job's rows, by partition
    seconds: float  # wall time of the whole ingest (check, job, commit)
    job_seconds: float  # the Spark job (generation, conversion, transfer)
    commit_seconds: float

    @property
    def verbs_partitions(self) -> list[int]:
        """The partitions that travelled over verbs (the rest went over TCP)."""
        return [p["partition"] for p in self.partitions if p["verbs"]]

    def task_seconds(self, what: str = "seconds") -> float:
        """Summed over the partitions' tasks: "seconds" in the UDF, "wait_seconds" of them waiting
        for Spark's batches, "convert_seconds" converting (the rest went into sending)."""
        return float(sum(p[what] for p in self.partitions))

    @property
    def retried_partitions(self) -> list[int]:
        return [p["partition"] for p in self.partitions if p["attempt_number"] > 0]


class _SlotWriter:
    """Fills the channel's slots with whole records, a slot at a time, posting only full slots
    (and the last, partial one at `flush`)."""

    def __init__(self, sender, record_size: int):
        self.sender = sender
        self.size = record_size
        self.per_slot = sender.spec.payload_capacity // record_size
        self.slot = None
        self.filled = 0
        self.rows = self.buffers = 0
        self.first_seq = None
        self.last_seq = None

    async def write(self, block: np.ndarray) -> None:
        raw = block.view(np.uint8).reshape(-1)
        size, per_slot, sender = self.size, self.per_slot, self.sender
        n, i = len(block), 0
        while i < n:
            if self.slot is None:
                if sender.credits() <= 0:
                    await sender.wait_credit()
                self.slot = sender.reserve()
                self.filled = 0
            take = min(per_slot - self.filled, n - i)
            self.slot[self.filled * size : (self.filled + take) * size] = raw[i * size : (i + take) * size]
            self.filled += take
            i += take
            if self.filled == per_slot:
                self._post()

    def _post(self) -> None:
        seq = self.sender.posted
        self.sender.post(nbytes=self.filled * self.size, count=self.filled)
        self.first_seq = seq if self.first_seq is None else self.first_seq
        self.last_seq = seq
        self.rows += self.filled
        self.buffers += 1
        self.slot = None

    def flush(self) -> None:
        if self.slot is not None and self.filled:
            self._post()


class _PartitionPusher:
    """The mapInArrow UDF: one task attempt's partition into the endpoint; yields its report."""

    def __init__(self, targets, plan: ColumnPlan, ingest_id: int, secret: bytes | None, transport: str = "auto", fault=None):
        self.targets = _targets(targets)  # partition p goes to targets[p mod len(targets)]
        self.plan, self.ingest_id, self.secret, self.fault = plan, ingest_id, secret, fault
        self.transport = transport

    def __call__(self, batches):
        from pyspark import TaskContext

        tc = TaskContext.get()
        partition, attempt, number = tc.partitionId(), tc.taskAttemptId(), tc.attemptNumber()
        started = time.perf_counter()
        report = trio.run(self._push, iter(batches), partition, attempt, number)
        report["seconds"] = time.perf_counter() - started
        yield pa.RecordBatch.from_pylist([report], schema=RESULT_ARROW)

    async def _push(self, batches, partition: int, attempt: int, number: int) -> dict:
        target = self.targets[partition % len(self.targets)]
        secret = self.secret if self.secret is not None else load_secret()
        converter = ArrowConverter(self.plan)
        medium, address = self._medium(target, partition)
        complete = False
        waited = converting = 0.0
        clock = time.perf_counter
        async with open_channels() as channels:
            sender = await channels.connect(medium, address, target.spec, secret)
            writer = _SlotWriter(sender, self.plan.schema.record_size)
            try:
                await send_message(sender, Control.INGEST_OPEN, self.ingest_id, attempt, partition)
                while True:
                    t0 = clock()
                    batch = next(batches, None)
                    t1 = clock()
                    waited += t1 - t0
                    if batch is None:
                        break
                    blocks = converter.convert(batch)  # views of one staging array: write each at once
                    while True:
                        t1 = clock()
                        block = next(blocks, None)
                        converting += clock() - t1
                        if block is None:
                            break
                        await writer.write(block)
                    if self.fault is not None:
                        self.fault(partition, number, writer.rows + writer.filled)
                writer.flush()
                await send_message(sender, Control.INGEST_PREPARE, writer.rows, writer.buffers)
                # every slot handed back: the endpoint has staged the whole partition
                await sender.wait_credit(target.spec.slots)
                complete = True
            finally:
                # END_OF_STREAM: after INGEST_PREPARE the normal end; before it, an abort
                with trio.CancelScope(shield=True), trio.move_on_after(10):
                    try:
                        await sender.aclose()
                    except ChannelClosed as exc:
                        if complete:
                            log.debug("ingest channel closed after the partition was staged", reason=str(exc))
        first = writer.first_seq if writer.first_seq is not None else 1
        return {
            "ingest_id": self.ingest_id,
            "partition": partition,
            "attempt": attempt,
            "attempt_number": number,
            "rows": writer.rows,
            "bytes": writer.rows * writer.size,
            "buffers": writer.buffers,
            "first_seq": first,
            "last_seq": writer.last_seq if writer.last_seq is not None else first - 1,
            "wait_seconds": waited,
            "convert_seconds": converting,
            "verbs": int(medium == "verbs"),
        }

    def _medium(self, target: IngestTarget, partition: int) -> tuple[str, tuple[str, int]]:
        """Verbs where the endpoint offers it and this host can, else TCP (or fail, when the
        caller insisted on verbs)."""
        if self.transport == "tcp" or (self.transport == "auto" and target.verbs_address is None):
            return "tcp", target.address
        why_not = "the endpoint offers no verbs listener" if target.verbs_address is None else verbs_unavailable()
        if why_not is None:
            return "verbs", target.verbs_address
        if self.transport == "verbs":
            raise IngestError(f"partition {partition}: verbs asked for, but {why_not}")
        log.info("ingest over tcp: no verbs on this host", partition=partition, reason=why_not)
        return "tcp", target.address


def check_data(df, plan: ColumnPlan) -> None:
    """Evaluate the checks only the data can answer (nulls, string lengths, integer ranges) in
    one Spark aggregation; raise IngestSchemaError listing every violation."""
    from pyspark.sql import functions as F

    checks = plan.data_checks()
    if not checks:
        return
    exprs = []
    for i, (what, f) in enumerate(checks):
        col = F.col(f.column)
        if what == "nulls":
            exprs.append(F.sum(col.isNull().cast("long")).alias(f"c{i}"))
        elif what == "length":
            exprs.append(F.max(F.octet_length(col)).alias(f"c{i}"))
        else:
            exprs += [F.min(col).alias(f"c{i}"), F.max(col).alias(f"c{i}_max")]
    row = df.agg(*exprs).first().asDict()
    problems = []
    for i, (what, f) in enumerate(checks):
        value = row[f"c{i}"]
        if what == "nulls" and value:
            problems.append(
                f"{f.describe()}: {value} null(s), and slashrt fields hold no nulls "
                f"(give fill_nulls={{{f.field!r}: VALUE}} to replace them)"
            )
        elif what == "length" and value is not None and value > f.width:
            problems.append(f"{f.describe()}: values up to {value} bytes long, longer than the field's {f.width}")
        elif what == "range" and value is not None:
            top = row[f"c{i}_max"]
            if value < f.range[0] or top > f.range[1]:
                problems.append(f"{f.describe()}: values from {value} to {top} do not fit (the field holds {f.range[0]}..{f.range[1]})")
    if problems:
        raise IngestSchemaError(f"the DataFrame does not fit source {plan.source!r}; nothing was sent: " + "; ".join(problems))


def _targets(target) -> list[IngestTarget]:
    """One target, or several endpoints of the same source (one per executor of a cluster)."""
    targets = [target] if isinstance(target, IngestTarget) else list(target)
    if not targets:
        raise ValueError("no ingest target given")
    if any(t.fields != targets[0].fields for t in targets):
        raise ValueError("the ingest targets have different record layouts: they must feed the same source")
    return targets


async def _driver_send_all(targets: list[IngestTarget], secret: bytes, messages: list) -> None:
    """`messages[i]` to `targets[i]`, all at once (empty lists skipped)."""
    async with unwrap_groups(), trio.open_nursery() as nursery:
        for target, batch in zip(targets, messages):
            if batch:
                nursery.start_soon(_driver_send, target, secret, batch)


async def _driver_send(target: IngestTarget, secret: bytes, messages) -> None:
    """Send driver messages on one connection and wait until the endpoint has handled them all."""
    async with open_channels() as channels:
        sender = await channels.connect("tcp", target.address, target.spec, secret)
        try:
            for ctype, value, aux, pad in messages:
                await send_message(sender, ctype, value, aux, pad)
            await sender.wait_credit(target.spec.slots)
        except ChannelClosed as exc:
            raise IngestError(
                f"the ingest endpoint at {target.address[0]}:{target.address[1]} refused the commit "
                f"(its log says why): {exc}"
            ) from None
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                try:
                    await sender.aclose()
                except ChannelClosed:
                    pass


def _secret(secret: bytes | None) -> bytes:
    return secret if secret is not None else load_secret()


def ingest(
    df,
    target: IngestTarget | list[IngestTarget],
    columns: dict[str, str] | None = None,
    *,
    secret: bytes | None = None,
    defaults: dict | None = None,
    fill_nulls: dict | None = None,
    ingest_id: int | None = None,
    name: str | None = None,
    check: str = "driver",
    end: bool = False,
    transport: str = "auto",
    _fault=None,
) -> IngestReport:
    """Push every row of `df` into the target source once; return what was delivered.

    `target` may also be a list of targets of one source (e.g. one endpoint per executor of a
    cluster, `IngestCluster.targets()`): partition p goes to target p mod len(targets), each
    endpoint commits its own partitions, and `end` ends every endpoint's stream.

    `columns` maps DataFrame column -> source field (unnamed fields take the column of the same
    name); `defaults` fills fields no column fills; `fill_nulls` replaces nulls. `check`:
    "driver" (default) checks nulls, string lengths and integer ranges in one Spark aggregation
    before sending (skipped when the schema alone rules them out); "tasks" leaves those checks
    to the tasks (an extra pass over `df` saved; a violation then fails the job, and nothing of
    the ingest is counted). The ingest id is `ingest_id`, else derived from `name` (the same
    name is recognised as a duplicate), else random. `end=True` ends the source's stream after
    this ingest (the dataflow's windows all fire). `transport`: "auto" (default) sends a
    partition over verbs where its endpoint offers a verbs listener and the task's host has an
    RDMA device, else over TCP; "tcp" or "verbs" insist on one (a task that cannot use verbs
    then fails, and nothing of the ingest is counted); the report says which partitions went
    over verbs. The driver's commit always travels over TCP. The secret defaults to
    $SLASHRT_SECRET."""
    from pyspark.sql import functions as F

    started = time.perf_counter()
    if check not in ("driver", "tasks"):
        raise ValueError(f"check must be 'driver' or 'tasks', got {check!r}")
    check_transport(transport)
    secret = _secret(secret)
    targets = _targets(target)
    if transport == "verbs" and any(t.verbs_address is None for t in targets):
        raise IngestError(
            "verbs asked for, but the ingest endpoints at "
            + ", ".join(f"{t.address[0]}:{t.address[1]}" for t in targets if t.verbs_address is None)
            + " offer no verbs listener (no RDMA device on their host, or opened with transport='tcp'); nothing was sent"
        )
    target = targets[0]
    plan = plan_columns(df.schema, target.schema, columns, defaults=defaults, fill_nulls=fill_nulls, source=target.source)
    if check == "driver":
        check_data(df, plan)
    if ingest_id is None:
        ingest_id = ingest_id_for(name) if name is not None else _secrets.randbits(62)
    selected = df.select(*[F.col(f.column).alias(f"_c{i}") for i, f in enumerate(plan.columns)])
    pushed = selected.mapInArrow(_PartitionPusher(targets, plan, ingest_id, secret, transport, _fault), RESULT_DDL)
    expected = pushed.rdd.getNumPartitions()
    job_started = time.perf_counter()
    try:
        rows = [r.asDict() for r in pushed.collect()]
    except BaseException:
        _abort(targets, secret, ingest_id)
        raise
    job_seconds = time.perf_counter() - job_started
    rows.sort(key=lambda r: r["partition"])
    seen = [r["partition"] for r in rows]
    if seen != list(range(expected)):
        _abort(targets, secret, ingest_id)
        raise IngestError(f"ingest {ingest_id:x}: the job reported partitions {seen}, expected 0..{expected - 1} once each")
    messages = []
    for k in range(len(targets)):
        mine = [r for r in rows if r["partition"] % len(targets) == k]
        batch = [(Control.INGEST_PICK, r["attempt"], r["rows"], r["partition"]) for r in mine]
        batch.append((Control.INGEST_COMMIT, ingest_id, len(mine), 0))
        if end:
            batch.append((Control.INGEST_END, 0, 0, 0))
        messages.append(batch)
    commit_started = time.perf_counter()
    trio.run(_driver_send_all, targets, secret, messages)
    finished = time.perf_counter()
    report = IngestReport(
        ingest_id, sum(r["rows"] for r in rows), sum(r["bytes"] for r in rows), rows,
        finished - started, job_seconds, finished - commit_started,
    )
    log.info("ingest committed", ingest=f"{ingest_id:x}", rows=report.rows, partitions=len(rows),
             retried=report.retried_partitions, seconds=round(report.seconds, 3))
    return report


def _abort(targets: list[IngestTarget], secret: bytes, ingest_id: int) -> None:
    try:
        trio.run(_driver_send_all, targets, secret, [[(Control.INGEST_ABORT, ingest_id, 0, 0)]] * len(targets))
    except Exception as exc:  # the original failure matters more
        log.warning("could not abort the ingest", ingest=f"{ingest_id:x}", reason=str(exc))


def finish(target: IngestTarget | list[IngestTarget], *, secret: bytes | None = None) -> None:
    """End the source's stream after everything committed (its windows all fire); with a list
    of targets, every endpoint's."""
    targets = _targets(target)
    trio.run(_driver_send_all, targets, _secret(secret), [[(Control.INGEST_END, 0, 0, 0)]] * len(targets))


def stream_writer(target: IngestTarget | list[IngestTarget], columns: dict[str, str] | None = None, *, name: str, **options):
    """A `writeStream.foreachBatch` function that ingests each micro-batch exactly once.

        query = sdf.writeStream.foreachBatch(stream_writer(target, name="clicks", secret=s)).start()

    Each batch's ingest id comes from (`name`, batch id): a batch Spark replays after a restart
    is recognised by the endpoint and not counted twice. Every committed batch advances the
    source's watermark to its largest event time minus the source's `max_delay`. Call
    `finish(target)` after the query stops to end the dataflow's stream."""
    reports: list[IngestReport] = []

    def write(batch_df, batch_id: int) -> None:
        reports.append(ingest(batch_df, target, columns, ingest_id=ingest_id_for(name, batch_id), **options))

    write.reports = reports
    return write
