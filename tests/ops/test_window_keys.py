"""Window keys of any fixed-width type up to 8 bytes (`slashrt.ops.keys`): strings (`S<n>`),
raw bytes (`V<n>`), booleans and floats key a window as integers do, exactly against numpy, on
one executor and several (slash and uppar, shm and tcp), and through a savepoint resumed on
another executor count; a float key's NaNs are one key and -0.0 another than 0.0; codes decode
to the very keys (hypothesis); a wider key is refused in one sentence, when the dataflow is
built or, for a column typed only at run time, when its first batch comes."""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slashrt
from slashrt import Dataflow, StopHandle, Tumbling, sinks
from slashrt.errors import SchemaError
from slashrt.ops.keys import codes, decode

NAMES = np.array([b"ab", b"cde", b"fghijk", b"", b"zz", b"q"], "S6")
FLOATS = np.array([0.5, -0.0, 0.0, np.nan, 1e300, -np.inf])


def records(n: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros(n, [("t", "<i8"), ("s", "S6"), ("f", "<f8"), ("b", "?"), ("w", "V3"), ("v", "<i8")])
    out["t"] = np.arange(n) // 100
    out["s"] = NAMES[rng.integers(0, len(NAMES), n)]
    out["f"] = FLOATS[rng.integers(0, len(FLOATS), n)]
    out["b"] = rng.integers(0, 2, n).astype(bool)
    out["w"] = rng.integers(0, 4, (n, 3)).astype(np.uint8).view("V3").reshape(-1)
    out["v"] = rng.integers(0, 10, n)
    return out


def flow(key: str, sink) -> Dataflow:
    f = Dataflow("keys")
    f.source("r", records(1).dtype, time="t").window(Tumbling(ms=100)).sum("v", key=key).sink(sink, name="out")
    return f


def canonical(keys: np.ndarray) -> list:
    """Keys as Python values that compare as the window compares them (a NaN equal to NaN)."""
    if keys.dtype.kind == "f":
        return [("nan",) if np.isnan(x) else (float(x), bool(np.signbit(x))) for x in keys]
    return [bytes(x) if keys.dtype.kind == "V" else x.item() for x in keys]


def expected(data: np.ndarray, key: str) -> dict:
    out: dict = {}
    for start, k, v in zip((data["t"] // 100 * 100).tolist(), canonical(data[key]), data["v"].tolist()):
        out[(start, k)] = out.get((start, k), 0) + v
    return out


def got(rows: np.ndarray, key: str) -> dict:
    keys = canonical(rows[key])
    assert len(set(zip(rows["window_start"].tolist(), keys))) == len(rows)  # one row per window and key
    return dict(zip(zip(rows["window_start"].tolist(), keys), rows["sum_v"].tolist()))


@pytest.mark.parametrize("key", ["s", "f", "b", "w"])
@pytest.mark.parametrize("options", [{}, {"executors": 2}, {"executors": 3, "mode": "uppar"},
                                     {"executors": 2, "transport": "tcp", "mode": "uppar"}],
                         ids=["one", "2-slash", "3-uppar", "2-tcp-uppar"])
def test_keys_of_any_fixed_width_type_key_a_window_exactly(key, options):
    data = records(60_000)
    sink = sinks.Collect()
    slashrt.run(flow(key, sink), {"r": data}, **options)
    rows = sink.records
    assert rows.dtype[key] == data.dtype[key]  # the key comes back in its own type
    assert got(rows, key) == expected(data, key)


def test_a_float_keys_nans_are_one_key_and_minus_zero_another():
    data = records(10_000)
    sink = sinks.Collect()
    slashrt.run(flow("f", sink), {"r": data})
    first = sink.records[sink.records["window_start"] == 0]["f"]
    assert np.isnan(first).sum() == 1 and ((first == 0) & np.signbit(first)).sum() == 1
    assert ((first == 0) & ~np.signbit(first)).sum() == 1


def test_string_keys_through_a_savepoint_resumed_on_another_executor_count(tmp_path):
    data = records(60_000)
    stop = StopHandle()
    seen = [0]

    def watch(batch):
        seen[0] += len(batch)
        if seen[0] > 10_000:
            stop.request()
        return np.ones(len(batch), bool)

    def job(pace):
        f = Dataflow("keys")
        source = f.source("r", data.dtype, time="t")
        if pace:
            source = source.filter(watch, name="watch")
        source.window(Tumbling(ms=100)).sum("v", key="s").sink(sinks.Collect(transactional=True), name="out")
        return f

    # small rings: the source is still feeding when the stop is asked
    first = slashrt.run(job(True), {"r": data}, checkpoint_dir=tmp_path, stop=stop, slots=4, slot_size=1024)
    assert first.savepoint is not None and first.records < len(data)
    second = slashrt.run(job(False), {"r": data}, checkpoint_dir=tmp_path, resume_from="latest", executors=2)
    rows = np.concatenate([first["keys.out"], second["keys.out"]])
    assert got(rows, "s") == expected(data, "s")


@pytest.mark.parametrize(("dtype", "clause"), [
    ("S16", "is |S16, 16 bytes wide: a key is at most 8 bytes"),
    ("m8[s]", "is timedelta64[s]: a key is an integer, bytes (S<n>, V<n>), a boolean or a float column"),
    ("c16", "is complex128: a key is an integer, bytes"),
])
def test_a_key_wider_than_8_bytes_or_of_another_kind_is_refused_in_one_sentence(dtype, clause):
    f = Dataflow("wide")
    source = f.source("r", {"t": "i8", "k": dtype, "v": "i8"}, time="t")
    with pytest.raises(SchemaError) as caught:
        source.window(Tumbling(ms=10)).sum("v", key="k")
    assert str(caught.value).startswith(f"sum: key column 'k' {clause}")
    assert "\n" not in str(caught.value)


def test_a_key_typed_only_at_run_time_is_refused_when_it_comes():
    f = Dataflow("late_typed")
    source = f.source("r", {"t": "i8", "v": "i8"}, time="t")
    source.with_column("k", lambda b: np.full(len(b), b"a-long-key-name", "S16")).window(Tumbling(ms=10)).sum(
        "v", key="k").sink(sinks.Collect())
    data = np.zeros(10, [("t", "<i8"), ("v", "<i8")])
    with pytest.raises(slashrt.OperatorError, match="key column 'k' is |S16, 16 bytes wide"):
        slashrt.run(f, {"r": data})


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["S1", "S3", "S8", "V2", "V8", "?", "<f8", ">f8", "<f4", "<i4", "<u8", "<i8"]),
       st.integers(0, 300), st.integers(0, 2**32))
def test_codes_decode_to_the_keys_and_distinct_keys_have_distinct_codes(dtype, n, seed):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    raw = rng.integers(0, 4, (n, dtype.itemsize)).astype(np.uint8)  # few byte values: many equal keys
    keys = raw.view(dtype).reshape(-1) if dtype.kind != "b" else raw[:, 0].astype(bool)
    c = codes(keys)
    assert c.dtype == np.int64 and c.shape == (n,)
    back = decode(c, dtype if dtype.kind not in "f" else dtype.newbyteorder("<"))
    assert canonical(back) == canonical(keys)
    # equal keys, equal codes; distinct keys, distinct codes
    assert len(set(c.tolist())) == len(set(canonical(keys)))


@pytest.mark.parametrize("key", ["s", "w"])
@pytest.mark.parametrize("options", [{"executors": 3}, {"executors": 2, "transport": "tcp"}], ids=["3-shm", "2-tcp"])
def test_an_exchange_on_a_string_key_puts_each_key_on_one_executor(key, options):
    data = records(30_000)
    out = np.dtype([(key, data.dtype[key]), ("pid", "<i8")])

    class Tag(slashrt.Operator):
        """Each record with the process (the executor) it reached."""

        async def on_batch(self, ctx, port, batch):
            rows = np.empty(len(batch), out)
            rows[key], rows["pid"] = batch[key], os.getpid()
            await ctx.emit(rows)

    sink = sinks.Collect()
    f = Dataflow("xk")
    f.source("r", data.dtype, time="t").exchange(key=key).operator(Tag(), schema={key: out[key], "pid": "i8"}).sink(sink)
    slashrt.run(f, {"r": data}, **options)
    rows = sink.records
    assert len(rows) == len(data) and len(set(rows["pid"].tolist())) > 1  # every record; more than one executor
    pids: dict = {}
    for k, pid in zip(canonical(rows[key]), rows["pid"].tolist()):
        pids.setdefault(k, set()).add(pid)
    assert set(pids) == set(canonical(data[key])) and all(len(p) == 1 for p in pids.values())  # a key, one executor
