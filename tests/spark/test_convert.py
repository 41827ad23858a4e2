"""Spark types to slashrt fields without a JVM: the mapping table, the converter, the generators."""

import datetime

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import types as T

from slashrt import Schema
from slashrt.bench.ysb import YSB_SCHEMA
from slashrt.spark import ArrowConverter, IngestSchemaError, plan_columns
from slashrt.spark import generators


def struct(**fields):
    return T.StructType([T.StructField(name, typ, nullable) for name, (typ, nullable) in fields.items()])


def test_every_mapped_type_converts_exactly():
    schema = Schema({"a": "i8", "b": "u1", "c": "i4", "d": "f8", "e": "f4", "f": "u1", "ts": "i8", "day": "i4",
                     "s": "S6", "v": "V4", "k": "u4"})
    spark = struct(a=(T.IntegerType(), False), b=(T.ByteType(), False), c=(T.LongType(), False),
                   d=(T.FloatType(), False), e=(T.FloatType(), False), f=(T.BooleanType(), False),
                   ts=(T.TimestampType(), False), day=(T.DateType(), False), s=(T.StringType(), False),
                   v=(T.BinaryType(), False), k=(T.LongType(), False))
    plan = plan_columns(spark, schema)
    stamps = [datetime.datetime(2024, 1, 1, 0, 0, 0, 1500, tzinfo=datetime.timezone.utc),
              datetime.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=datetime.timezone.utc), None]
    batch = pa.RecordBatch.from_arrays(
        [pa.array([-5, 7, 2**31 - 1], pa.int32()), pa.array([0, 127, 3], pa.int8()), pa.array([-(2**31), 5, 2**31 - 1]),
         pa.array([1.5, -2.25, 3.0], pa.float32()), pa.array([0.5, 1.0, -1.0], pa.float32()),
         pa.array([True, False, True]), pa.array(stamps[:2] + [stamps[0]], pa.timestamp("us", tz="UTC")),
         pa.array([datetime.date(1970, 1, 2), datetime.date(2000, 1, 1), datetime.date(1969, 12, 31)]),
         pa.array(["ab", "", "héllo"]), pa.array([b"\x01\x02\x03\x04", b"\xff", b""]),
         pa.array([0, 2**32 - 1, 12345])],
        names=list("abcdef") + ["ts", "day", "s", "v", "k"],
    )
    out = ArrowConverter(plan).convert_all(batch)
    assert out.dtype == schema.dtype
    assert out["a"].tolist() == [-5, 7, 2**31 - 1]
    assert out["b"].tolist() == [0, 127, 3]
    assert out["c"].tolist() == [-(2**31), 5, 2**31 - 1]
    assert out["d"].tolist() == [1.5, -2.25, 3.0]
    assert out["f"].tolist() == [1, 0, 1]
    assert out["ts"].tolist() == [1704067200001, -1, 1704067200001]  # milliseconds, floored
    assert out["day"].tolist() == [1, 10957, -1]
    assert out["s"].tolist() == [b"ab", b"", "héllo".encode()]
    assert bytes(out["v"][0]) == b"\x01\x02\x03\x04" and bytes(out["v"][1]) == b"\xff\0\0\0" and bytes(out["v"][2]) == bytes(4)
    assert out["k"].tolist() == [0, 2**32 - 1, 12345]


def test_the_generators_columns_convert_to_the_same_records_as_the_reference():
    for name, stream in generators.STREAMS.items():
        ids = np.arange(1000, 4000, dtype=np.int64)
        batch = generators.arrow_batch(name, ids, seed=9)
        plan = plan_columns(stream.spark_schema(), stream.schema, defaults=stream.defaults, source=name)
        got = ArrowConverter(plan, block_rows=700).convert_all(batch)  # several blocks per batch
        want = generators.records(name, 1000, 4000, seed=9)
        assert got.tobytes() == want.tobytes(), name


def test_generated_streams_depend_only_on_seed_and_index():
    whole = generators.records("ysb", 0, 10_000, seed=1)
    parts = np.concatenate([generators.records("ysb", a, a + 2500, seed=1) for a in range(0, 10_000, 2500)])
    assert whole.tobytes() == parts.tobytes()
    assert whole.tobytes() != generators.records("ysb", 0, 10_000, seed=2).tobytes()
    assert set(np.unique(whole["event_type"])) == {0, 1, 2} and whole["ad_id"].max() < 10_000
    bids = generators.records("bids", 0, 2000)
    assert set(bids["channel"]) == set(generators.CHANNELS)


@pytest.mark.parametrize(
    "spark,columns,message",
    [
        (struct(t=(T.LongType(), False)), None, "no column for field 'k'"),
        (struct(t=(T.LongType(), False), key=(T.LongType(), False)), {"nope": "k"}, "has no column 'nope'"),
        (struct(t=(T.LongType(), False), key=(T.LongType(), False)), {"key": "zz"}, "does not have"),
        (struct(t=(T.StringType(), False), k=(T.LongType(), False)), None, "column 't' has Spark type string"),
        (struct(t=(T.DoubleType(), False), k=(T.LongType(), False)), None, "cannot fill field 't'"),
        (struct(t=(T.DecimalType(10, 2), False), k=(T.LongType(), False)), None, "slashrt does not convert"),
        (struct(t=(T.LongType(), False), k=(T.LongType(), False), k2=(T.LongType(), False)),
         {"k": "k", "k2": "k"}, "mapped from two columns"),
    ],
)
def test_the_mapping_refuses_what_does_not_fit(spark, columns, message):
    with pytest.raises(IngestSchemaError, match=message):
        plan_columns(spark, Schema({"t": "i8", "k": "i8"}), columns)


def test_batches_with_bad_values_are_refused_naming_column_and_field():
    schema = Schema({"k": "u1", "s": "S3", "x": "i8"})
    plan = plan_columns(struct(k=(T.IntegerType(), False), s=(T.StringType(), True), x=(T.LongType(), True)), schema)
    conv = ArrowConverter(plan)

    def batch(k, s, x):
        return pa.RecordBatch.from_arrays([pa.array(k, pa.int32()), pa.array(s), pa.array(x, pa.int64())], names=["k", "s", "x"])

    with pytest.raises(IngestSchemaError, match=r"column 'k' \(integer\) -> field 'k'.*values from -1 to 3"):
        conv.convert_all(batch([3, -1], ["a", "b"], [1, 2]))
    with pytest.raises(IngestSchemaError, match=r"column 's'.*4 bytes.*longer than the field's 3"):
        conv.convert_all(batch([1, 2], ["abc", "abcd"], [1, 2]))
    with pytest.raises(IngestSchemaError, match=r"column 'x'.*1 null"):
        conv.convert_all(batch([1, 2], ["a", "b"], [1, None]))
    filled = plan_columns(struct(k=(T.IntegerType(), False), s=(T.StringType(), True), x=(T.LongType(), True)),
                          schema, fill_nulls={"x": -7, "s": b"?"})
    out = ArrowConverter(filled).convert_all(batch([1, 2], [None, "b"], [None, 2]))
    assert out["x"].tolist() == [-7, 2] and out["s"].tolist() == [b"?", b"b"]


def test_defaults_fill_fields_without_columns_and_bad_defaults_are_refused():
    plan = plan_columns(struct(event_time=(T.LongType(), False)), Schema({"event_time": "i8", "tag": "u2", "pad": "V5"}),
                        defaults={"tag": 513, "pad": b"xy"})
    out = ArrowConverter(plan).convert_all(pa.RecordBatch.from_arrays([pa.array(range(30_000))], names=["e"]))
    assert out["tag"].tolist() == [513] * 30_000 and bytes(out["pad"][-1]) == b"xy\0\0\0"
    with pytest.raises(IngestSchemaError, match="does not fit field 'tag'"):
        plan_columns(struct(event_time=(T.LongType(), False)), Schema({"event_time": "i8", "tag": "u2"}), defaults={"tag": -1})


def test_ysb_plan_needs_range_checks_only_where_spark_types_are_wider():
    stream = generators.STREAMS["ysb"]
    plan = plan_columns(stream.spark_schema(), YSB_SCHEMA, defaults=stream.defaults)
    assert sorted((what, f.field) for what, f in plan.data_checks()) == [
        ("range", "ad_type"), ("range", "event_type"), ("range", "ip")]


def test_the_conversion_benchmark_checks_itself(capsys):
    import json

    from slashrt.cli import main

    assert main(["bench", "spark-convert", "--events", "200000", "--repeat", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["correct"] is True and result["events"] == 200_000 and result["records_per_s"] > 0


def test_a_schema_declared_big_endian_converts_to_little_endian_records():
    # records are little-endian whatever the schema says: 7 stays 7 (not 504403158265495552)
    schema = Schema({"t": ">i8", "user": ">i8", "x": ">f8"})
    spark = struct(t=(T.LongType(), False), user=(T.LongType(), False), x=(T.DoubleType(), False))
    batch = pa.RecordBatch.from_arrays([pa.array([1, 2]), pa.array([7, -3]), pa.array([0.5, 2.0])], names=["t", "user", "x"])
    out = ArrowConverter(plan_columns(spark, schema)).convert_all(batch)
    assert out.dtype == np.dtype([("t", "<i8"), ("user", "<i8"), ("x", "<f8")])
    assert out["user"].tolist() == [7, -3] and out["x"].tolist() == [0.5, 2.0]
