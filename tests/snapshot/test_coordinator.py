"""The checkpoint coordinator's decisions: triggering on trio's mock clock, acknowledgements and
aborts scripted and at random, stop-with-savepoint and the stop-the-world baseline's phases."""

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st
import pytest
import trio

from slashrt.errors import OptionError
from slashrt.snapshot.coordinator import (
    AckStats,
    CheckpointConfig,
    CheckpointCoordinator,
    CheckpointError,
    StopTheWorld,
)

FAST = settings(max_examples=60, derandomize=True, deadline=None)

STEPS = ("source", "window", "sink")
INSTANCES = [(step, executor) for step in STEPS for executor in (0, 1)]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def ack_all(coordinator, n, stats=AckStats()):
    done = [coordinator.ack(n, who, stats) for who in INSTANCES]
    assert done[:-1] == [None] * (len(INSTANCES) - 1)
    return done[-1]


# --- triggering ---------------------------------------------------------------------------------


def test_off_by_default():
    coordinator = CheckpointCoordinator(INSTANCES)
    assert coordinator.next_due() is None and coordinator.maybe_trigger() is None


async def test_periodic_triggers_keep_interval_and_min_pause(autojump_clock):
    """On trio's clock: the runtime's trigger loop sleeps until next_due; each checkpoint takes
    0.8 s to be acknowledged, so min_pause (0.5 s) pushes the next one past the interval (1 s)."""
    start = trio.current_time()
    coordinator = CheckpointCoordinator(INSTANCES, CheckpointConfig(interval=1.0, min_pause=0.5), clock=trio.current_time)
    triggered, completed = [], []

    async def acknowledge(n):
        await trio.sleep(0.8)
        completed.append((ack_all(coordinator, n).checkpoint, trio.current_time() - start))

    async with trio.open_nursery() as nursery:
        while len(triggered) < 4:
            await trio.sleep_until(coordinator.next_due())
            checkpoint = coordinator.maybe_trigger()
            if checkpoint is None:  # one in flight: wait for it to end
                await trio.sleep(0.1)
                continue
            triggered.append(round(checkpoint.triggered - start, 6))
            nursery.start_soon(acknowledge, checkpoint.checkpoint)
    assert triggered == [1.0, 2.3, 3.6, 4.9]
    assert [n for n, _ in completed] == [1, 2, 3, 4]


def test_max_in_flight_and_savepoints_bypass_it():
    clock = Clock()
    coordinator = CheckpointCoordinator(INSTANCES, CheckpointConfig(interval=1.0, max_in_flight=2), clock=clock)
    clock.now = 1.0
    assert coordinator.maybe_trigger().checkpoint == 1
    clock.now = 2.0
    assert coordinator.maybe_trigger().checkpoint == 2
    clock.now = 5.0
    assert coordinator.maybe_trigger() is None  # two in flight
    assert coordinator.trigger_savepoint().savepoint and len(coordinator.pending) == 3


# --- acknowledgements and aborts -------------------------------------------------------------------


def test_complete_when_every_instance_acked_with_stats():
    clock = Clock()
    coordinator = CheckpointCoordinator(INSTANCES, clock=clock)
    n = coordinator.trigger_savepoint().checkpoint
    clock.now = 2.5
    for i, who in enumerate(INSTANCES):
        done = coordinator.ack(n, who, AckStats(alignment_s=i * 0.1, sync_s=0.01, async_s=i, bytes=100))
    assert done.status == "completed" and coordinator.latest_completed is done
    report = coordinator.report()[0]
    assert report["bytes"] == 600 and report["acks"] == 6 and report["seconds"] == 2.5
    assert math.isclose(report["max_alignment_s"], 0.5) and report["max_async_s"] == 5


def test_decline_aborts_and_late_acks_are_ignored():
    coordinator = CheckpointCoordinator(INSTANCES)
    n = coordinator.trigger_savepoint().checkpoint
    coordinator.ack(n, INSTANCES[0])
    aborted = coordinator.decline(n, INSTANCES[1], "alignment subsumed by barrier 2")
    assert aborted.status == "aborted" and "subsumed by barrier 2" in aborted.reason
    assert coordinator.ack(n, INSTANCES[2]) is None and coordinator.decline(n, INSTANCES[2], "x") is None
    assert coordinator.ignored == 2 and coordinator.latest_completed is None


def test_failures_in_a_row_fail_the_job_past_the_tolerated_and_a_completion_resets_them():
    coordinator = CheckpointCoordinator(INSTANCES, CheckpointConfig(tolerable_failures=2))
    cause = "checkpoint {} could not be written to /d/chk-{}: No space left on device"

    def fail(failed=True):
        n = coordinator.trigger_savepoint().checkpoint
        coordinator.decline(n, INSTANCES[0], cause.format(n, n), failed=failed)
        return coordinator.failing(cause.format(n, n))

    assert fail() is None and fail() is None and coordinator.failures == 2
    assert fail(failed=False) is None and coordinator.failures == 2  # an alignment's abort is no failure
    ack_all(coordinator, coordinator.trigger_savepoint().checkpoint)
    assert coordinator.failures == 0
    assert fail() is None and fail() is None
    sentence = fail()
    assert sentence.startswith("checkpoint 7 could not be written to /d/chk-7: No space left on device (3 checkpoints in "
                               "a row failed, more than the 2 tolerated), so the job fails")
    # the run's last checkpoint has no next one to take its place: it fails at once
    assert "it was the run's final checkpoint" in CheckpointCoordinator(INSTANCES).failing("x", "final")


def test_an_unwritten_manifest_aborts_a_completed_checkpoint_and_counts():
    coordinator = CheckpointCoordinator(INSTANCES, CheckpointConfig(tolerable_failures=0))
    first = ack_all(coordinator, coordinator.trigger_savepoint().checkpoint)
    n = coordinator.trigger_savepoint().checkpoint
    coordinator.decline(n, INSTANCES[0], "full", failed=True)
    second = ack_all(coordinator, coordinator.trigger_savepoint().checkpoint)
    assert coordinator.failures == 0
    record = coordinator.unwritten(second.checkpoint, "its manifest: full")
    assert record.status == "aborted" and coordinator.latest_completed is first
    assert coordinator.failures == 2  # the failure before the completion counts again
    assert coordinator.failing("full") is not None


def test_completion_subsumes_older_pending_checkpoints():
    coordinator = CheckpointCoordinator(INSTANCES)
    first, second = coordinator.trigger_savepoint(), coordinator.trigger_savepoint()
    coordinator.ack(first.checkpoint, INSTANCES[0])
    assert ack_all(coordinator, second.checkpoint) is second
    assert first.status == "aborted" and first.reason == "subsumed by checkpoint 2"
    assert coordinator.ack(first.checkpoint, INSTANCES[1]) is None and coordinator.ignored == 1


def test_timeout_and_executor_loss_abort():
    clock = Clock()
    coordinator = CheckpointCoordinator(INSTANCES, CheckpointConfig(timeout=10.0), clock=clock)
    old = coordinator.trigger_savepoint()
    clock.now = 5.0
    young = coordinator.trigger_savepoint()
    clock.now = 10.0
    assert coordinator.expire() == [old] and "timed out after 10 s" in old.reason
    assert coordinator.executor_lost(1) == [young] and "executor 1 was lost" in young.reason
    assert not coordinator.pending


@pytest.mark.parametrize(
    "event, message",
    [
        (lambda c: c.ack(1, ("nope", 0)), "not an operator instance"),
        (lambda c: c.ack(9, INSTANCES[0]), "never triggered"),
        (lambda c: [c.ack(1, INSTANCES[0]), c.ack(1, INSTANCES[0])], "twice"),
    ],
)
def test_protocol_errors(event, message):
    coordinator = CheckpointCoordinator(INSTANCES)
    coordinator.trigger_savepoint()
    with pytest.raises(CheckpointError, match=message):
        event(coordinator)


# --- the laws over random event sequences -------------------------------------------------------------

KINDS = ["time"] * 3 + ["trigger"] * 2 + ["ack"] * 8 + ["decline", "expire", "lost"]


def random_events(rng, steps):
    """A random script: mostly acks, some time passing and triggers, a few aborts."""
    for _ in range(steps):
        kind = rng.choice(KINDS)
        if kind == "lost" and rng.random() < 0.7:
            kind = "ack"  # an executor loss aborts everything: keep it rare
        yield kind, (rng.uniform(0, 2) if kind == "time" else rng.randrange(40))


@FAST
@given(st.integers(1, 3), st.floats(0, 2, allow_nan=False), st.integers(10, 200), st.randoms(use_true_random=False))
def test_laws_over_random_events(max_in_flight, min_pause, steps, rng):
    clock = Clock()
    config = CheckpointConfig(interval=1.0, min_pause=min_pause, max_in_flight=max_in_flight, timeout=5.0)
    coordinator = CheckpointCoordinator(INSTANCES, config, clock=clock, history=1000)
    acked = {}  # n -> instances whose ack arrived while n was pending
    triggers, last_end, completed = [], -math.inf, []
    for kind, value in random_events(rng, steps):
        if kind == "time":
            clock.now += value
        elif kind == "trigger":
            checkpoint = coordinator.maybe_trigger()
            if checkpoint is not None:
                assert clock.now >= (triggers[-1] if triggers else 0.0) + 1.0 and clock.now >= last_end + min_pause
                triggers.append(clock.now)
                acked[checkpoint.checkpoint] = set()
        elif kind in ("ack", "decline") and acked:
            # mostly a pending checkpoint, sometimes a late one
            n = rng.choice(sorted(coordinator.pending) if coordinator.pending and rng.random() < 0.85 else sorted(acked))
            who = INSTANCES[value % len(INSTANCES)]
            if who in acked[n] and n in coordinator.pending:
                continue  # a second ack is a protocol error, tested above
            was_pending = n in coordinator.pending
            if kind == "decline":
                result = coordinator.decline(n, who, "test")
                assert (result is not None) == was_pending
            else:
                result = coordinator.ack(n, who)
                if was_pending:
                    acked[n].add(who)
                    assert (result is not None) == (acked[n] == set(INSTANCES))
                    if result is not None:
                        assert result.status == "completed" and all(m > c for c in completed for m in [n])
                        completed.append(n)
                else:
                    assert result is None
        elif kind == "expire":
            coordinator.expire()
        elif kind == "lost":
            coordinator.executor_lost(0)
        assert len(coordinator.pending) <= max_in_flight
        if coordinator.latest_completed is not None:
            assert all(m > coordinator.latest_completed.checkpoint for m in coordinator.pending)
        if coordinator.history:
            last_end = max(c.ended for c in coordinator.history)
    coordinator.executor_lost(0)
    ended = [c.checkpoint for c in coordinator.history]
    assert sorted(ended) == list(range(1, len(triggers) + 1))  # each ended exactly once
    assert [c.checkpoint for c in coordinator.history if c.status == "completed"] == completed
    assert all(c.reason for c in coordinator.history if c.status == "aborted")


# --- stop-with-savepoint and the synchronous baseline ------------------------------------------------


def test_stop_with_savepoint_stops_after_the_final_checkpoint():
    clock = Clock()
    coordinator = CheckpointCoordinator(INSTANCES, CheckpointConfig(interval=1.0), clock=clock)
    final = coordinator.stop_with_savepoint()
    assert coordinator.state == "stopping" and final.savepoint
    clock.now = 10.0
    assert coordinator.next_due() is None and coordinator.maybe_trigger() is None
    with pytest.raises(CheckpointError, match="while stopping"):
        coordinator.stop_with_savepoint()
    with pytest.raises(CheckpointError, match="while stopping"):
        coordinator.trigger_savepoint()
    ack_all(coordinator, final.checkpoint)
    assert coordinator.state == "stopped" and coordinator.savepoint is final
    with pytest.raises(CheckpointError, match="while stopped"):
        coordinator.trigger_savepoint()


def test_a_failed_stop_with_savepoint_keeps_the_job_running():
    coordinator = CheckpointCoordinator(INSTANCES, CheckpointConfig(interval=1.0))
    final = coordinator.stop_with_savepoint()
    coordinator.decline(final.checkpoint, INSTANCES[3], "sink refused the pre-commit")
    assert coordinator.state == "running" and coordinator.savepoint is None
    assert "stop-with-savepoint failed" in coordinator.stop_failure and "pre-commit" in coordinator.stop_failure
    assert coordinator.next_due() is not None


def test_stop_the_world_phases_in_order():
    clock = Clock()
    coordinator = CheckpointCoordinator(INSTANCES, CheckpointConfig(interval=1.0, mode="sync"), clock=clock)
    clock.now = 1.0
    n = coordinator.maybe_trigger().checkpoint
    sources = [w for w in INSTANCES if w[0] == "source"]
    round_ = StopTheWorld(n, sources, INSTANCES, clock=clock)
    assert round_.phase == "halt"
    clock.now = 2.0
    assert round_.halted(sources[0]) is None
    with pytest.raises(CheckpointError, match="reported drain during halt"):
        round_.drained(INSTANCES[2])
    assert round_.halted(sources[1]) == "drain"
    clock.now = 4.0
    assert [round_.drained(w) for w in INSTANCES][-1] == "snapshot"
    round_.snapshotted(INSTANCES[0])
    with pytest.raises(CheckpointError, match="twice"):
        round_.snapshotted(INSTANCES[0])
    coordinator.ack(n, INSTANCES[0])
    clock.now = 4.5
    commands, completed = [], []
    for who in INSTANCES[1:]:
        commands.append(round_.snapshotted(who, AckStats(bytes=10)))
        completed.append(coordinator.ack(n, who, AckStats(bytes=10)))
    assert commands[-1] == "resume" and completed[-1].status == "completed" and completed[-1].bytes == 50
    assert round_.resumed(sources[0]) is None and round_.resumed(sources[1]) == "done"
    assert round_.phases == {"halt": 1.0, "drain": 2.0, "snapshot": 0.5, "resume": 0.0}
    assert len(round_.acks) == len(INSTANCES)


# --- options -------------------------------------------------------------------------------------------


def test_config_from_options():
    config = CheckpointConfig.from_options(interval="100ms", min_pause=0.05, max_in_flight=2, timeout="1min")
    assert config == CheckpointConfig(0.1, 0.05, 2, 60.0, "abs")
    assert CheckpointConfig.from_options(mode="sync").mode == "sync"
    assert CheckpointConfig.from_options().interval is None


@pytest.mark.parametrize(
    "options, message",
    [
        ({"interval": 0}, "checkpoint interval must be a duration > 0"),
        ({"interval": "often"}, "checkpoint interval must be a duration"),
        ({"min_pause": -1}, "checkpoint min_pause must be a duration >= 0"),
        ({"max_in_flight": 0}, "max_in_flight must be a whole number >= 1"),
        ({"timeout": "0s"}, "checkpoint timeout must be a duration > 0"),
        ({"mode": "naiad"}, "checkpoint mode must be one of abs, sync, got 'naiad'"),
        ({"mode": "sync", "max_in_flight": 2}, "max_in_flight must be 1"),
    ],
)
def test_bad_config_gets_one_sentence(options, message):
    with pytest.raises(OptionError, match=message):
        CheckpointConfig.from_options(**options)


def test_history_is_bounded():
    coordinator = CheckpointCoordinator(INSTANCES, history=3)
    for _ in range(5):
        ack_all(coordinator, coordinator.trigger_savepoint().checkpoint)
    assert [r["checkpoint"] for r in coordinator.report()] == [3, 4, 5]


def test_instances_are_every_step_on_every_executor():
    coordinator = CheckpointCoordinator.for_steps(STEPS, range(2))
    assert coordinator.instances == frozenset(itertools.product(STEPS, range(2))) == frozenset(INSTANCES)
    with pytest.raises(CheckpointError, match="no operator instances"):
        CheckpointCoordinator([])
