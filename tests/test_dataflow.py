"""The fluent dataflow API: step ids, build-time validation, and input validation by `run`."""

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, DataflowError, OperatorError, Schema, SchemaError, Sliding, Tumbling, sinks

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "f8", "tag": "S4"})


def events(flow=None, **kw):
    flow = flow or Dataflow("f")
    return flow, flow.source("events", SCHEMA, time="t", **kw)


def rows(n=100):
    a = np.zeros(n, SCHEMA.dtype)
    a["t"] = np.arange(n)
    a["k"] = np.arange(n) % 4
    a["v"] = 1.0
    return a


# -- step ids --------------------------------------------------------------------------------------


def test_step_ids_are_dotted_flow_and_step_names():
    flow, src = events()
    assert src.step_id == "f.events"
    f = src.filter(lambda b: b["k"] > 0)
    assert f.step_id == "f.filter_1"
    w = f.with_column("k2", lambda b: b["k"] * 2, name="double")
    assert w.step_id == "f.double"
    c = w.window(Tumbling(ms=10)).count(key="k2")
    assert c.step_id == "f.count_window_2"
    assert c.sink(sinks.Collect(), name="out") == "f.out"
    assert list(flow.steps) == ["f.events", "f.filter_1", "f.double", "f.count_window_2", "f.out"]


def test_apply_is_named_after_its_function_and_a_lambda_is_numbered():
    flow, src = events()

    async def views(batch):
        return batch

    assert src.apply(views).step_id == "f.views"
    assert src.apply(lambda b: b).step_id == "f.apply_1"
    assert src.apply(views, name="again").step_id == "f.again"


def test_a_sink_learns_its_step_id():
    flow, src = events()
    c = sinks.Collect()
    src.sink(c)
    assert c.step_id == "f.collect_1"


@pytest.mark.parametrize("second", ["source", "filter", "sink"])
def test_duplicate_step_names_are_rejected(second):
    flow, src = events()
    src.filter(lambda b: b["k"] > 0, name="dup")
    with pytest.raises(DataflowError, match=r"step id 'f\.dup' is used twice"):
        if second == "source":
            flow.source("dup", SCHEMA)
        elif second == "filter":
            src.filter(lambda b: b["k"] > 1, name="dup")
        else:
            src.sink(sinks.Collect(), name="dup")


@pytest.mark.parametrize("bad", ["", "a.b", "1x", "with space"])
def test_names_must_be_identifier_like(bad):
    with pytest.raises(DataflowError, match="identifier-like"):
        Dataflow(bad)
    flow, src = events()
    with pytest.raises(DataflowError, match="identifier-like"):
        src.filter(lambda b: b["k"] > 0, name=bad)


# -- build-time validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build, column",
    [
        (lambda s: s.project("t", "nope"), "nope"),
        (lambda s: s.window(Tumbling(ms=10), time="when"), "when"),
        (lambda s: s.window(Tumbling(ms=10)).count(key="nokey"), "nokey"),
        (lambda s: s.window(Tumbling(ms=10)).sum("novalue", key="k"), "novalue"),
        (lambda s: s.window(Sliding(size_ms=10, slide_ms=5)).mean("novalue", key="k"), "novalue"),
        (lambda s: s.project("k", "v").window(Tumbling(ms=10), time="t"), "t"),
        (lambda s: s.with_column("x", lambda b: b["k"]).window(Tumbling(ms=10)).max("y", key="x"), "y"),
    ],
)
def test_unknown_columns_raise_schema_error_naming_them_at_build_time(build, column):
    flow, src = events()
    with pytest.raises(SchemaError, match=f"unknown column '{column}'; the stream from 'f\\."):
        build(src)


def test_columns_added_by_with_column_are_known_downstream():
    flow, src = events()
    s = src.with_column("campaign", lambda b: b["k"] // 2, dtype="i8")
    assert s.fields["campaign"] == np.dtype("i8")
    out = s.window(Tumbling(ms=10)).sum("v", key="campaign")
    assert list(out.fields) == ["window_start", "window_end", "campaign", "sum_v"]
    assert out.fields["sum_v"] == np.dtype("<f8")
    assert out.time == "window_end"


def test_apply_with_a_schema_declares_its_output_columns():
    flow, src = events()
    s = src.apply(lambda b: b, schema={"k": "i8", "w": "f8"})
    assert list(s.fields) == ["k", "w"]
    assert s.time is None
    with pytest.raises(DataflowError, match="no event-time column"):
        s.window(Tumbling(ms=10))
    with pytest.raises(DataflowError, match="callable"):
        src.apply("not a function")


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda s: s.with_column("wide", lambda b: b["tag"], dtype="S16").window(Tumbling(ms=10)).count(key="wide"),
         "key column 'wide' is |S16, 16 bytes wide"),
        (lambda s: s.window(Tumbling(ms=10)).sum("tag", key="k"), "column 'tag' must be numeric"),
        (lambda s: s.with_column("bad name", lambda b: b["k"]), "identifier-like"),
    ],
)
def test_wrong_column_types_raise_schema_error(build, match):
    flow, src = events()
    with pytest.raises(SchemaError, match=match):
        build(src)


def test_result_columns_must_not_clash():
    flow, src = events()
    with pytest.raises(SchemaError, match=r"\['window_start', 'window_end', 'k', 'k'\] must have distinct names"):
        src.window(Tumbling(ms=10)).count(key="k", output="k")
    with pytest.raises(SchemaError, match="must have distinct names"):
        src.window(Tumbling(ms=10)).sum("v", key="k", output="window_end")
    with pytest.raises(SchemaError, match="must have distinct names"):
        src.with_column("window_start", lambda b: b["k"]).window(Tumbling(ms=10)).count(key="window_start")


def test_window_without_a_time_column_raises():
    flow = Dataflow("f")
    src = flow.source("events", SCHEMA)  # no time=
    with pytest.raises(DataflowError, match="no event-time column"):
        src.window(Tumbling(ms=10))
    # naming one on the window works
    assert src.window(Tumbling(ms=10), time="t").time == "t"


def test_project_dropping_the_time_column_drops_event_time():
    flow, src = events()
    with pytest.raises(DataflowError, match="no event-time column"):
        src.project("k", "v").window(Tumbling(ms=10))


@pytest.mark.parametrize(
    "kw, exc, match",
    [
        (dict(time="nope"), SchemaError, "time column 'nope' is not in"),
        (dict(time="v"), SchemaError, "time column 'v' must be an integer"),
        (dict(time="t", max_delay=-1), DataflowError, "max_delay must be a whole number of milliseconds .* from 0"),
        (
            dict(time="t", time_unit="us", max_delay=-1),
            DataflowError,
            r"max_delay must be a whole number of microseconds \(the source's time_unit\)",
        ),
        (dict(time="t", time_unit="s", max_delay=0.5), DataflowError, "max_delay must be a whole number of seconds"),
        (dict(time="t", max_delay=1.5), DataflowError, r"source 'events': max_delay .* got 1\.5"),
        (dict(time="t", max_delay=2**63 - 1), DataflowError, "from 0 to 2\\*\\*62, got 9223372036854775807"),
        (dict(time="t", max_delay=True), DataflowError, "got True"),
    ],
)
def test_bad_sources_raise(kw, exc, match):
    with pytest.raises(exc, match=match):
        Dataflow("f").source("events", SCHEMA, **kw)


def test_a_datetime64_time_column_says_to_declare_milliseconds():
    with pytest.raises(SchemaError, match=r"time column 't' is datetime64\[ns\]; declare it 'i8' \(milliseconds"):
        Dataflow("f").source("events", {"t": "M8[ns]", "k": "i8"}, time="t")


def test_datetime64_input_for_the_time_column_is_read_as_milliseconds():
    dated = np.zeros(10, [("t", "M8[s]"), ("k", "<i8"), ("v", "<f8"), ("tag", "S4")])
    dated["t"] = np.arange(10).astype("M8[s]")
    out = slashrt.run(collecting_flow(), {"events": dated})["f.out"]
    assert out["t"].tolist() == [1000 * i for i in range(10)]


@pytest.mark.parametrize("assigner", [object(), 10, "10s"])
def test_window_needs_an_assigner_at_build_time(assigner):
    flow, src = events()
    with pytest.raises(DataflowError, match=r"window\(\) after 'f\.events': .* is no window assigner; give slashrt\.Tumbling"):
        src.window(assigner)


def test_with_column_with_a_bad_dtype_names_the_column():
    flow, src = events()
    with pytest.raises(SchemaError, match=r"with_column\('x'\): dtype 'nope' is not a numpy dtype"):
        src.with_column("x", lambda b: b["k"], dtype="nope")


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Tumbling(ms=0), "positive"),
        (lambda: Tumbling(ms=1.5), "whole number"),
        (lambda: Tumbling(ms=10, seconds=1), "exactly one"),
        (lambda: Sliding(size_ms=10, slide_ms=20), "longer than the window size"),
    ],
)
def test_bad_window_lengths_raise(make, match):
    with pytest.raises(DataflowError, match=match):
        make()


def test_seconds_are_milliseconds_times_1000():
    assert Tumbling(seconds=10).size == 10_000
    w = Sliding(seconds=10, every_seconds=4)
    assert (w.size, w.slide, w.slice_len) == (10_000, 4_000, 2_000)


# -- validation by run -------------------------------------------------------------------------------


def test_a_dataflow_without_sink_does_not_run():
    flow, src = events()
    src.filter(lambda b: b["k"] > 0)
    with pytest.raises(DataflowError, match="'f' has no sink"):
        slashrt.run(flow, {"events": rows()})


@pytest.mark.parametrize(
    "option, match",
    [
        ("slotsize", r"unknown option slotsize=; the options are executors, transport, mode and .*coalesce.*slot_size"),
        ("partitions", r"partitions= is an option of multi-executor runs; give executors=N"),
    ],
)
def test_a_wrong_keyword_to_run_lists_the_valid_ones(option, match):
    with pytest.raises(DataflowError, match=match):
        slashrt.run(collecting_flow(), {"events": rows()}, **{option: 4096})


def test_run_names_every_option_of_the_paths_it_takes_with_their_defaults():
    """`run`'s signature is where a user reads the options: every keyword of the local path
    (`run_async`) and of a cluster's (`run_cluster_async` and its attempts) is there, the local
    path's with the same default (`run` passes on only what differs from it)."""
    import inspect

    from slashrt._run import _RUN_DEFAULTS, _keywords
    from slashrt._runtime import run_async
    from slashrt.cluster import run_cluster_async

    local = inspect.signature(run_async).parameters
    assert set(local) - {"flow", "inputs"} <= set(_RUN_DEFAULTS)
    assert all(_RUN_DEFAULTS[name] == p.default for name, p in local.items() if name in _RUN_DEFAULTS)
    internal = {"executors", "transport", "mode", "marks", "committed", "zygote", "blobs"}  # (given by run, or the recovery loop's)
    cluster = (_keywords(run_cluster_async) | _keywords(run_cluster_async.attempt)) - internal
    assert cluster <= set(_RUN_DEFAULTS)
    assert set(_RUN_DEFAULTS) - set(local) - cluster == {"ssb_routing"}  # (each attempt reads it from its options)


def test_a_wrong_keyword_to_a_cluster_run_is_refused_before_executors_start():
    with pytest.raises(DataflowError, match="unknown option epochbytes="):
        slashrt.run(collecting_flow(), {"events": rows()}, executors=2, epochbytes=1)


def test_run_with_a_name_says_a_dataflow_is_needed():
    with pytest.raises(DataflowError, match=r"run\(\) needs a Dataflow as its first argument, got str 'f'"):
        slashrt.run("f", {"events": rows()})


def test_a_dataflow_without_source_does_not_run():
    with pytest.raises(DataflowError, match="'f' has no source"):
        slashrt.run(Dataflow("f"), {})


def collecting_flow():
    flow, src = events()
    src.sink(sinks.Collect(), name="out")
    return flow


def test_inputs_by_source_name_or_step_id():
    a = rows()
    assert np.array_equal(slashrt.run(collecting_flow(), {"events": a})["f.out"], a)
    assert np.array_equal(slashrt.run(collecting_flow(), {"f.events": a})["f.out"], a)


def test_a_missing_input_names_the_source():
    with pytest.raises(DataflowError, match="no input given for source 'events'"):
        slashrt.run(collecting_flow(), {})


def test_an_input_for_an_unknown_source_is_rejected():
    with pytest.raises(DataflowError, match=r"unknown sources \['evnts'\]; the sources are \['events'\]"):
        slashrt.run(collecting_flow(), {"events": rows(), "evnts": rows()})


@pytest.mark.parametrize(
    "bad, exc, match",
    [
        (np.zeros(3, [("t", "<i8"), ("k", "<i8"), ("v", "<f8")]), SchemaError, "missing field 'tag'"),
        (np.zeros(3, [("t", "<i8"), ("k", "<i8"), ("v", "<i8"), ("tag", "S4")]), SchemaError, "'v' has type <i8"),
        (np.zeros(3, [("t", "<i8"), ("key", "<i8"), ("v", "<f8"), ("tag", "S4")]), SchemaError, "missing field 'k'"),
        (np.zeros((2, 3), SCHEMA.dtype), SchemaError, "must be 1-D"),
        (np.zeros(3, [("t", "<i8"), ("k", "<i8"), ("v", "<f8"), ("tag", "U4")]), SchemaError, "'tag' is a str array"),
        ([1, 2, 3], TypeError, "must be a numpy structured array"),
    ],
)
def test_a_wrong_input_names_the_source(bad, exc, match):
    with pytest.raises(exc, match=f"input for source 'f.events'.*{match}"):
        slashrt.run(collecting_flow(), {"events": bad})


def test_an_input_with_void_filler_instead_of_bytes_is_accepted():
    a = rows()
    other = a.view(np.dtype([("t", "<i8"), ("k", "<i8"), ("v", "<f8"), ("tag", "V4")]))
    out = slashrt.run(collecting_flow(), {"events": other})["f.out"]
    assert np.array_equal(out.view(np.uint8), a.view(np.uint8))


def test_big_endian_and_reordered_inputs_are_converted_once_at_input():
    a = rows(10)
    big = a.astype([("t", ">i8"), ("k", ">i8"), ("v", ">f8"), ("tag", "S4")])
    reordered = np.zeros(10, [("tag", "S4"), ("v", "<f8"), ("k", "<i8"), ("t", "<i8")])
    for n in SCHEMA.names:
        reordered[n] = a[n]
    for given in (big, reordered):
        out = slashrt.run(collecting_flow(), {"events": given})["f.out"]
        assert out.dtype == SCHEMA.dtype
        assert out["t"].tolist() == list(range(10))  # not 72057594037927936 for 1 read the wrong way round
        assert out.tobytes() == a.tobytes()


def test_unknown_column_inside_a_filter_fails_at_run_time_naming_step_and_column():
    # a predicate is code: its columns are only known when it runs
    flow, src = events()
    src.filter(lambda b: b["nope"] > 0, name="keep").sink(sinks.Collect())
    with pytest.raises(OperatorError, match=r"step 'f\.keep'.*no column 'nope'"):
        slashrt.run(flow, {"events": rows()})


# -- empty results -----------------------------------------------------------------------------------


def test_an_empty_result_is_an_empty_array_of_the_stream_dtype():
    flow, src = events()
    out, late = sinks.Collect(), sinks.Collect()
    kept = src.filter(lambda b: b["k"] > 99).with_column("k", lambda b: b["k"] * 2, dtype="i4")
    kept.window(Tumbling(ms=10), late=late).sum("v", key="k").sink(out, name="sums")
    raw = sinks.Collect()
    src.filter(lambda b: b["k"] > 99).sink(raw, name="raw")
    result = slashrt.run(flow, {"events": rows()})
    assert out.records.dtype.names == ("window_start", "window_end", "k", "sum_v") and len(out.records) == 0
    assert result["f.sums"].dtype == out.records.dtype
    assert late.records.dtype == np.dtype([("t", "<i8"), ("v", "<f8"), ("tag", "S4"), ("k", "<i4")])
    assert len(late.records) == 0
    assert raw.records.dtype == SCHEMA.dtype and len(raw.records) == 0


def test_an_empty_result_has_the_dtype_a_non_empty_one_has():
    def flow_with(keep):
        flow, src = events()
        out = sinks.Collect()
        src.filter(lambda b: b["k"] > keep).with_column("k", lambda b: b["k"] * 2, dtype="i8").with_column(
            "x", lambda b: b["v"] + 1, dtype="f8"
        ).sink(out)
        slashrt.run(flow, {"events": rows()})
        return out.records

    some, none = flow_with(0), flow_with(99)
    assert len(some) > 0 and len(none) == 0
    assert some.dtype == none.dtype
