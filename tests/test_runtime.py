"""Whole runs: YSB against its numpy reference over ring shapes and coalescing, `run_async`
under pytest-trio, several sources in one executor, and `ChannelFailed` for a bad channel."""

import numpy as np
import pytest
import structlog
import trio

import slashrt
import slashrt._runtime as runtime
from slashrt import ChannelFailed, Dataflow, MalformedBuffer, RunResult, Schema, SlashError, Tumbling, sinks
from slashrt.bench import ysb

CAMPAIGNS = 100
ADS = ysb.campaign_map(CAMPAIGNS)


def ysb_events(**kw):
    # 2 events per ms: 200k events span 100 s of event time, ten 10-second windows
    return ysb.generate(200_000, CAMPAIGNS, events_per_ms=2, **kw)


def run_ysb(events, max_delay=0, **options):
    out = sinks.Collect()
    result = slashrt.run(ysb.dataflow(ADS, out, max_delay=max_delay), {"events": events}, **options)
    return result, ysb.to_result(out.records)


@pytest.mark.parametrize("coalesce", [1, 16])
@pytest.mark.parametrize("slot_size", [4096, 65536])
def test_ysb_equals_the_reference(slot_size, coalesce):
    events = ysb_events()
    result, got = run_ysb(events, slot_size=slot_size, coalesce=coalesce)
    expected = ysb.reference(events, ADS)
    assert len(np.unique(expected["window_start_ms"])) == 10
    assert np.array_equal(got, expected)
    assert isinstance(result, RunResult)
    assert result.records == len(events)
    assert result.late_records == {"ysb.count_window_2": 0}
    assert result.stats[0].failed_channels == 0
    assert result.stats[0].buffers == -(-len(events) // ((slot_size - 32) // ysb.YSB_SCHEMA.record_size))
    assert 0 < result.stats[0].cpu_s  # the CPU seconds its run used, counted


@pytest.mark.parametrize("slot_size", [4096, 65536])
def test_ysb_with_zipf_skew(slot_size):
    events = ysb_events(zipf=1.2, seed=7)
    result, got = run_ysb(events, slot_size=slot_size)
    assert np.array_equal(got, ysb.reference(events, ADS))


@pytest.mark.parametrize("coalesce", [1, 16])
@pytest.mark.parametrize("slot_size", [4096, 65536])
def test_ysb_out_of_order_within_max_delay(slot_size, coalesce):
    events = ysb_events(disorder_ms=3000, seed=3)
    assert (np.diff(events["event_time"]) < 0).any()
    result, got = run_ysb(events, max_delay=3000, slot_size=slot_size, coalesce=coalesce)
    assert result.late_records == {"ysb.count_window_2": 0}
    assert np.array_equal(got, ysb.reference(events, ADS))


def test_ysb_disorder_beyond_max_delay_is_counted_late_never_lost():
    events = ysb_events(disorder_ms=3000, seed=3)
    result, got = run_ysb(events, max_delay=100, slot_size=4096, watermark_every=1)
    late = result.late_records["ysb.count_window_2"]
    views = int((events["event_type"] == ysb.VIEW).sum())
    assert late > 0
    assert int(got["count"].sum()) + late == views  # tumbling: a late view is in no window


async def test_run_async_inside_a_trio_test():
    events = ysb_events()[:50_000]
    out = sinks.Collect()
    with trio.fail_after(30):
        result = await slashrt.run_async(ysb.dataflow(ADS, out), {"events": events}, slot_size=8192)
    assert result["ysb.counts"] is out.records
    assert np.array_equal(ysb.to_result(out.records), ysb.reference(events, ADS))


def test_progress_reports_the_records_processed():
    seen = []
    events = ysb_events()[:20_000]
    slashrt.run(ysb.dataflow(ADS, sinks.Collect()), {"events": events}, on_records=seen.append)
    assert seen and seen[-1] == len(events)


# -- several sources in one executor, and a failing channel ----------------------------------------

SCHEMA = Schema({"t": "i8", "k": "i8"})


def two_source_flow():
    flow = Dataflow("f")
    for name in ("good", "bad"):
        src = flow.source(name, SCHEMA, time="t")
        src.window(Tumbling(ms=100)).count(key="k").sink(sinks.Collect(), name=f"{name}_out")
    return flow


def rows(n, seed):
    rng = np.random.default_rng(seed)
    a = np.zeros(n, SCHEMA.dtype)
    a["t"] = np.arange(n)
    a["k"] = rng.integers(-3, 3, n)
    return a


def counts(records):
    return sorted(zip(records["window_start"].tolist(), records["k"].tolist(), records["count"].tolist()))


def expected_counts(a):
    keys, n = np.unique(np.stack([a["t"] // 100 * 100, a["k"]], axis=1), axis=0, return_counts=True)
    return sorted(zip(keys[:, 0].tolist(), keys[:, 1].tolist(), n.tolist()))


def test_several_sources_run_side_by_side():
    good, other = rows(5000, 1), rows(3001, 2)
    result = slashrt.run(two_source_flow(), {"good": good, "bad": other}, slot_size=1024, slots=4)
    assert counts(result["f.good_out"]) == expected_counts(good)
    assert counts(result["f.bad_out"]) == expected_counts(other)
    assert result.records == 8001


def test_a_bad_channel_raises_channel_failed_with_the_healthy_results(monkeypatch):
    good, bad = rows(5000, 1), rows(777, 2)
    real_feed = runtime.feed_array

    async def feed(sender, records, **kw):
        if len(records) != len(bad):
            return await real_feed(sender, records, **kw)
        await sender.send_records(records[:10])
        sender.reserve()
        sender.post(nbytes=5, count=1)  # a footer that breaks the format
        await trio.sleep_forever()  # never closes: the runtime must not wait for it

    monkeypatch.setattr(runtime, "feed_array", feed)
    with structlog.testing.capture_logs() as logs:
        with pytest.raises(ChannelFailed, match=r"1 input channel\(s\) failed: f\.bad: footer claims 1 records") as info:
            slashrt.run(two_source_flow(), {"good": good, "bad": bad}, slot_size=1024, slots=4)
    errors = [e for e in logs if e["log_level"] == "error"]
    assert [(e["event"], e["channel"]) for e in errors] == [("channel closed after bad input", "f.bad")]
    err = info.value
    assert isinstance(err, SlashError)
    assert list(err.failed) == ["f.bad"] and isinstance(err.failed["f.bad"], MalformedBuffer)
    assert counts(err.result["f.good_out"]) == expected_counts(good)
    assert len(err.result["f.bad_out"]) == 0  # its windows never completed: no end of stream
    assert err.result.stats[0].failed_channels == 1
    assert err.result.records == len(good) + 10
