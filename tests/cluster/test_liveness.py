"""Liveness and failure hygiene of clusters: heartbeats find a frozen executor (and an agent
finds a frozen coordinator), errors say how an executor died, and no process is left behind
whatever is killed, stopped or interrupted, whenever (spawning included)."""

import functools
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
import trio
import trio.testing

import slashrt
from slashrt import Dataflow, Schema, Tumbling
from slashrt.cluster import ClusterError, PerExecutor, run_cluster_async
from slashrt.cluster._liveness import HEARTBEAT, Link, PeerSilent
from slashrt.errors import DataflowError
from slashrt.ops.sinks import Collect
from tests.cluster._processes import children, parent

SCHEMA = Schema([("ts", "<i8"), ("key", "<i8"), ("value", "<i8")])
AGENT = b"slashrt.cluster.agent"  # a spawned agent's command line
ZYGOTE = b"slashrt.cluster._zygote"  # the zygote's, and that of every agent it forked


# -- the heartbeat link, on in-memory streams and a mock clock -------------------------------------

async def test_heartbeats_keep_a_quiet_link_alive_and_are_never_delivered(autojump_clock):
    left, right = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        a, b = Link(left, interval=1, timeout=3), Link(right, interval=1, timeout=3)
        a.start(nursery)
        b.start(nursery)
        await trio.sleep(100)  # 33 timeouts of silence but for heartbeats
        assert a.ended is None and b.ended is None
        await a.send("job", 42)
        assert await b.receive("job") == ("job", 42)  # the heartbeats before it were skipped
        nursery.cancel_scope.cancel()


async def test_a_peer_silent_for_the_timeout_ends_the_link(autojump_clock):
    left, _silent = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        link = Link(left, interval=1, timeout=3)
        link.start(nursery)
        t0 = trio.current_time()
        with pytest.raises(PeerSilent, match="stopped answering for 3 s"):
            await link.receive()
        assert trio.current_time() - t0 == 3
        with pytest.raises(PeerSilent):  # and it stays ended
            await link.send("x")


async def test_messages_before_the_end_are_delivered_then_the_end(autojump_clock):
    left, right = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        link = Link(left, interval=1, timeout=3)
        link.start(nursery)
        from slashrt.cluster._control import send_message

        await send_message(right, HEARTBEAT)
        await send_message(right, "failed", "executor 1: boom")
        await right.aclose()
        with pytest.raises(Exception, match="executor 1: boom"):
            await link.receive("done")  # a "failed" where "done" was due raises with its text
        with pytest.raises(Exception, match="closed"):
            await link.receive()


async def test_an_agents_report_of_its_failure_is_the_cause_even_when_a_send_to_it_broke_first(autojump_clock):
    """The agent said why it failed and closed its end; the coordinator's next send to it
    breaks before its reader has taken the report: the report, not the broken link, is the
    cause (with restart= it decides whether the failure is retryable)."""
    from slashrt.cluster._control import send_message
    from slashrt.cluster.coordinator import _Agents

    left, right = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        link = Link(left, interval=1, timeout=3)
        link.start(nursery)
        await send_message(right, "failed", "step 'f': RetryableError: away (on executor 0)")
        await right.aclose()
        agents = _Agents([link], [None])
        agents.start(nursery)  # its reader runs only once this task waits: the send breaks first
        await agents.send_all("commit", [1])  # (the agent that cannot take it is queued as failed)
        with pytest.raises(ClusterError) as caught:
            await agents.settle(lambda: False)
        assert str(caught.value) == "step 'f': RetryableError: away (on executor 0)" and caught.value.retryable
        nursery.cancel_scope.cancel()


async def test_a_peers_broken_channel_yields_to_the_failure_that_broke_it_when_a_send_breaks_first(autojump_clock):
    """Agent 1 acked a checkpoint, then its operator raised a RetryableError; agent 0's channel
    from it broke, so agent 0 reported that and closed. Agent 1's reader handles the ack by
    sending a commit to everyone, which breaks on agent 0 before agent 1's report is read: the
    cause is agent 1's error (retryable), not agent 0's exit or its broken channel."""
    from slashrt.cluster._control import send_message
    from slashrt.cluster.coordinator import _Agents

    pairs = [trio.testing.memory_stream_pair() for _ in range(2)]
    async with trio.open_nursery() as nursery:
        links = [Link(left, interval=1, timeout=3) for left, _ in pairs]
        for link in links:
            link.start(nursery)
        said = ["ChannelClosed: channel failed: shm receiver (pid 7) closed the channel (on executor 0)",
                "step 'f': RetryableError: away (on executor 1)"]
        await send_message(pairs[0][1], "failed", said[0])
        await pairs[0][1].aclose()
        await send_message(pairs[1][1], "ack", 1)
        await send_message(pairs[1][1], "failed", said[1])

        async def commit(index, payload):  # as ClusterCheckpoints does once an ack completes a checkpoint
            await agents.send_all("commit", [payload, payload])

        agents = _Agents(links, [None, None], {"ack": commit})
        agents.start(nursery)
        with pytest.raises(ClusterError) as caught:
            await agents.settle(lambda: False)
        assert str(caught.value) == said[1] and caught.value.retryable
        nursery.cancel_scope.cancel()


async def test_a_peer_whose_listener_closed_is_an_echo_of_its_failure_and_an_unanswered_one_a_partition():
    """Executor 1 dials executor 0's channel after 0 failed and closed its listener: the refusal
    is 0's failure seen from 1 (a broken channel the coordinator looks past), not a partition
    between them, which a connection the network refuses is (a route to nowhere; here a
    multicast address, which Linux refuses as unreachable)."""
    from slashrt.cluster.agent import _describe, connect_to_peer
    from slashrt.cluster.coordinator import _broken_channel
    from slashrt.cluster._liveness import PeersUnreachable
    from slashrt.errors import ChannelClosed
    from slashrt.transport import RingSpec
    from slashrt.transport._auth import generate_secret
    from slashrt.transport._channel import Liveness
    from slashrt.transport._registry import open_channels, open_listener

    spec, secret = RingSpec(slots=4, slot_size=4096, record_size=8), generate_secret()
    async with open_listener("tcp", spec, secret, host="127.0.0.1") as listener:
        closed = listener.address  # a port nothing listens on once the listener closed
    async with open_channels(Liveness(1, 3)) as channels:
        with pytest.raises(ChannelClosed) as refused:
            await connect_to_peer(channels, "tcp", 1, 0, closed, spec, secret, timeout=3)
        assert _broken_channel(_describe(refused.value)), _describe(refused.value)
        assert str(refused.value) == "executor 0's listener refused executor 1's connection: it had closed (executor 0 failed first)"
        with pytest.raises(PeersUnreachable) as unanswered:  # (the kernel refuses TCP to a multicast group at once)
            await connect_to_peer(channels, "tcp", 2, 1, ("224.0.0.1", 9), spec, secret, timeout=3)
        assert str(unanswered.value).startswith("executors 1 and 2 cannot reach each other: ")


# -- the driver's own stall (SIGSTOP, swap) is not the executors' silence: a jump of the mock clock --

async def test_the_drivers_own_stall_gives_a_silent_peer_a_fresh_timeout_from_when_it_resumed(mock_clock):
    """The whole process (ticker, watch, readers) does not run for 20 s: a clock jump. Before,
    the peer was declared silent the moment the process resumed; now its silence counts from
    then, and a peer that stays silent is declared so exactly one timeout later."""
    from slashrt.cluster._liveness import OwnStalls

    left, _silent = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        stalls = OwnStalls(interval=1, timeout=3)
        nursery.start_soon(stalls.run)
        link = Link(left, interval=1, timeout=3, stalls=stalls)
        link.start(nursery)
        mock_clock.jump(1)
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(20)  # frozen: nothing ran
        await trio.testing.wait_all_tasks_blocked()
        resumed = trio.current_time()
        assert link.ended is None and stalls.longest == pytest.approx(19.5)  # past the tick that was due at 1.5
        assert stalls.explain().startswith("the driver itself was stalled for 20 s (SIGSTOP, swap, an overloaded machine)")
        for _ in range(5):  # running again, in steps: the peer's silence counts from `resumed`
            mock_clock.jump(0.5)
            await trio.testing.wait_all_tasks_blocked()
        assert link.ended is None
        mock_clock.jump(0.5)
        await trio.testing.wait_all_tasks_blocked()
        assert isinstance(link.ended, PeerSilent) and trio.current_time() - resumed == 3
        nursery.cancel_scope.cancel()


async def test_a_stall_shorter_than_the_agents_patience_is_tolerated_and_named_nowhere(mock_clock):
    from slashrt.cluster._liveness import OwnStalls

    left, right = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        stalls = OwnStalls(interval=1, timeout=5)
        nursery.start_soon(stalls.run)
        link, peer = Link(left, interval=1, timeout=5, stalls=stalls), Link(right, interval=1, timeout=5)
        link.start(nursery)
        peer.start(nursery)
        mock_clock.jump(3.5)  # (the peer waited at most 4.5 s for a heartbeat: within its 5 s)
        await trio.testing.wait_all_tasks_blocked()
        assert link.ended is None and stalls.longest > 1 and stalls.explain() is None
        nursery.cancel_scope.cancel()


async def test_a_stall_long_past_is_not_named_as_the_cause_of_a_later_failure(mock_clock):
    from slashrt.cluster._liveness import OwnStalls

    async with trio.open_nursery() as nursery:
        stalls = OwnStalls(interval=1, timeout=5)
        nursery.start_soon(stalls.run)
        mock_clock.jump(20)
        await trio.testing.wait_all_tasks_blocked()
        assert stalls.explain() is not None
        for _ in range(12):  # running normally for 6 s: what fails now is not the stall's doing
            mock_clock.jump(0.5)
            await trio.testing.wait_all_tasks_blocked()
        assert stalls.explain() is None and stalls.longest == pytest.approx(19.5)
        nursery.cancel_scope.cancel()


async def test_a_failure_after_a_stall_longer_than_the_timeout_names_the_drivers_stall(mock_clock):
    """The agents gave up on a driver frozen for 20 s and closed their connections: the
    failure names the driver's stall (retryable: the executors were fine), not "executor 0
    lost its control connection"."""
    from slashrt.cluster._liveness import OwnStalls
    from slashrt.cluster.coordinator import _Agents

    left, right = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        stalls = OwnStalls(interval=1, timeout=5)
        nursery.start_soon(stalls.run)
        link = Link(left, interval=1, timeout=5, stalls=stalls)
        link.start(nursery)
        agents = _Agents([link], [None], stalls=stalls)
        agents.start(nursery)
        mock_clock.jump(20)
        await right.aclose()  # the agent stopped its job: it heard nothing for its timeout
        with pytest.raises(ClusterError) as caught:
            await agents.gather("finished")
        assert str(caught.value).startswith(
            "the driver itself was stalled for 20 s (SIGSTOP, swap, an overloaded machine): its executors heard no "
            "heartbeat for their timeout (5 s) and stopped their jobs (then executor 0 lost its control connection")
        assert caught.value.retryable
        nursery.cancel_scope.cancel()


async def test_a_send_blocked_on_a_peer_that_stopped_reading_fails_at_the_timeout(autojump_clock):
    left, _frozen = trio.testing.lockstep_stream_pair()  # send_all waits for a reader that never comes
    async with trio.open_nursery() as nursery:
        link = Link(left, interval=1, timeout=3)
        link.start(nursery)
        with pytest.raises(PeerSilent):
            await link.send("peers", {})
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(heartbeat_interval=0), "heartbeat_interval must be a positive number"),
        (dict(heartbeat_timeout=float("nan")), "heartbeat_timeout must be a positive number"),
        (dict(heartbeat_interval=5, heartbeat_timeout=5), r"heartbeat_timeout \(5 s\) must be longer"),
    ],
)
def test_bad_heartbeat_settings_are_refused(options, message):
    f = Dataflow("hb")
    f.source("r", SCHEMA, time="ts").window(Tumbling(ms=100)).count(key="key").sink(Collect())
    with pytest.raises(DataflowError, match=message):
        slashrt.run(f, {"r": np.zeros(10, SCHEMA.dtype)}, executors=2, **options)


# -- executors that stop answering or die -----------------------------------------------------------

def _make(index, executors):
    out = np.zeros(40_000, SCHEMA.dtype)
    out["ts"] = np.arange(len(out)) // 10
    out["key"] = np.arange(len(out)) % 20
    out["value"] = index
    return out


def _signal_self_on_executor_1(mark, signum, batch):
    """Executor 1 notes the time in `mark`, then sends itself `signum`, in its first batch past 50 ms."""
    if len(batch) and batch["value"][0] == 1 and batch["ts"][0] > 50 and not os.path.exists(mark):
        with open(mark, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signum)
    return batch


def _job(mark, signum) -> Dataflow:
    f = Dataflow("liveness")
    step = functools.partial(_signal_self_on_executor_1, str(mark), signum)
    f.source("r", SCHEMA, time="ts").apply(step).window(Tumbling(ms=100)).count(key="key").sink(Collect(), name="out")
    return f


def test_a_stopped_executor_fails_the_job_within_the_heartbeat_timeout(tmp_path):
    mark = tmp_path / "stopped"
    with pytest.raises(ClusterError, match=r"^executor 1 stopped answering for 2 s") as err:
        slashrt.run(_job(mark, signal.SIGSTOP), {"r": PerExecutor(_make)}, executors=2, epoch_bytes=4096,
                    heartbeat_interval=0.25, heartbeat_timeout=2)
    waited = time.time() - float(mark.read_text())
    assert 2 <= waited < 2 + 5, (waited, str(err.value))  # the timeout, and reaping the rest (1 s grace)


def test_a_killed_executor_fails_the_job_within_5_s_saying_how_it_died(tmp_path, capfd):
    mark = tmp_path / "killed"
    with pytest.raises(ClusterError, match=r"^executor 1 was killed by signal 9 \(SIGKILL\)"):
        slashrt.run(_job(mark, signal.SIGKILL), {"r": PerExecutor(_make)}, executors=2, epoch_bytes=4096)
    assert time.time() - float(mark.read_text()) < 5
    assert "Traceback" not in capfd.readouterr().err  # the surviving executor 0 logs one line at most


@pytest.mark.parametrize("index, signum, said", [
    (0, signal.SIGKILL, r"^executor 0 was killed by signal 9 \(SIGKILL\) before the driver reached it"),
    (1, signal.SIGKILL, r"^executor 1 was killed by signal 9 \(SIGKILL\) before the driver reached it"),
    (1, signal.SIGSTOP, r"^executor 1 stopped answering for 1.5 s during the handshake"),
])
def test_an_agent_killed_or_stopped_after_listening_before_the_driver_reached_it_is_named_so(index, signum, said, monkeypatch):
    """Forced interleaving: executor `index` is SIGKILLed (or SIGSTOPped) right after it printed
    its address, before the driver connects (a moment random trials hit now and then). The
    error says how it died, as at any other moment, not that a port refused a connection or a
    handshake timed out; it is retryable (the agent was the driver's own)."""
    from slashrt.cluster import coordinator

    spawn = coordinator._spawn_agent
    stopped = []

    async def spawn_then_signal(secret, i, procs, silent_s, relay, *zygote, **options):
        address = await spawn(secret, i, procs, silent_s, relay, *zygote, **options)
        if i == index:
            procs[i].send_signal(signum)
            stopped.append(procs[i])
        return address

    monkeypatch.setattr(coordinator, "_spawn_agent", spawn_then_signal)
    try:
        with pytest.raises(ClusterError, match=said) as err:
            slashrt.run(_job("unused", signal.SIGKILL), {"r": PerExecutor(_make)}, executors=2,
                        heartbeat_interval=0.25, heartbeat_timeout=1.5)
        assert err.value.retryable
    finally:
        for proc in stopped:  # (reaped by the run; a stopped one must not outlive a failed assertion)
            if proc.returncode is None:
                proc.kill()


STOP_FORKED = "SLASHRT_TEST_STOP_FORKED"


def _stop_if_forked_by_a_zygote() -> None:
    """In a child a zygote forked (its command line is the zygote's) while STOP_FORKED is set in
    the zygote's environment: stop at once, before the agent can listen. The zygote imports this
    module as it unpickles the job's flow (`_job`'s steps live here)."""
    if os.environ.get(STOP_FORKED) and ZYGOTE in open("/proc/self/cmdline", "rb").read():
        os.kill(os.getpid(), signal.SIGSTOP)


os.register_at_fork(after_in_child=_stop_if_forked_by_a_zygote)


def test_an_agent_stopped_before_it_listens_fails_the_run_within_the_heartbeat_timeout(monkeypatch):
    """A real SIGSTOP of a forked agent before it could listen (it stops itself as it is
    forked): it cannot answer heartbeats yet, but it uses no CPU either, so the driver names it
    after the heartbeat timeout, not after the 30 s it allows an agent to start and listen."""
    from slashrt.cluster import coordinator

    monkeypatch.setenv(STOP_FORKED, "1")  # (the zygote's environment: it starts with the run)
    began = time.monotonic()
    with pytest.raises(ClusterError, match=r"^executor [01] stopped answering for 1.5 s before listening \(its process "
                                           r"used no CPU: stopped or frozen\)$") as err:
        slashrt.run(_job("unused", signal.SIGKILL), {"r": PerExecutor(_make)}, executors=2,
                    heartbeat_interval=0.25, heartbeat_timeout=1.5)
    assert err.value.retryable
    assert time.monotonic() - began < coordinator.LISTEN_TIMEOUT  # (before: 30 s)


def _until_go(marks, batch):
    """Notes that the job runs (file `running`), then takes 0.1 ms a record until `go` exists
    (40,000 records: 4 s, longer than the timeout, however the executor batches them)."""
    open(os.path.join(marks, "running"), "a").close()
    if not os.path.exists(os.path.join(marks, "go")):
        time.sleep(len(batch) * 1e-4)
    return batch


def frozen_driver(marks: str) -> None:
    """The driver of `test_a_driver_frozen_past_the_timeout_names_its_own_stall` (in a process
    of its own, which the test stops): prints how its run ended."""
    f = Dataflow("frozen")
    f.source("r", SCHEMA, time="ts").apply(functools.partial(_until_go, marks)).window(Tumbling(ms=100)).count(
        key="key").sink(Collect(), name="out")
    try:
        slashrt.run(f, {"r": PerExecutor(_make)}, executors=2, heartbeat_interval=0.25, heartbeat_timeout=1.5,
                    slot_size=4096)  # (batches of 170 records: 17 ms each)
        print("finished")
    except ClusterError as exc:
        print(f"failed: {exc}")


def test_a_driver_frozen_past_the_timeout_names_its_own_stall(tmp_path):
    """A real SIGSTOP of the driver (the coordinator's process) for twice the heartbeat timeout,
    then SIGCONT: its agents gave up on it, and the failure names the driver's stall, not an
    executor (before: "executor 0 exited with code 1" or "stopped answering")."""
    proc = subprocess.Popen([sys.executable, "-c", f"from tests.cluster.test_liveness import frozen_driver; "
                             f"frozen_driver({str(tmp_path)!r})"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path)))
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "running").exists():  # the job runs
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(3.0)  # the fault itself: frozen for twice the timeout
        proc.send_signal(signal.SIGCONT)
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert re.match(r"failed: the driver itself was stalled for [34] s \(SIGSTOP, swap, an overloaded machine\): its "
                    r"executors heard no heartbeat for their timeout \(1.5 s\) and stopped their jobs \(then executor",
                    out), (out, err[-2000:])


def _slow_on_executor_1(batch):
    """Executor 1 (its records' value) takes 20 ms a batch (of one 4 KiB buffer: coalesce=1):
    its peer's channel to it stays full (backpressured) for seconds, several heartbeat
    timeouts, while no call comes near the timeout."""
    if len(batch) and batch["value"][0] == 1:
        time.sleep(0.02)
    return batch


def test_a_backpressured_tcp_channel_longer_than_the_timeout_is_not_a_partition():
    """The slow executor's channels answer (keepalives from their receivers) while their
    senders wait for credit: the job finishes, nothing is declared unreachable."""
    f = Dataflow("backpressured")
    f.source("r", SCHEMA, time="ts").apply(_slow_on_executor_1).window(Tumbling(ms=100)).count(key="key").sink(
        Collect(), name="out")
    result = slashrt.run(f, {"r": PerExecutor(_make)}, executors=2, transport="tcp", slot_size=4096, coalesce=1,
                         heartbeat_interval=0.25, heartbeat_timeout=1.5)
    assert result.seconds > 2 * 1.5  # (timeouts of backpressure: 235 batches on executor 1)
    assert result.outputs["backpressured.out"]["count"].sum() == 2 * 40_000


def test_an_agent_stops_its_job_when_the_coordinator_stops_answering():
    """A coordinator that handshakes, sends a job and then says nothing (as a frozen one would):
    the agent fails the job at the heartbeat timeout and exits (before the job, it answers
    heartbeats, so a coordinator still sending other agents' jobs does not think it silent)."""
    from slashrt.cluster._control import receive_message, send_message
    from slashrt.cluster._job import Job, job_message
    from slashrt.transport._auth import client_handshake, generate_secret

    secret = generate_secret()
    env = dict(os.environ, SLASHRT_SECRET=secret.hex())
    proc = subprocess.Popen([sys.executable, "-m", "slashrt.cluster.agent", "--once", "--log-level", "info"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, text=True)
    try:
        _, _, host, port = proc.stdout.readline().split()

        async def frozen_coordinator():
            stream = await trio.open_tcp_stream(host, int(port))
            await client_handshake(stream, secret)
            await send_message(stream, HEARTBEAT)  # before the job, the agent answers each heartbeat
            assert await receive_message(stream) == (HEARTBEAT, None)
            f = Dataflow("orphan")
            f.source("r", SCHEMA, time="ts").sink(Collect())
            job = Job(f, 0, 1, {"r": np.zeros(10, SCHEMA.dtype)})
            t0 = time.monotonic()
            await send_message(stream, "job", job_message(job, heartbeat_interval=0.2, heartbeat_timeout=1.0))
            with trio.fail_after(30):
                while await stream.receive_some():  # its "addresses" and heartbeats, then its close
                    pass
            return time.monotonic() - t0

        took = trio.run(frozen_coordinator)
        assert proc.wait(timeout=10) == 1
        assert 1.0 <= took < 5
        err = proc.stderr.read()
        assert "the coordinator stopped answering" in err and "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- no process left behind ------------------------------------------------------------------------

def _slow(batch):
    time.sleep(0.01)
    return batch


def _slow_job() -> Dataflow:
    f = Dataflow("slow")
    f.source("r", SCHEMA, time="ts").apply(_slow).window(Tumbling(ms=100)).count(key="key").sink(Collect())
    return f


TRIALS = int(os.environ.get("SLASHRT_KILL_TRIALS", "6"))


@pytest.mark.parametrize("seed", range(TRIALS))
def test_a_cancelled_run_leaves_no_process_behind_even_during_spawn(seed):
    """The run is cancelled at a random moment (a third of the draws while agents are being
    spawned): once run_cluster_async returns, every agent it started is gone and reaped."""
    rng = random.Random(seed)
    delay = rng.uniform(0, 0.6) if seed % 3 == 0 else rng.uniform(0, 3)
    before = children()

    async def cancelled():
        with trio.move_on_after(delay):
            await run_cluster_async(_slow_job(), {"r": PerExecutor(_make)}, executors=2)

    trio.run(cancelled)
    assert children() - before == set(), f"left behind after a cancel at {delay:.2f} s"


DRIVER = """
import os, sys, time, numpy as np, slashrt
import slashrt.cluster.coordinator
from slashrt import Dataflow, Schema, Tumbling
from slashrt.cluster import PerExecutor
from slashrt.ops.sinks import Collect

S = Schema([("ts", "<i8"), ("key", "<i8")])

def make(index, executors):
    out = np.zeros(400_000, S.dtype)
    out["ts"] = np.arange(len(out)) // 100
    return out

def crawl(batch):
    time.sleep(0.005)
    return batch

f = Dataflow("trial")
f.source("r", S, time="ts").apply(crawl).window(Tumbling(ms=100)).count(key="key").sink(Collect())
slashrt.cluster.coordinator.LISTEN_TIMEOUT = 8  # an agent stopped while it starts: fail soon
print("starting", flush=True)
try:
    slashrt.run(f, {"r": PerExecutor(make)}, executors=2, heartbeat_interval=0.2, heartbeat_timeout=1.5)
except BaseException as exc:  # one line, so that any traceback on stderr is an agent's
    print(f"driver: {type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(1)
"""


def _marked(token: str) -> list[int]:
    """Processes (not zombies) whose environment carries the trial's token: its agents."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if f"SLASHRT_TRIAL={token}".encode() in f.read().split(b"\0"):
                        found.append(int(pid))
            except OSError:
                pass
    return found


def _agents(token: str, driver: int) -> list[int]:
    """The trial's agents: spawned, or forked by the driver's zygote (a child of the driver)."""
    out = []
    for pid in _marked(token):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if pid != driver and (AGENT in cmdline or ZYGOTE in cmdline and parent(pid) not in (driver, None)):
            out.append(pid)
    return out


@pytest.mark.parametrize("seed", range(TRIALS))
def test_kill_stop_or_interrupt_at_a_random_moment_leaves_no_process_behind(seed, tmp_path):
    """A job in a driver process; at a random moment (half of the draws while its agents are
    spawned) the driver is interrupted or killed, or one of its agents is killed or stopped.
    The driver ends, says how an executor died if one did, no agent prints a traceback, and
    no agent is left. SLASHRT_KILL_TRIALS=20 runs twenty."""
    rng = random.Random(1000 + seed)
    action = ["kill agent", "stop agent", "interrupt driver", "kill driver"][seed % 4]
    delay = rng.uniform(0, 0.8) if seed % 2 == 0 else rng.uniform(0, 3.5)  # the job runs about 3 s
    token = uuid.uuid4().hex
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, env=dict(os.environ, SLASHRT_TRIAL=token), text=True)
    try:
        assert driver.stdout.readline().strip() == "starting"
        time.sleep(delay)  # the random moment itself, not a wait for anything
        if action.endswith("driver"):
            driver.send_signal(signal.SIGINT if action.startswith("interrupt") else signal.SIGKILL)
        else:
            deadline = time.monotonic() + 30
            while not (agents := _agents(token, driver.pid)) and driver.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)  # not started yet: the first one, as it starts
            if agents:  # (none if the job is over)
                os.kill(rng.choice(agents), signal.SIGKILL if action.startswith("kill") else signal.SIGSTOP)
        code = driver.wait(timeout=60)
        err = driver.stderr.read()
        print(f"{action} at {delay:.2f} s: exit {code}, {err.strip()!r}")
        assert "Traceback" not in err, err
        if code == 1 and action == "kill agent":
            assert "killed by signal 9" in err, err
        if code == 1 and action == "stop agent":
            assert "stopped answering" in err, err
        deadline = time.monotonic() + 10  # orphans of a killed driver notice within a second
        while _marked(token) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _marked(token) == [], f"{action} at {delay:.2f} s left processes behind"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for pid in _marked(token):
            os.kill(pid, signal.SIGKILL)


async def test_a_channel_that_cannot_connect_says_what_its_attempt_met():
    """A refused connection is the echo of the peer's own failure (`ChannelClosed`); any other
    is a partition (`PeersUnreachable`) whose sentence ends with what the attempt met, not
    only trio's 'all attempts to connect ... failed'."""
    import errno

    from slashrt.cluster._liveness import PeersUnreachable
    from slashrt.cluster.agent import connect_to_peer
    from slashrt.errors import ChannelClosed

    class Refusing:  # a port nobody listens on: the host refuses
        async def connect(self, transport, address, spec, secret, **_):
            await trio.open_tcp_stream("127.0.0.1", 1)

    class Unroutable:  # what trio raises when the network has no route: one OSError over the attempts'
        async def connect(self, transport, address, spec, secret, **_):
            raise OSError("all attempts to connect to 10.77.126.3:45075 failed") from BaseExceptionGroup(
                "attempts", [OSError(errno.EHOSTUNREACH, "No route to host")])

    with pytest.raises(ChannelClosed, match=r"executor 1's listener refused executor 0's connection"):
        await connect_to_peer(Refusing(), "tcp", 0, 1, ("127.0.0.1", 1), None, b"", timeout=1)
    with pytest.raises(PeersUnreachable, match=r"^executors 0 and 2 cannot reach each other: connecting their channel "
                                               r"failed \(all attempts to connect to 10\.77\.126\.3:45075 failed: "
                                               r"No route to host\)$"):
        await connect_to_peer(Unroutable(), "tcp", 2, 0, ("10.77.126.3", 45075), None, b"", timeout=1)
