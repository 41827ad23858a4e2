"""Schema: packed little-endian layout, validation of fields, compatibility of input dtypes."""

import re

import numpy as np
import pytest

from slashrt import Schema, SchemaError


def test_fields_are_packed_back_to_back():
    s = Schema({"t": "i8", "flag": "u1", "x": "i4", "tag": "S3"})
    assert s.names == ("t", "flag", "x", "tag")
    assert [s.dtype.fields[n][1] for n in s.names] == [0, 8, 9, 13]
    assert s.record_size == 8 + 1 + 4 + 3 == s.dtype.itemsize


def test_list_of_pairs_keeps_order():
    s = Schema([("b", "u2"), ("a", "f8")])
    assert s.names == ("b", "a")
    assert s.field("a") == np.dtype("<f8")
    assert "a" in s and "c" not in s


def test_big_endian_fields_become_little_endian():
    s = Schema({"x": ">i8", "y": ">f4"})
    assert s.field("x").str == "<i8"
    assert s.field("y").str == "<f4"


def test_equality_and_hash_follow_the_layout():
    assert Schema({"a": "i8"}) == Schema([("a", "<i8")])
    assert hash(Schema({"a": "i8"})) == hash(Schema([("a", "<i8")]))
    assert Schema({"a": "i8"}) != Schema({"a": "i4"})
    assert Schema({"a": "i8"}) != np.dtype([("a", "<i8")])


def test_from_dtype_packs_an_aligned_dtype():
    aligned = np.dtype([("t", "i8"), ("flag", "u1"), ("x", "i8")], align=True)
    s = Schema.from_dtype(aligned)
    assert s.record_size == 17 < aligned.itemsize
    assert s.names == ("t", "flag", "x")


def test_from_dtype_rejects_a_plain_dtype():
    with pytest.raises(SchemaError, match="not a structured dtype"):
        Schema.from_dtype(np.dtype("i8"))


def test_field_of_unknown_name_lists_the_fields():
    s = Schema({"t": "i8", "k": "i8"})
    with pytest.raises(SchemaError, match=r"'nope'.*\['t', 'k'\]"):
        s.field("nope")


@pytest.mark.parametrize(
    "fields, match",
    [
        ({}, "at least one field"),
        ([], "at least one field"),
        ([("a", "i8"), ("a", "i4")], "duplicate"),
        ({"a": "not-a-type"}, "'a'.*not a numpy dtype"),
        ({"a": object}, "'a'.*fixed-size scalar"),
        ({"a": "V0"}, "'a'.*fixed-size scalar"),
        ({"a": [("x", "i4")]}, "'a'.*fixed-size scalar"),
        ({"a": "(3,)i4"}, "'a'.*fixed-size scalar"),
        ({"": "i8"}, "non-empty strings"),
        ([(1, "i8")], "non-empty strings"),
    ],
)
def test_bad_schemas_raise_schema_error(fields, match):
    with pytest.raises(SchemaError, match=match):
        Schema(fields)


def test_schema_error_is_a_value_error():
    with pytest.raises(ValueError):
        Schema({})


# -- check_compatible ------------------------------------------------------------------------------

S = Schema({"t": "i8", "k": "u4", "filler": "V6"})


def test_identical_dtype_is_compatible():
    S.check_compatible(S.dtype, "input")


def test_bytes_filler_is_accepted_for_void_and_back():
    S.check_compatible(np.dtype([("t", "<i8"), ("k", "<u4"), ("filler", "S6")]), "input")
    Schema({"f": "S6"}).check_compatible(np.dtype([("f", "V6")]), "input")


def test_extra_names_at_the_same_size_do_not_matter():
    # field names beyond the schema's may overlay its bytes (e.g. a finer view of the filler)
    dt = np.dtype({"names": ["t", "k", "filler", "hi"], "formats": ["<i8", "<u4", "V6", "u1"], "offsets": [0, 8, 12, 17]})
    S.check_compatible(dt, "input")


@pytest.mark.parametrize(
    "dtype, match",
    [
        (np.dtype("i8"), "input: expected a structured array"),
        (np.dtype([("t", "<i8"), ("k", "<u4")]), "missing field 'filler'"),
        (np.dtype([("t", "<i8"), ("kk", "<u4"), ("filler", "V6")]), "missing field 'k'"),
        (np.dtype([("k", "<u4"), ("t", "<i8"), ("filler", "V6")]), "field 't' is at byte offset 4, expected 0: the fields are in another order"),
        (np.dtype([("t", "<i8"), ("k", "<u8"), ("filler", "V2")]), "'k' is <u8 (8 bytes), expected <u4 (4 bytes)"),
        (np.dtype([("t", "<f8"), ("k", "<u4"), ("filler", "V6")]), "'t' has type <f8, expected <i8"),
        (np.dtype([("t", "<i8"), ("k", "<i4"), ("filler", "V6")]), "'k' has type <i4, expected <u4"),
        (np.dtype([("t", "<i8"), ("k", "<u4"), ("filler", "u2"), ("x", "u4")]), "'filler' has type <u2, expected |V6"),
        (np.dtype([("t", ">i8"), ("k", "<u4"), ("filler", "V6")]), "'t' is big-endian (>i8)"),
        (np.dtype([("t", "<i8"), ("k", "<u4"), ("filler", "V6"), ("x", "u1")]), "records are 19 bytes, the schema's 18"),
    ],
)
def test_incompatible_dtypes_name_what_is_wrong(dtype, match):
    with pytest.raises(SchemaError, match=re.escape(match)):
        S.check_compatible(dtype, "input")


@pytest.mark.parametrize("spec", [str, "U4", "<U8"])
def test_a_str_field_suggests_fixed_size_bytes(spec):
    with pytest.raises(SchemaError, match=r"field 'name'.*str \(unicode\).*fixed-size bytes type such as 'S\d+'"):
        Schema({"name": spec})


# -- conform -----------------------------------------------------------------------------------------


def sample(n=5):
    a = np.zeros(n, S.dtype)
    a["t"] = np.arange(n) + 7
    a["k"] = np.arange(n) * 3
    a["filler"] = [bytes([i]) * 6 for i in range(n)]
    return a


def test_conform_returns_an_array_of_the_layout_as_it_is():
    a = sample()
    assert S.conform(a, "input") is a


def test_conform_reorders_fields_given_by_name_in_another_order():
    a = sample()
    other = np.zeros(len(a), [("filler", "V6"), ("k", "<u4"), ("t", "<i8")])
    for n in S.names:
        other[n] = a[n]
    got = S.conform(other, "input")
    assert got.dtype == S.dtype
    assert got.tobytes() == a.tobytes()


def test_conform_byteswaps_big_endian_fields_once():
    a = sample()
    big = a.astype([("t", ">i8"), ("k", ">u4"), ("filler", "V6")])
    got = S.conform(big, "input")
    assert got.dtype == S.dtype
    assert got["t"].tolist() == [7, 8, 9, 10, 11]  # not 504403158265495552 = 7 read the wrong way round
    assert got.tobytes() == a.tobytes()


def test_conform_reads_datetime64_as_milliseconds():
    a = sample(3)
    dated = np.zeros(3, [("t", "M8[us]"), ("k", "<u4"), ("filler", "V6")])
    dated["t"] = np.array(["1970-01-01T00:00:01.5", "2024-01-01", "1970-01-01"], dtype="M8[us]")
    dated["k"] = a["k"]
    got = S.conform(dated, "input")
    assert got["t"].tolist() == [1500, 1704067200000, 0]
    assert got["k"].tolist() == a["k"].tolist()


@pytest.mark.parametrize(
    "dtype, match",
    [
        ([("t", "<i8"), ("k", "<u4"), ("filler", "V6"), ("extra", "u1")], "fields ['extra'] are not in the schema"),
        ([("k", "<u4"), ("t", "<i4"), ("filler", "V6")], "field 't' is <i4 (4 bytes), expected <i8 (8 bytes)"),
        ([("t", "<i8"), ("k", "<U1"), ("filler", "V6")], "field 'k' is a str array (<U1)"),
        ([("t", "<i8"), ("k", "M8[ms]"), ("filler", "V6")], "field 'k' is datetime64[ms] and the schema's is <u4"),
    ],
)
def test_conform_refuses_naming_the_field(dtype, match):
    with pytest.raises(SchemaError, match=re.escape(match)):
        S.conform(np.zeros(2, dtype), "input")
