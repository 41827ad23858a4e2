"""Restart strategies: the decisions on random failure times, and parsing user options."""

from hypothesis import given, settings
from hypothesis import strategies as st
import pytest

from slashrt.errors import OptionError
from slashrt.snapshot.restart import FailureRate, FixedDelay, GiveUp, NoRestart, Restart, parse_restart, parse_seconds

FAST = settings(max_examples=80, derandomize=True, deadline=None)

gaps = st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=20)


def times(gap_list):
    now, out = 0.0, []
    for gap in gap_list:
        now += gap
        out.append(now)
    return out


def test_no_restart_gives_up_at_once_and_says_how_to_recover():
    decision = NoRestart().on_failure(0.0)
    assert isinstance(decision, GiveUp) and "fixed-delay" in decision.reason


@FAST
@given(st.integers(0, 5), st.floats(0, 10, allow_nan=False), gaps)
def test_fixed_delay_restarts_the_first_attempts_failures(attempts, delay, gap_list):
    strategy = FixedDelay(attempts, delay)
    decisions = [strategy.on_failure(t) for t in times(gap_list)]
    assert decisions[:attempts] == [Restart(delay)] * min(attempts, len(decisions))
    for decision in decisions[attempts:]:
        assert isinstance(decision, GiveUp) and f"allows {attempts} restart" in decision.reason


@FAST
@given(st.integers(1, 4), st.floats(1, 50, allow_nan=False), gaps)
def test_failure_rate_counts_the_failures_of_the_last_interval(max_failures, interval, gap_list):
    strategy = FailureRate(max_failures, interval, delay=0.5)
    seen = []
    for now in times(gap_list):
        seen.append(now)
        within = sum(1 for t in seen if now - interval < t <= now)
        decision = strategy.on_failure(now)
        assert (decision == Restart(0.5)) == (within <= max_failures)
        if isinstance(decision, GiveUp):
            assert f"{within} times within {interval:g} s" in decision.reason


def test_failure_rate_spread_out_never_gives_up_and_a_burst_does():
    strategy = FailureRate(max_failures=2, interval=10, delay=1)
    assert all(strategy.on_failure(t * 10.0) == Restart(1.0) for t in range(50))
    burst = FailureRate(max_failures=2, interval=10, delay=1)
    assert [type(burst.on_failure(t)) for t in (0, 1, 2)] == [Restart, Restart, GiveUp]


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, NoRestart),
        ("none", NoRestart),
        ("fixed-delay", FixedDelay),
        ("Fixed-Delay: attempts=3, delay=250ms", FixedDelay),
        ({"strategy": "failure-rate", "max_failures": 3, "interval": "1min", "delay": 2}, FailureRate),
    ],
)
def test_parse(value, expected):
    assert isinstance(parse_restart(value), expected)


def test_parse_values():
    fixed = parse_restart("fixed-delay:attempts=3,delay=250ms")
    assert (fixed.attempts, fixed.delay) == (3, 0.25)
    rate = parse_restart("failure-rate:max-failures=2,interval=1.5min,delay=1h")
    assert (rate.max_failures, rate.interval, rate.delay) == (2, 90.0, 3600.0)
    strategy = FixedDelay()
    assert parse_restart(strategy) is strategy


@pytest.mark.parametrize(
    "value, message",
    [
        ("restart-always", "must be one of none, fixed-delay, failure-rate, got 'restart-always'"),
        ("fixed-delay:atempts=3", "takes attempts, delay; 'atempts' is not one of them"),
        ("fixed-delay:attempts=-1", "attempts must be a whole number >= 0, got '-1'"),
        ("fixed-delay:attempts=2.5", "attempts must be a whole number"),
        ("fixed-delay:delay=soon", "delay must be a duration >= 0"),
        ("failure-rate:interval=0s", "interval must be a duration > 0"),
        ("failure-rate:max-failures=0", "max-failures must be a whole number >= 1"),
        ("fixed-delay:attempts", "is not key=value"),
        ({"attempts": 3}, "give its name as 'strategy'"),
        (3, "must be a string like"),
    ],
)
def test_bad_options_get_one_sentence(value, message):
    with pytest.raises(OptionError) as caught:
        parse_restart(value)
    assert message in str(caught.value) and str(caught.value).count("\n") == 0


@pytest.mark.parametrize("value, seconds", [(2, 2.0), (0.5, 0.5), ("250ms", 0.25), ("3", 3.0), ("1e-3s", 0.001), ("2min", 120.0)])
def test_parse_seconds(value, seconds):
    assert parse_seconds(value, "x") == seconds


@pytest.mark.parametrize("value", [-1, float("inf"), float("nan"), "1 day", True, None, "-2s"])
def test_parse_seconds_refuses(value):
    with pytest.raises(OptionError, match="^x must be a duration"):
        parse_seconds(value, "x")
