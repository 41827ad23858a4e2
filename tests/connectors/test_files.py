"""FileSource over real files in a temporary directory, written by our own sinks (CsvFile,
ParquetFile) and np.save: round trips through a window over many turns of a small ring, equal
to the in-memory run; rewinding from every kind of position (hypothesis over cut points); bad
input, one sentence each, after delivering what came before; empty files and directories."""

import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import slashrt
from slashrt import Dataflow, DataflowError, Schema, SchemaError, Tumbling, sinks
from slashrt.connectors import ConnectorError, FilePosition, FileSource
from slashrt.errors import OptionError
from slashrt.ops.sinks import to_arrow

ROWS = Schema({"t": "<i8", "key": "<i8", "name": "S8", "tag": "V4", "value": "<f8", "flag": "?"})
SUFFIX = {"csv": ".csv", "parquet": ".parquet", "npy": ".npy"}
RING = {"slot_size": 1024, "slots": 4}  # 27 records a slot: many turns of the ring


def rows(n: int, start: int = 0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + start)
    out = np.empty(n, ROWS.dtype)
    out["t"] = np.arange(start, start + n) + rng.integers(0, 40, n)  # out of order by up to 40 ms
    out["key"] = rng.integers(0, 9, n)
    out["name"] = np.char.add(b"k\xc3\xa9", (np.arange(start, start + n) % 97).astype("S3"))  # UTF-8 text
    out["name"][::13] = b""
    out["name"][5::17] = b'a\n"b, c'  # a line break, a quote and a comma inside a CSV value
    out["tag"] = rng.integers(0, 256, (n, 4), dtype=np.uint8).view("V4").reshape(n)
    out["tag"][::7] = b"\0\0\0\0"
    out["value"] = rng.normal(size=n) * 1e6
    out["flag"] = rng.integers(0, 2, n).astype(bool)
    return out


def write(path: Path, chunks: list[np.ndarray]) -> Path:
    """A file of `chunks`, in the format of its suffix: our sinks' writers (a Parquet row group a
    chunk), np.save for .npy."""
    if path.suffix == ".npy":
        np.save(path, np.concatenate(chunks) if chunks else np.empty(0, ROWS.dtype))
        return path
    sink = (sinks.CsvFile if path.suffix == ".csv" else sinks.ParquetFile)(path)
    sink.open()
    for chunk in chunks:
        sink.write(chunk)
    sink.close()
    return path


def write_files(directory: Path, fmt: str, sizes: list[list[int]], seed: int = 0) -> list[np.ndarray]:
    """Files part-0 ... part-<k> (the names sort by number, part-2 before part-10), file i of
    chunks of sizes[i] records; returns each file's records. `fmt` "mixed" cycles the formats."""
    directory.mkdir(exist_ok=True)
    files, start = [], 0
    for i, chunk_sizes in enumerate(sizes):
        kind = ["csv", "parquet", "npy"][i % 3] if fmt == "mixed" else fmt
        chunks = [rows(n, start + sum(chunk_sizes[:j]), seed) for j, n in enumerate(chunk_sizes)]
        write(directory / f"part-{i}{SUFFIX[kind]}", chunks)
        files.append(np.concatenate(chunks) if chunks else np.empty(0, ROWS.dtype))
        start += sum(chunk_sizes)
    return files


def passthrough(sink) -> Dataflow:
    flow = Dataflow("f")
    flow.source("events", ROWS, time="t", max_delay=20).sink(sink, name="out")
    return flow


def windowed(sink) -> Dataflow:
    flow = Dataflow("w")
    events = flow.source("events", ROWS, time="t", max_delay=20)
    events.window(Tumbling(ms=500)).sum("value", key="key").sink(sink, name="sums")
    return flow


def read_all(source, **ring) -> np.ndarray:
    out = sinks.Collect()
    slashrt.run(passthrough(out), {"events": source}, **(ring or RING))
    return out.records


# -- round trips -------------------------------------------------------------------------------------
SIZES = [[900, 1100], [1], [0], [2500], [700, 300, 1000], [40], [3000], [1200], [10, 20], [800], [1500, 5], [2000]]


@pytest.mark.parametrize("fmt", ["csv", "parquet", "npy", "mixed"])
def test_round_trip_through_a_window_equals_the_in_memory_run(tmp_path, fmt):
    files = write_files(tmp_path / "in", fmt, SIZES)
    data = np.concatenate(files)
    source = FileSource(tmp_path / "in", batch_records=700)
    assert [p.name for p in source.files] == [f"part-{i}{p.suffix}" for i, p in enumerate(source.files)]
    got, want = sinks.Collect(), sinks.Collect()
    result = slashrt.run(windowed(got), {"events": source}, **RING)
    slashrt.run(windowed(want), {"events": data}, **RING)
    assert result.records == len(data) == 15_076 and result.stats[0].buffers > 100 * RING["slots"]
    assert len(want.records) > 100 and np.array_equal(np.sort(got.records), np.sort(want.records))
    assert result.late_records == slashrt.run(windowed(sinks.Collect()), {"events": data}).late_records
    assert source.position == FilePosition(len(SIZES), 0) and source.delivered == len(data)
    # every column back as it was: S text with its NUL padding, V bytes, floats to the last bit, bools
    assert read_all(FileSource(tmp_path / "in", batch_records=333)).tobytes() == data.tobytes()


def test_a_second_run_of_the_same_source_reads_nothing_new(tmp_path):
    data = write_files(tmp_path, "parquet", [[100]])[0]
    source = FileSource(tmp_path)
    assert np.array_equal(read_all(source), data)
    again = read_all(source)
    assert len(again) == 0 and again.dtype == ROWS.dtype


def test_a_transactional_sinks_directory_reads_in_checkpoint_order_without_unpublished_parts(tmp_path):
    out = sinks.ParquetFile(tmp_path / "out", transactional=True)
    out.open()
    published = []
    for n in range(1, 13):  # part-1-0 ... part-12-0: part-2 before part-10
        chunk = rows(50, 50 * n)
        out.write(chunk)
        out.pre_commit(n)
        out.commit(n)
        published.append(chunk)
    out.write(rows(5, 9999))  # after the last barrier: an .inprogress file, not published
    out.pre_commit(13)
    (tmp_path / "out" / "_SUCCESS").write_text("")
    (tmp_path / "out" / ".part-1-0.parquet.crc").write_text("x")
    source = FileSource(tmp_path / "out")
    assert len(source.files) == 12 and any(p.name.endswith(".inprogress") for p in (tmp_path / "out").iterdir())
    assert np.array_equal(read_all(source), np.concatenate(published))


def test_other_column_orders_extra_columns_and_encodings_are_read_by_name(tmp_path):
    data = rows(300)
    shuffled = ["flag", "value", "tag", "name", "key", "t"]
    table = to_arrow(data).select(shuffled).append_column("extra", pa.array(np.arange(300.0)))
    table = table.set_column(table.schema.get_field_index("t"), "t", pa.array(data["t"].astype(np.int32)))
    table = table.set_column(table.schema.get_field_index("name"), "name", table.column("name").cast(pa.binary()))
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=64)
    (tmp_path / "b.csv").write_bytes(
        b"extra,flag,key,name,t,tag,value\n"
        + b"x,true,3,\"a,b\",1000,0A0b0C0d,1e3\n"
        + b"y,false,-4,,1001,00000000,-0.5\n"
    )
    wide = np.zeros(3, [("value", ">f8"), ("extra", "u1"), ("t", ">i8"), ("key", "<i8"), ("name", "S8"),
                        ("tag", "V4"), ("flag", "?")])
    wide["t"] = [5000, 5001, 5002]
    np.save(tmp_path / "c.npy", wide)
    got = read_all(FileSource(tmp_path))
    assert np.array_equal(got[:300], data)
    assert got[300].tolist() == (1000, 3, b"a,b", b"\x0a\x0b\x0c\x0d", 1000.0, True)
    assert got[301].tolist() == (1001, -4, b"", b"\0\0\0\0", -0.5, False)
    assert np.array_equal(got[302:], Schema.from_dtype(ROWS.dtype).conform(wide[list(ROWS.names)], "x"))


def test_dictionary_encoded_columns_are_read_as_their_values(tmp_path):
    data = rows(200)
    table = to_arrow(data)
    for name in ("key", "name"):
        i = table.schema.get_field_index(name)
        table = table.set_column(i, name, table.column(name).dictionary_encode())
    pq.write_table(table, tmp_path / "a.parquet")
    assert pa.types.is_dictionary(pq.read_table(tmp_path / "a.parquet").schema.field("name").type)
    assert np.array_equal(read_all(FileSource(tmp_path)), data)


def test_a_timestamp_column_fills_an_integer_time_field_in_milliseconds(tmp_path):
    data = rows(10)
    table = to_arrow(data)
    stamps = pa.array(data["t"] * 1000, pa.timestamp("us", tz="UTC"))
    pq.write_table(table.set_column(0, "t", stamps), tmp_path / "a.parquet")
    assert np.array_equal(read_all(FileSource(tmp_path / "a.parquet")), data)


# -- rewinding ---------------------------------------------------------------------------------------
REWIND_SIZES = [[300, 200], [0], [450], [100, 100, 100], [1], [250]]


@pytest.mark.parametrize("fmt", ["csv", "parquet", "npy"])
def test_rewinding_to_any_position_reads_exactly_the_rest(tmp_path, fmt):
    files = write_files(tmp_path, fmt, REWIND_SIZES)
    whole = np.concatenate(files)
    source = FileSource(tmp_path, batch_records=64)
    chunk_ends = [(i, sum(sizes[: j + 1])) for i, sizes in enumerate(REWIND_SIZES) for j in range(len(sizes))]
    # every kind: the very start, inside a row group or batch, a row group's edge, a file's end (i, len)
    # and the next file's start (i + 1, 0), an empty file, the end
    position = st.one_of(
        st.integers(0, len(files)).flatmap(
            lambda i: st.tuples(st.just(i), st.integers(0, len(files[i]) if i < len(files) else 0))
        ),
        st.sampled_from(chunk_ends + [(1, 0), (2, 0), (len(files), 0)]),
    )

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(cut=position)
    def check(cut):
        before = sum(len(f) for f in files[: cut[0]]) + cut[1]
        assert np.array_equal(read_all(source.resume_from(cut), slot_size=512, slots=4), whole[before:])
        assert source.position == (len(files), 0)
        assert np.array_equal(read_all(FileSource(tmp_path, start=FilePosition(*cut))), whole[before:])

    check()


def test_a_position_past_a_files_end_is_an_error(tmp_path):
    write_files(tmp_path, "mixed", [[10], [20], [30]])
    for i, fmt in enumerate(["csv", "parquet", "npy"]):
        for offset in (11 + 10 * i, 1000):
            with pytest.raises(ConnectorError, match=rf"^file '\S+part-{i}\.{fmt}' holds (fewer than {offset}|"
                                                     rf"{10 * (i + 1)}) records, so position \({i}, {offset}\) is "
                                                     "past its end: the files changed"):
                read_all(FileSource(tmp_path, start=(i, offset)))


# -- bad input ---------------------------------------------------------------------------------------
def test_paths_that_name_no_files(tmp_path):
    with pytest.raises(ConnectorError, match=r"^'\S+nope' does not exist: give FileSource a directory, a file or a glob"):
        FileSource(tmp_path / "nope")
    with pytest.raises(ConnectorError, match=r"^no files match '\S+\*\.parquet': check the pattern"):
        FileSource(tmp_path / "*.parquet")
    (tmp_path / "notes.txt").write_text("t\n1\n")
    with pytest.raises(ConnectorError, match=r"^file '\S+notes\.txt' has the suffix '\.txt', which FileSource does not "
                                             r"read: .*format='parquet', 'csv' or 'npy'"):
        FileSource(tmp_path)
    assert len(FileSource(tmp_path / "*.txt", format="csv").files) == 1  # a format for files named otherwise


def test_options_are_checked_when_made(tmp_path):
    write_files(tmp_path, "npy", [[5], [5]])
    with pytest.raises(OptionError, match=r"format must be 'parquet', 'csv' or 'npy'"):
        FileSource(tmp_path, format="json")
    with pytest.raises(OptionError, match=r"batch_records must be a positive whole number, got 0"):
        FileSource(tmp_path, batch_records=0)
    for bad in [(-1, 0), (3, 0), (2, 1), "start", (0, 1.5), (0,)]:
        with pytest.raises(OptionError, match=r"position must be \(file index, record offset\) .* up to 2 \(its files\)"):
            FileSource(tmp_path, start=bad)


def fails_after_delivering(tmp_path, match, *, error=ConnectorError, **options):
    """Run over tmp_path; the run must fail with `match` after delivering records: returns
    (delivered records, the source)."""
    got = []
    source = FileSource(tmp_path, **options)
    with pytest.raises(error, match=match) as info:
        slashrt.run(passthrough(sinks.Callback(lambda r: got.append(r.copy()))), {"events": source}, **RING)
    assert "\n" not in str(info.value)
    return (np.concatenate(got) if got else np.empty(0, ROWS.dtype)), source


@pytest.mark.parametrize("fmt", ["csv", "parquet", "npy"])
def test_a_missing_column_is_named_after_the_files_before_it(tmp_path, fmt):
    good = write_files(tmp_path, fmt, [[500], [300]])
    lacking = rows(10)[["t", "key", "tag", "value", "flag"]]
    if fmt == "npy":
        np.save(tmp_path / "part-2.npy", lacking)
    else:
        write(tmp_path / f"part-2.{fmt}", [lacking])
    message = r"missing field 'name'" if fmt == "npy" else r"has no column 'name' \(its columns: t, key, tag, value, flag"
    delivered, source = fails_after_delivering(
        tmp_path, rf"^(file '\S+part-2\.{fmt}' {message}|file '\S+part-2\.npy': {message}).*; the 800 records before it "
                  r"were delivered \(up to record 0 of file 2\): resume_from\(\(2, 0\)\) reads on from there",
        error=SchemaError,
    )
    assert np.array_equal(delivered, np.concatenate(good)) and source.position == (2, 0)


@pytest.mark.parametrize("fmt", ["parquet", "npy"])
def test_a_column_of_an_unconvertible_type_is_named(tmp_path, fmt):
    data = rows(20)
    if fmt == "npy":
        other = np.zeros(20, [(n, "<f8" if n == "key" else data.dtype[n]) for n in ROWS.names])
        np.save(tmp_path / "a.npy", other)
        match = r"^file '\S+a\.npy': field 'key' has type <f8, expected <i8$"
    else:
        table = to_arrow(data)
        pq.write_table(table.set_column(1, "key", pa.array(data["key"].astype(str))), tmp_path / "a.parquet")
        match = r"^file '\S+a\.parquet': column 'key' is string, the field is <i8: it needs an integer column"
    with pytest.raises(SchemaError, match=match):
        read_all(FileSource(tmp_path))


def test_a_csv_column_for_a_field_text_does_not_fill_is_named(tmp_path):
    (tmp_path / "a.csv").write_bytes(b"t,when\n1,2024-01-01\n")
    flow = Dataflow("f")
    flow.source("events", {"t": "<i8", "when": "M8[ms]"}).sink(sinks.Collect())
    with pytest.raises(SchemaError, match=r"^file '\S+a\.csv': column 'when' is text, the field is <M8\[ms\]: text is "
                                          r"read into number, bool or bytes fields only"):
        slashrt.run(flow, {"events": FileSource(tmp_path)})


@pytest.mark.parametrize("line, value, message", [
    (5, b"1e9", r"column 't' has '1e9', not a <i8 value"),
    (1, b"", r"column 't' has '', not a <i8 value"),
    (4, b"9223372036854775808", r"column 't' has '9223372036854775808', not a <i8 value"),
])
def test_a_csv_with_a_bad_value_names_its_line_after_the_records_before_it(tmp_path, line, value, message):
    first = rows(600)
    second = rows(900, 600)
    second["name"] = b"ok"
    second["name"][[10, 20]] = [b"a\nb", b"\n\n\nc"]  # values over 1 + 3 more lines, and a blank line below
    write(tmp_path / "part-0.csv", [first])
    write(tmp_path / "part-1.csv", [second])
    lines = (tmp_path / "part-1.csv").read_bytes().split(b"\n")
    record = 400 + line - 1
    bad = record + 2 + 4 + 1  # the header, a line a record, the lines inside values, the blank line
    at = bad - 2  # its index in `lines`, which has no blank line yet
    lines[at - 1] += b"\n"
    lines[at] = value + lines[at][lines[at].index(b","):]
    (tmp_path / "part-1.csv").write_bytes(b"\n".join(lines))
    delivered, source = fails_after_delivering(
        tmp_path, rf"^file '\S+part-1\.csv', line {bad} \(record {record}\): {message}; the {600 + record} records "
                  rf"before it were delivered \(up to record {record} of file 1\): resume_from\(\(1, {record}\)\)",
        batch_records=64,
    )
    data = np.concatenate([first, second])
    assert np.array_equal(delivered, data[: 600 + record]) and source.position == (1, record)
    # once the file is mended, the position reads exactly the rest
    write(tmp_path / "part-1.csv", [second])
    assert np.array_equal(read_all(source), data[600 + record :])


@pytest.mark.parametrize("column, values, message", [
    ("name", pa.array([b"123456789"] * 5, pa.binary()), r"column 'name' has a value of 9 bytes, the field is \|S8 \(8 bytes\)"),
    ("tag", pa.array([b"abc"] * 5, pa.binary()), r"column 'tag' has a value of 3 bytes, the field is \|V4 \(4 bytes each\)"),
    ("value", pa.array([1.0, 2.0, None, 4.0, 5.0]), r"column 'value' has no value \(records have no nulls\)"),
])
def test_a_parquet_value_that_does_not_fit_is_named_with_its_row_group(tmp_path, column, values, message):
    good = rows(100)
    bad = to_arrow(rows(5, 100))
    bad = bad.set_column(bad.schema.get_field_index(column), column, values)
    with pq.ParquetWriter(tmp_path / "a.parquet", bad.schema) as writer:
        writer.write_table(to_arrow(good).cast(bad.schema))
        writer.write_table(bad)
    row = {"name": 0, "tag": 0, "value": 2}[column]
    delivered, source = fails_after_delivering(
        tmp_path, rf"^file '\S+a\.parquet', row group 1, record {100 + row}: {message}; the {100 + row} records before",
    )
    head = rows(5, 100)[:row].copy()
    head[column] = values[:row].to_numpy(zero_copy_only=False) if row else head[column]
    assert np.array_equal(delivered, np.concatenate([good, head])) and source.position == (0, 100 + row)


def test_truncated_and_corrupt_files_are_named(tmp_path):
    good = write_files(tmp_path, "mixed", [[400], [500, 500, 500]])
    raw = (tmp_path / "part-1.parquet").read_bytes()
    (tmp_path / "part-1.parquet").write_bytes(raw[: len(raw) // 2])
    delivered, source = fails_after_delivering(
        tmp_path, r"^file '\S+part-1\.parquet' is not a readable Parquet file \(.*\): it is truncated or corrupt; "
                  r"the 400 records before it were delivered \(up to record 0 of file 1\): resume_from\(\(1, 0\)\)"
    )
    assert np.array_equal(delivered, good[0]) and source.position == (1, 0)

    corrupt = bytearray(raw)  # the second row group's pages garbled, the footer whole
    meta = pq.ParquetFile(io.BytesIO(raw)).metadata
    column = meta.row_group(1).column(0)
    start = column.data_page_offset
    corrupt[start : start + column.total_compressed_size] = bytes(column.total_compressed_size)
    (tmp_path / "part-1.parquet").write_bytes(bytes(corrupt))
    delivered, source = fails_after_delivering(
        tmp_path.joinpath("*.parquet"), r"^file '\S+part-1\.parquet', row group 1, cannot be read \(.*\): the file is corrupt",
        batch_records=100,
    )
    assert np.array_equal(delivered, good[1][:500]) and source.position == (0, 500)


def test_truncated_npy_files_are_named(tmp_path):
    good = write_files(tmp_path, "npy", [[300], [200]])
    raw = (tmp_path / "part-1.npy").read_bytes()
    for broken in (raw[:-10], raw[:20], b"", b"\x93NUMPY\x09\x00garbage"):
        (tmp_path / "part-1.npy").write_bytes(broken)
        delivered, source = fails_after_delivering(
            tmp_path, r"^file '\S+part-1\.npy' is not a readable \.npy file \(.*\): it is truncated or corrupt; the 300 "
        )
        assert np.array_equal(delivered, good[0]) and source.position == (1, 0)
    np.save(tmp_path / "part-1.npy", np.arange(5))
    with pytest.raises(SchemaError, match=r"holds an array of shape \(5,\) and dtype int64: a FileSource reads 1-D structured"):
        read_all(FileSource(tmp_path, start=(1, 0)))


def test_a_file_removed_after_listing_is_named(tmp_path):
    write_files(tmp_path, "mixed", [[10], [10], [10]])
    source = FileSource(tmp_path)
    for path in source.files[1:]:
        os.remove(path)
    for i in (1, 2):
        with pytest.raises(ConnectorError, match=rf"^file '\S+part-{i}\.\w+' is gone: it was there when the FileSource"):
            read_all(source.resume_from((i, 0)))


# -- empty input -------------------------------------------------------------------------------------
def test_an_empty_directory_and_empty_files_are_empty_inputs(tmp_path):
    (tmp_path / "none").mkdir()
    got = read_all(FileSource(tmp_path / "none"))
    assert len(got) == 0 and got.dtype == ROWS.dtype
    d = tmp_path / "empty"
    d.mkdir()
    (d / "a.csv").write_bytes(b"")  # not even a header
    (d / "b.csv").write_bytes(b"t,key,name,tag,value,flag\n")
    pq.write_table(to_arrow(rows(0)), d / "c.parquet")
    np.save(d / "d.npy", rows(0))
    data = rows(10)
    np.save(d / "e.npy", data)
    source = FileSource(d)
    assert np.array_equal(read_all(source), data) and source.position == (5, 0)
    assert len(read_all(FileSource(d, start=(0, 0), format=None), slot_size=256, slots=2)) == 10
    (d / "f.parquet").write_bytes(b"")  # a Parquet file is never empty: it has a footer
    with pytest.raises(ConnectorError, match=r"^file '\S+f\.parquet' is not a readable Parquet file \(Parquet file size "
                                             r"is 0 bytes\)"):
        read_all(FileSource(d))


HEADER = b"t,key,name,tag,value,flag\n"


@pytest.mark.parametrize("tag", [b"0a0b0c0g", b"0a0b0c", b"0a0b0c0d0e"])
def test_a_csv_hex_value_that_is_not_the_fields_bytes_is_named(tmp_path, tag):
    (tmp_path / "a.csv").write_bytes(HEADER + b"1,1,a,0A0b0c0d,1.5,true\n" + b"2,1,a," + tag + b",1,true\n")
    delivered, source = fails_after_delivering(
        tmp_path, rf"^file '\S+a\.csv', line 3 \(record 1\): column 'tag' has '{tag.decode()}', not 4 bytes in hex "
                  r"\(8 hex digits\) for its field \|V4; the 1 records before it were delivered"
    )
    assert delivered.tolist() == [(1, 1, b"a", b"\x0a\x0b\x0c\x0d", 1.5, True)] and source.position == (0, 1)


def test_a_csv_line_with_other_columns_is_named(tmp_path):
    lines = b"".join(b"%d,1,a,00000000,1,true\n" % i for i in range(5000))
    (tmp_path / "a.csv").write_bytes(HEADER + lines + b"7,1\n")
    delivered, source = fails_after_delivering(
        tmp_path, r"^file '\S+a\.csv' cannot be read as CSV after record \d+ \(line \d+\): CSV parse error: Expected 6 "
                  r"columns, got 2: 7,1", batch_records=200)
    assert 0 < len(delivered) == source.position.offset < 5000
    assert np.array_equal(delivered["t"], np.arange(len(delivered)))


def test_bench_files_checks_itself_for_every_format_and_removes_its_files(capsys, monkeypatch, tmp_path):
    from slashrt.cli import main

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the benchmark makes its directory
    assert main(["bench", "files", "--events", "30000", "--parts", "3", "--repeat", "1", "--checkpoint-interval", "0.001",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["correct"] is True and report["query"] == "files-ysb" and report["events"] == 30_000
    for fmt in ("parquet", "csv", "npy", "array", "checkpointed"):
        assert report[f"records_per_s_{fmt}"] > 0
    assert report["checkpointed_over_plain"] > 0 and report["checkpoint_interval_s"] == 0.001
    assert 30_000 * 78 < report["bytes_npy"] < 30_000 * 78 + 3 * 1024 and report["bytes_csv"] > report["bytes_parquet"] > 0
    assert list(tmp_path.iterdir()) == []


def test_bench_peers_checks_slashrt_and_polars_on_one_and_two_threads_and_removes_its_files(capsys, monkeypatch, tmp_path):
    from slashrt.cli import main

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the benchmark makes its directory
    assert main(["bench", "peers", "--events", "60000", "--parts", "3", "--repeat", "1", "--slots", "8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # each side's result against numpy: slashrt on one executor and on two (each reading its
    # own files, with rings of 8 slots: the 2-executor run's windows cross executors), Polars on 1 and 2 threads
    assert report["checks"] == {"slashrt_1t": True, "polars_1t": True, "slashrt_2t": True, "polars_2t": True}
    assert report["correct"] is True and report["query"] == "peers-ysb" and report["events"] == 60_000
    for side in ("slashrt", "polars"):
        for threads in (1, 2):
            assert report[f"{side}_records_per_s_{threads}t"] > 0
    assert report["slashrt_over_polars_1t"] == pytest.approx(
        report["slashrt_records_per_s_1t"] / report["polars_records_per_s_1t"], rel=1e-2)
    assert report["parquet_bytes"] > 60_000 * 17 and report["polars_version"]
    assert list(tmp_path.iterdir()) == []


MIXED = np.dtype([("b", "?"), ("i1", "i1"), ("u2", "<u2"), ("i4", "<i4"), ("i8", "<i8"), ("f4", "<f4"), ("f8", "<f8")])


@pytest.mark.parametrize("start,length", [(0, 0), (0, 37), (3, 17), (9, 28), (36, 1)])
def test_numbers_and_booleans_read_from_arrow_columns_at_any_offset(start, length):
    from slashrt.connectors._columns import to_records

    rng = np.random.default_rng(start)
    data = np.zeros(37, MIXED)
    for name in MIXED.names:
        data[name] = rng.integers(0, 2, 37) if name == "b" else rng.integers(-100, 100, 37) if name[0] != "u" else rng.integers(0, 1000, 37)
    data["f8"] += 0.25
    table = pa.table({name: data[name] for name in MIXED.names})
    # (a slice of a batch: its arrays start at an offset into their buffers, a bool's inside a byte)
    batch = table.to_batches()[0].slice(start, length)
    assert batch.column("b").offset == start
    assert np.array_equal(to_records(batch, MIXED, text=False), data[start : start + length])
    # a column of another width is cast (int32 values into an i8 field), safely
    wider = np.dtype([("i4", "<i8")])
    assert np.array_equal(to_records(batch, wider, text=False)["i4"], data["i4"][start : start + length])


def test_reading_a_parquet_file_leaves_pandas_unimported(tmp_path):
    # pyarrow's Array.to_numpy imports pandas (0.15 s) at its first call: a freshly forked
    # executor reading files would spend that inside its run
    pq.write_table(pa.table({"t": np.arange(1000, dtype=np.int64), "k": np.arange(1000, dtype=np.int32) % 7}),
                   tmp_path / "a.parquet")
    code = f"""
import sys
import numpy as np
import slashrt
from slashrt.connectors import FileSource
flow = slashrt.Dataflow("f")
out = slashrt.sinks.Collect()
flow.source("s", {{"t": "i8", "k": "i8"}}, time="t").sink(out)
slashrt.run(flow, {{"s": FileSource({str(tmp_path)!r})}})
assert len(out.records) == 1000 and int(out.records["k"].sum()) == int((np.arange(1000) % 7).sum())
print("pandas" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
