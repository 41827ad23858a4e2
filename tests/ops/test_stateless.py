"""Stateless steps (apply, filter, with_column, project) and sinks, through whole small runs.

User code is checked where it meets the runtime: its exceptions and wrong results become an
OperatorError naming the step, and the run shuts down instead of hanging.
"""

import subprocess
import sys

import numpy as np
import pyarrow.csv
import pyarrow.parquet
import pytest
import trio

import slashrt
from slashrt import Dataflow, OperatorError, Schema, sinks

SCHEMA = Schema({"t": "i8", "k": "i4", "v": "f8", "tag": "S3"})
N = 1000
RUN = dict(slot_size=512, slots=4)  # many small buffers


def records(n=N):
    a = np.zeros(n, SCHEMA.dtype)
    a["t"] = np.arange(n)
    a["k"] = np.arange(n) % 5
    a["v"] = np.arange(n) / 4
    a["tag"] = b"abc"
    a["tag"][1::2] = b"xy"
    return a


def run(build, data=None, **kw):
    """Build `source -> build(stream) -> Collect` and run it; return the collected records."""
    flow = Dataflow("s")
    out = sinks.Collect()
    build(flow.source("src", SCHEMA, time="t")).sink(out, name="out")
    slashrt.run(flow, {"src": records() if data is None else data}, **{**RUN, **kw})
    return out.records


async def run_bounded(flow, data, seconds=10):
    """`run_async` that must finish (with a result or an error) within `seconds`: no hang."""
    with trio.fail_after(seconds):
        return await slashrt.run_async(flow, data, **RUN)


# -- apply -------------------------------------------------------------------------------------------


def test_sync_and_async_apply_see_every_record_once():
    seen = []

    def sync_fn(batch):
        seen.append(len(batch))
        return batch

    async def async_fn(batch):
        await trio.lowlevel.checkpoint()
        return batch[batch["k"] != 0]

    out = run(lambda s: s.apply(sync_fn).apply(async_fn))
    assert sum(seen) == N and len(seen) > 1
    a = records()
    assert np.array_equal(out, a[a["k"] != 0])


def test_apply_may_return_a_structured_array_with_a_declared_schema():
    def to_pairs(batch):
        out = np.empty(len(batch), [("k", "<i8"), ("double", "<f8")])
        out["k"] = batch["k"]
        out["double"] = batch["v"] * 2
        return out

    out = run(lambda s: s.apply(to_pairs, schema={"k": "i8", "double": "f8"}))
    assert out.dtype.names == ("k", "double")
    assert np.array_equal(out["double"], records()["v"] * 2)


def test_apply_returning_none_drops_the_batch():
    per_slot = (RUN["slot_size"] - 32) // SCHEMA.record_size  # records in a full buffer

    def every_other_buffer(batch):
        return batch if batch["t"][0] // per_slot % 2 else None

    a = records()
    out = run(lambda s: s.apply(every_other_buffer), coalesce=1)
    assert np.array_equal(out, a[a["t"] // per_slot % 2 == 1])
    out = run(lambda s: s.apply(lambda b: None))
    assert len(out) == 0 and out.dtype == SCHEMA.dtype


@pytest.mark.parametrize("is_async", [False, True])
async def test_a_raising_user_function_names_its_step_and_the_run_shuts_down(is_async):
    closed = []

    class Recording(sinks.Collect):
        def close(self):
            closed.append(True)
            super().close()

    def boom(batch):
        if batch["t"][0] > 300:
            raise KeyError("no such campaign")
        return batch

    async def aboom(batch):
        return boom(batch)

    flow = Dataflow("s")
    flow.source("src", SCHEMA, time="t").apply(aboom if is_async else boom, name="lookup").sink(Recording())
    with pytest.raises(OperatorError, match=r"step 's\.lookup': user function raised KeyError: 'no such campaign'") as info:
        await run_bounded(flow, {"src": records()})
    assert info.value.step_id == "s.lookup"
    assert isinstance(info.value.__cause__, KeyError)
    assert closed == [True], "sinks are closed after a failure"


def test_slashrt_run_raises_the_operator_error_itself():
    flow = Dataflow("s")
    flow.source("src", SCHEMA).filter(lambda b: 1 / 0, name="div").sink(sinks.Collect())
    with pytest.raises(OperatorError, match=r"step 's\.div': user function raised ZeroDivisionError"):
        slashrt.run(flow, {"src": records()}, **RUN)


@pytest.mark.parametrize(
    "result, match",
    [
        ([1, 2, 3], "returned the wrong type: expected a Batch or a 1-D structured numpy array, got list"),
        (np.arange(3), "returned the wrong type"),
        (np.zeros((2, 2), SCHEMA.dtype), "returned the wrong type"),
        (42, "returned the wrong type"),
    ],
)
def test_apply_returning_the_wrong_type_is_an_operator_error(result, match):
    with pytest.raises(OperatorError, match=rf"step 's\.bad': {match}"):
        run(lambda s: s.apply(lambda b: result, name="bad"))


def test_apply_returning_a_batch_without_declared_columns_is_an_operator_error():
    with pytest.raises(OperatorError, match=r"step 's\.proj': returned a batch without columns \['v', 'tag'\]"):
        run(lambda s: s.apply(lambda b: b.project(["t", "k"]), name="proj"))
    with pytest.raises(OperatorError, match=r"step 's\.declared': returned a batch without columns \['w'\]"):
        run(lambda s: s.apply(lambda b: b, schema={"t": "i8", "w": "f8"}, name="declared"))


# -- filter --------------------------------------------------------------------------------------------


def test_sync_and_async_filters():
    async def low_keys(batch):
        return batch["k"] < 3

    out = run(lambda s: s.filter(lambda b: b["t"] % 2 == 0).filter(low_keys))
    a = records()
    assert np.array_equal(out, a[(a["t"] % 2 == 0) & (a["k"] < 3)])


@pytest.mark.parametrize(
    "predicate, match",
    [
        (lambda b: b["k"], r"predicate returned int32 of shape \(\d+,\), expected bool"),
        (lambda b: (b["k"] > 1)[:-1], r"predicate returned bool of shape \(\d+,\), expected bool of shape"),
        (lambda b: True, r"predicate returned bool of shape \(\), expected bool"),
        (lambda b: None, "predicate returned object"),
    ],
)
def test_a_filter_returning_no_mask_is_an_operator_error(predicate, match):
    with pytest.raises(OperatorError, match=rf"step 's\.f': {match}"):
        run(lambda s: s.filter(predicate, name="f"))


# -- with_column and project ---------------------------------------------------------------------------


def test_with_column_adds_replaces_and_casts():
    async def campaign(batch):
        return batch["k"] // 2

    out = run(
        lambda s: s.with_column("campaign", campaign, dtype="i2")
        .with_column("v", lambda b: b["v"] * 10, dtype="f4")
        .with_column("big", lambda b: b["t"] + 2**40)
    )
    a = records()
    assert out.dtype["campaign"] == np.dtype("i2")
    assert out.dtype["v"] == np.dtype("f4")
    assert out.dtype["big"] == np.dtype("i8")
    assert np.array_equal(out["campaign"], a["k"] // 2)
    assert np.array_equal(out["v"], (a["v"] * 10).astype("f4"))
    assert np.array_equal(out["t"], a["t"])


def test_with_column_of_the_wrong_shape_is_an_operator_error():
    with pytest.raises(OperatorError, match=r"step 's\.with_x_1': returned shape \(1,\), expected"):
        run(lambda s: s.with_column("x", lambda b: b["k"][:1]))


def test_project_keeps_columns_in_order():
    out = run(lambda s: s.filter(lambda b: b["k"] == 1).project("v", "t"))
    a = records()
    assert out.dtype.names == ("v", "t")
    assert np.array_equal(out["t"], a["t"][a["k"] == 1])


# -- sinks ---------------------------------------------------------------------------------------------


def test_collect_copies_views_of_channel_slots():
    # raw input reaches the sink as views into ring slots that are reused after release
    a = records(5000)
    assert np.array_equal(run(lambda s: s, a, coalesce=1), a)
    assert np.array_equal(run(lambda s: s, a, coalesce=16), a)


def test_collect_reopens_empty():
    c = sinks.Collect()
    c.open()
    c.write(records(3))
    c.close()
    assert len(c.records) == 3
    c.open()
    assert c.records is None
    c.close()
    assert c.records is None


def test_callback_sees_every_record():
    got = []
    flow = Dataflow("s")
    flow.source("src", SCHEMA).filter(lambda b: b["k"] == 4).sink(sinks.Callback(lambda r: got.append(r.copy())))
    slashrt.run(flow, {"src": records()}, **RUN)
    a = records()
    assert np.array_equal(np.concatenate(got), a[a["k"] == 4])


def test_a_failing_sink_names_its_step():
    def explode(records):
        raise OSError("disk full")

    flow = Dataflow("s")
    flow.source("src", SCHEMA).sink(sinks.Callback(explode), name="save")
    with pytest.raises(OperatorError, match=r"step 's\.save': sink failed: OSError: disk full"):
        slashrt.run(flow, {"src": records()}, **RUN)


def test_a_sink_without_the_sink_methods_is_rejected():
    flow = Dataflow("s")
    flow.source("src", SCHEMA).sink(object(), name="nothing")
    with pytest.raises(TypeError, match=r"step 's\.nothing': sink .* has no open\(\) method"):
        slashrt.run(flow, {"src": records()}, **RUN)


def test_csv_file_round_trip(tmp_path):
    path = tmp_path / "out" / "rows.csv"
    flow = Dataflow("s")
    flow.source("src", SCHEMA).filter(lambda b: b["k"] > 2).project("t", "k", "v").sink(sinks.CsvFile(path))
    slashrt.run(flow, {"src": records()}, **RUN)
    table = pyarrow.csv.read_csv(path)
    a = records()
    a = a[a["k"] > 2]
    assert table.column_names == ["t", "k", "v"]
    assert table.num_rows == len(a)
    assert np.array_equal(table["t"].to_numpy(), a["t"])
    assert np.array_equal(table["k"].to_numpy(), a["k"])
    assert np.array_equal(table["v"].to_numpy(), a["v"])


def test_parquet_file_round_trip_keeps_types_and_bytes(tmp_path):
    path = tmp_path / "rows.parquet"
    flow = Dataflow("s")
    flow.source("src", SCHEMA).sink(sinks.ParquetFile(path))
    slashrt.run(flow, {"src": records()}, **RUN)
    table = pyarrow.parquet.read_table(path)
    a = records()
    assert table.column_names == list(SCHEMA.names)
    assert str(table.schema.field("k").type) == "int32"
    assert str(table.schema.field("tag").type) == "string"  # S columns are text
    for name in ("t", "k", "v"):
        assert np.array_equal(table[name].to_numpy(), a[name])
    assert table["tag"].to_pylist() == [x.decode() for x in a["tag"]]  # as numpy shows them: "xy", not "xy\0"


NUMBERS = Schema({"i": "i2", "u": "u8", "f": "f4", "b": "?"})


def test_file_sinks_write_numbers_and_bools_as_their_types_without_importing_pandas(tmp_path):
    """Every executor process writes its own files: pyarrow's `pa.array` would import pandas in
    each (about 0.5 s of CPU at its first write)."""
    code = f"""
import sys
import numpy as np
import pyarrow.csv, pyarrow.parquet
from slashrt import Schema
from slashrt.ops.sinks import CsvFile, ParquetFile

a = np.zeros(9, Schema({dict(NUMBERS.dtype.descr)!r}).dtype)
a["i"], a["u"], a["f"], a["b"] = np.arange(-4, 5), 2**64 - 1 - np.arange(9, dtype=np.uint64), np.arange(9) / 4, np.arange(9) % 3 == 0
for sink in (CsvFile({str(tmp_path / "n.csv")!r}), ParquetFile({str(tmp_path / "n.parquet")!r})):
    sink.open(); sink.write(a[1:]); sink.close()
assert "pandas" not in sys.modules, "pandas was imported"
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    csv, parquet = pyarrow.csv.read_csv(tmp_path / "n.csv"), pyarrow.parquet.read_table(tmp_path / "n.parquet")
    assert csv.column("b").to_pylist() == parquet.column("b").to_pylist() == [x % 3 == 0 for x in range(1, 9)]
    assert [str(parquet.schema.field(n).type) for n in "iufb"] == ["int16", "uint64", "float", "bool"]
    assert parquet.column("i").to_pylist() == csv.column("i").to_pylist() == list(range(-3, 5))
    assert parquet.column("u").to_pylist() == [2**64 - 1 - x for x in range(1, 9)]
    assert parquet.column("f").to_pylist() == csv.column("f").to_pylist() == [x / 4 for x in range(1, 9)]


BYTES = Schema({"name": "S6", "raw": "V3"})


def bytes_records():
    a = np.zeros(3, BYTES.dtype)
    a["name"] = [b"ab", "h\u00e9".encode(), b""]
    a["raw"] = [np.void(b"\x00\xff\x10"), np.void(b"abc"), np.void(b"\x00\x00\x00")]
    return a


def test_csv_writes_text_columns_as_numpy_shows_them_and_raw_bytes_as_hex(tmp_path):
    flow = Dataflow("s")
    flow.source("src", BYTES).sink(sinks.CsvFile(tmp_path / "b.csv"))
    slashrt.run(flow, {"src": bytes_records()})
    lines = (tmp_path / "b.csv").read_text(encoding="utf-8").splitlines()
    assert lines == ['"name","raw"', '"ab","00ff10"', '"h\u00e9","616263"', '"","000000"']


def test_parquet_writes_text_columns_as_strings_and_raw_bytes_as_binary(tmp_path):
    flow = Dataflow("s")
    flow.source("src", BYTES).sink(sinks.ParquetFile(tmp_path / "b.parquet"))
    slashrt.run(flow, {"src": bytes_records()})
    table = pyarrow.parquet.read_table(tmp_path / "b.parquet")
    assert table["name"].to_pylist() == ["ab", "h\u00e9", ""]
    assert table["raw"].to_pylist() == [b"\x00\xff\x10", b"abc", b"\x00\x00\x00"]


@pytest.mark.parametrize("sink", [sinks.CsvFile, sinks.ParquetFile])
def test_bytes_that_are_no_text_in_a_text_column_name_it(tmp_path, sink):
    a = bytes_records()
    a["name"][2] = b"\xff\xfe"
    flow = Dataflow("s")
    flow.source("src", BYTES).sink(sink(tmp_path / "b.out"), name="save")
    with pytest.raises(
        OperatorError, match=r"step 's\.save': sink failed: SchemaError: column 'name' \(\|S6\) holds bytes that are not UTF-8 text, e\.g\. row 2.*declare the field 'V6'"
    ):
        slashrt.run(flow, {"src": a})


def test_file_sinks_write_nothing_for_an_empty_stream(tmp_path):
    flow = Dataflow("s")
    src = flow.source("src", SCHEMA)
    src.filter(lambda b: b["k"] > 99).sink(sinks.CsvFile(tmp_path / "a.csv"))
    src.filter(lambda b: b["k"] > 99).sink(sinks.ParquetFile(tmp_path / "a.parquet"))
    slashrt.run(flow, {"src": records()}, **RUN)
    assert not (tmp_path / "a.csv").exists() and not (tmp_path / "a.parquet").exists()


def test_a_sink_receives_derived_columns_as_fields():
    got = []
    flow = Dataflow("s")
    flow.source("src", SCHEMA).with_column("x", lambda b: b["k"] * 2).sink(sinks.Callback(got.append))
    slashrt.run(flow, {"src": records(10)}, **RUN)
    (only,) = got
    assert only.dtype.names == ("t", "k", "v", "tag", "x")
    assert list(only["x"]) == [0, 2, 4, 6, 8, 0, 2, 4, 6, 8]
