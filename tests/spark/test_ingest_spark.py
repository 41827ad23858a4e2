"""Real PySpark in local mode: DataFrames into a running dataflow, exactly once, bad input
refused before anything is sent, Structured Streaming batch after batch."""

import time

import numpy as np
import pyarrow as pa
import pytest

import slashrt
from slashrt import Schema
from slashrt.bench import ysb
from slashrt.spark import IngestError, IngestSchemaError, IngestServer, finish, ingest, stream_writer
from slashrt.spark import generators
from slashrt.spark._convert import ArrowConverter
from slashrt.spark._mapping import plan_columns

YSB_DEFAULTS = generators.STREAMS["ysb"].defaults


def ysb_flow(max_delay=0):
    sink = slashrt.sinks.Collect()
    return ysb.dataflow(ysb.campaign_map(100), sink, max_delay=max_delay), sink


def ysb_expected(n, start=0, seed=42, **params):
    return ysb.reference(generators.records("ysb", start, start + n, seed, campaigns=100, **params), ysb.campaign_map(100))


def test_a_generated_ysb_dataframe_arrives_exactly_and_the_job_says_what_it_delivered(spark):
    n = 120_000
    flow, sink = ysb_flow()
    df = generators.spark_stream(spark, "ysb", n, partitions=3, seed=42, campaigns=100)
    with IngestServer(flow) as server:
        report = ingest(df, server.target(), secret=server.secret, defaults=YSB_DEFAULTS, end=True)
        result = server.result(timeout=60)
        stats = server.endpoints["events"].stats
    assert np.array_equal(ysb.to_result(sink.records), ysb_expected(n))
    assert report.rows == n == result.records and report.bytes == n * ysb.YSB_SCHEMA.record_size
    assert [p["partition"] for p in report.partitions] == [0, 1, 2]
    assert sum(p["rows"] for p in report.partitions) == n
    per_slot = (64 * 1024 - 32) // 78
    for p in report.partitions:  # data buffers follow INGEST_OPEN (sequence 0), full but the last
        assert p["first_seq"] == 1 and p["last_seq"] == p["buffers"] == -(-p["rows"] // per_slot)
    assert (stats.partitions_committed, stats.rows_committed, stats.attempts_dropped) == (3, n, 0)


def test_tasks_failing_mid_partition_are_retried_and_counted_once(spark):
    """Partition 1's first attempt dies in a step *before* the ingest UDF, half-way through:
    the ingest UDF sees its input end cleanly and stages a partial partition, which must never
    count. Partition 2's first attempt dies inside the ingest UDF after sending part of its
    rows. Spark retries both (spark.task.maxFailures 4); the result is exact."""
    n = 60_000

    def fail_upstream(batches):
        from pyspark import TaskContext

        tc = TaskContext.get()
        for i, batch in enumerate(batches):
            if i == 3 and tc.partitionId() == 1 and tc.attemptNumber() == 0:
                raise RuntimeError("injected failure upstream of the ingest, mid-partition")
            yield batch

    def fail_in_ingest(partition, attempt_number, rows_sent):
        if partition == 2 and attempt_number == 0 and rows_sent >= 8000:
            raise RuntimeError("injected failure inside the ingest, mid-partition")

    flow, sink = ysb_flow()
    gen = generators.spark_stream(spark, "ysb", n, partitions=3, seed=5, campaigns=100)
    df = gen.mapInArrow(fail_upstream, gen.schema)
    with IngestServer(flow) as server:
        report = ingest(df, server.target(), secret=server.secret, defaults=YSB_DEFAULTS, check="tasks",
                        end=True, _fault=fail_in_ingest)
        server.result(timeout=60)
        stats = server.endpoints["events"].stats
    assert np.array_equal(ysb.to_result(sink.records), ysb_expected(n, seed=5))
    assert sorted(report.retried_partitions) == [1, 2] and report.rows == n
    assert stats.partitions_committed == 3 and stats.rows_committed == n
    # partition 2's first attempt broke off after sending rows (aborted); partition 1's first, if
    # Spark started its ingest before the failure, looked complete and was dropped: every opened
    # attempt that was not committed was aborted or dropped, none counted
    assert stats.attempts_opened in (4, 5) and stats.attempts_aborted >= 1
    assert stats.attempts_aborted + stats.attempts_dropped == stats.attempts_opened - 3


@pytest.mark.parametrize(
    "rows,spark_schema,columns,message",
    [
        ([(1, "a")], "t long, k string", None, "column 'k' has Spark type string, which cannot fill field 'k'"),
        ([(1, 2)], "t long, kk long", None, "no column for field 'k'"),
        ([(1, 2), (2, None)], "t long, k long", None, r"column 'k' \(long\) -> field 'k' \(int64\): 1 null"),
        ([(1, 2, "abcdefghi")], "t long, k long, name string", None, "values up to 9 bytes long, longer than the field's 8"),
        ([(1, 300, "x")], "t long, k long, name string", None, "values from 300 to 300 do not fit"),
    ],
)
def test_bad_input_is_refused_on_the_spark_side_before_anything_is_sent(spark, rows, spark_schema, columns, message):
    flow = slashrt.Dataflow("bad")
    fields = {"t": "i8", "k": "i8"} if "name" not in spark_schema else {"t": "i8", "k": "u1", "name": "S8"}
    flow.source("events", Schema(fields), time="t").sink(slashrt.sinks.Collect(), name="out")
    df = spark.createDataFrame(rows, spark_schema)
    with IngestServer(flow) as server:
        with pytest.raises(IngestSchemaError, match=message):
            ingest(df, server.target(), columns, secret=server.secret)
        assert server.endpoints["events"].stats.connections == 0  # nothing was sent


def test_insisting_on_verbs_where_the_endpoint_offers_none_sends_nothing(spark):
    flow = slashrt.Dataflow("tcp-only")
    flow.source("events", Schema({"t": "i8", "k": "i8"}), time="t").sink(slashrt.sinks.Collect(), name="out")
    df = spark.createDataFrame([(1, 2)], "t long, k long")
    with IngestServer(flow, transport="tcp") as server:
        assert server.target().verbs_address is None
        with pytest.raises(IngestError, match="verbs asked for, but the ingest endpoints at 127.0.0.1:[0-9]+ offer no verbs"):
            ingest(df, server.target(), secret=server.secret, transport="verbs")
        with pytest.raises(ValueError, match="unknown ingest transport 'ib'"):
            ingest(df, server.target(), secret=server.secret, transport="ib")
        assert server.endpoints["events"].stats.connections == 0


def test_structured_streaming_feeds_one_long_running_dataflow_batch_after_batch(spark, tmp_path):
    per_batch, batches = 20_000, 3
    params = {"events_per_ms": 1}  # 20 s of event time per batch: windows fire as batches commit
    for k in range(batches):
        generators.spark_stream(spark, "ysb", per_batch, partitions=2, start=k * per_batch, campaigns=100, **params) \
            .coalesce(1).write.mode("append").parquet(str(tmp_path / f"in{k}"))
    stream_df = (spark.readStream.schema(generators.STREAMS["ysb"].spark_schema())
                 .option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "in*")))
    parts = []  # appended to by the dataflow's thread (list.append is atomic)
    flow = ysb.dataflow(ysb.campaign_map(100), slashrt.sinks.Callback(lambda r: parts.append(r.copy())))
    fired_after_batch = []
    with IngestServer(flow) as server:
        target = server.target()
        writer = stream_writer(target, name="ysb-stream", secret=server.secret, defaults=YSB_DEFAULTS)

        def write(df, batch_id):
            before = sum(map(len, parts))
            writer(df, batch_id)
            deadline = time.monotonic() + 10
            while sum(map(len, parts)) == before and time.monotonic() < deadline:
                time.sleep(0.01)  # the committed batch's watermark fires windows in the dataflow
            fired_after_batch.append(sum(map(len, parts)))

        query = (stream_df.writeStream.foreachBatch(write).trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
        query.awaitTermination(120)
        # a batch replayed after a driver restart carries the same batch id: not counted again
        writer(spark.read.parquet(str(tmp_path / "in0")), 0)
        finish(target, secret=server.secret)
        server.result(timeout=60)
        stats = server.endpoints["events"].stats
    assert np.array_equal(ysb.to_result(np.concatenate(parts)), ysb_expected(per_batch * batches, **params))
    assert len(writer.reports) == batches + 1 and stats.ingests_committed == batches
    assert stats.rows_committed == per_batch * batches
    # each batch's commit fired the windows its watermark closed, while the stream ran
    assert len(fired_after_batch) == batches and 0 < fired_after_batch[0] < fired_after_batch[1] < fired_after_batch[2]


@pytest.mark.parametrize("name", sorted(generators.STREAMS))
def test_the_spark_generators_make_the_reference_records(spark, name):
    stream = generators.STREAMS[name]
    df = generators.spark_stream(spark, name, 3000, partitions=2, seed=3, start=500)
    table = df.toArrow()
    plan = plan_columns(df.schema, stream.schema, defaults=stream.defaults, source=name)
    batch = pa.RecordBatch.from_arrays([c.combine_chunks() for c in table.columns], names=table.column_names)
    got = ArrowConverter(plan).convert_all(batch)
    assert got.tobytes() == generators.records(name, 500, 3500, seed=3).tobytes()
