"""Strangers without the cluster secret cannot stall or break a cluster, and a long-running
agent survives whatever its peers do (issue 12, items 2 and 3).

The agents run in this process (`agent.serve` in the test's trio run), so the listeners of a
real job can be attacked the moment they open. The per-connection set-up deadline is raised to
a minute here: a listener that waited on any stranger would take that minute, so a job that
finishes well within it proves that no stranger was waited on (no timing measurement needed).
"""

import contextlib
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import structlog
import trio

from slashrt import Dataflow, Schema, Tumbling
from slashrt._runtime import run_async
from slashrt.bench._common import sort_rows
from slashrt.cluster import ClusterError, agent, run_cluster_async
from slashrt.cluster._control import receive_message, send_message
from slashrt.ops.sinks import Collect
from slashrt.testing import hostile_connections
from slashrt.transport import _accept
from slashrt.transport._auth import client_handshake, generate_secret
from slashrt.transport._registry import Channels, open_port

SCHEMA = Schema([("ts", "<i8"), ("key", "<i8"), ("value", "<i8")])
STRANGERS = 50  # per listener
SLOW = 60.0  # the set-up deadline in these tests: what waiting on one stranger would cost
WITHIN = 30.0  # every job here must finish well within SLOW


@pytest.fixture(autouse=True)
def long_setup_deadline(monkeypatch):
    monkeypatch.setattr(_accept, "SETUP_TIMEOUT", SLOW)


def records(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros(n, SCHEMA.dtype)
    out["ts"] = np.arange(n) // 20
    out["key"] = rng.integers(0, 50, n)
    out["value"] = rng.integers(-100, 100, n)
    return out


def through_a_union(stream):
    """The same rows, split by key and joined again by a union (the progress bus,
    `cluster._progress`, is dialled before any exchange's channel, as in any flow)."""
    even = stream.filter(lambda b: b["key"] % 2 == 0, name="even")
    return even.union(stream.filter(lambda b: b["key"] % 2 == 1, name="odd"))


def flow(sink, union: bool = False) -> Dataflow:
    """A keyed window sum; with `union`, its records go `through_a_union` first."""
    f = Dataflow("hostile")
    r = f.source("r", SCHEMA, time="ts")
    r = through_a_union(r) if union else r
    r.window(Tumbling(ms=100)).sum("value", key="key", output="out").sink(sink, name="out")
    return f


async def expected(data) -> np.ndarray:
    sink = Collect()
    await run_async(flow(sink), {"r": data})
    return sort_rows(sink.records, "window_start", "key")


@contextlib.asynccontextmanager
async def agents(n: int, secret: bytes):
    """n long-running agents in this trio run; yields their "HOST:PORT" addresses."""
    async with trio.open_nursery() as nursery:
        addresses = []
        for _ in range(n):
            host, port = await nursery.start(agent.serve, "127.0.0.1", 0, secret)
            addresses.append(f"{host}:{port}")
        yield addresses
        nursery.cancel_scope.cancel()


async def run_job(addresses, secret, transport="tcp", seed=0, union=False):
    data = records(20_000, seed)
    sink = Collect()
    await run_cluster_async(flow(sink, union), {"r": data}, executors=addresses, transport=transport, secret=secret)
    np.testing.assert_array_equal(sort_rows(sink.records, "window_start", "key"), await expected(data))


@pytest.mark.parametrize("transport", ["tcp", "shm"])
async def test_strangers_on_every_listener_of_a_job_change_nothing(transport, monkeypatch):
    """50 strangers (idle, garbage, wrong secret, slowloris) on each agent's control port and on
    the channel port each job opens, connected before the real peers: the job's result is the
    same and it finishes well within one set-up deadline."""
    secret = generate_secret()
    attacks = []

    @contextlib.asynccontextmanager
    async def attacked_port(name, secret, **where):
        async with open_port(name, secret, **where) as port:
            async with hostile_connections(port.address, STRANGERS) as strangers:
                attacks.append(strangers)
                yield port

    monkeypatch.setattr(agent, "open_port", attacked_port)
    with trio.fail_after(WITHIN):
        async with agents(2, secret) as addresses:
            async with contextlib.AsyncExitStack() as stack:
                for address in addresses:
                    host, port = address.rsplit(":", 1)
                    attacks.append(await stack.enter_async_context(hostile_connections((host, int(port)), STRANGERS)))
                await run_job(addresses, secret, transport)
                await run_job(addresses, secret, transport, seed=1)  # and the next job too
    assert len(attacks) == 2 + 2 * 2  # two control ports, a channel port per agent per job
    # every stranger was connected ahead of the real peers; none became a peer (the results
    # would differ, or the job would have waited for the real peer's data until the deadline)
    assert all(a.connected == STRANGERS for a in attacks)


@pytest.mark.parametrize("union", [False, True], ids=["linear", "union"])
async def test_a_peer_that_never_connects_fails_the_job_naming_it(monkeypatch, union):
    """One executor's channel never arrives (its dial hangs): the other accepts strangers and
    nothing else until CONNECT_TIMEOUT, then fails the job saying whose channel is missing. The
    first dial is the progress bus's, under the same timeout."""
    secret = generate_secret()
    dials = []

    dial = Channels.connect

    async def first_dial_hangs(self, name, address, spec, secret, **options):
        dials.append(address)
        if len(dials) == 1:
            await trio.sleep_forever()
        return await dial(self, name, address, spec, secret, **options)

    monkeypatch.setattr(Channels, "connect", first_dial_hangs)
    monkeypatch.setattr(agent, "CONNECT_TIMEOUT", 1.0)
    with trio.fail_after(WITHIN):
        async with agents(2, secret) as addresses:
            with pytest.raises(ClusterError, match=r"not connected within 1 s \(no peer proved the cluster secret\): executor [01]'s \S+ channel \(on executor [01]\)$") as failed:
                await run_job(addresses, secret, union=union)
    assert "progress" in str(failed.value)  # (the bus's dial was the one that hung)


async def authenticated(address: str, secret: bytes) -> trio.SocketStream:
    """A control connection to the agent at `address` that proved the secret (a coordinator's)."""
    host, port = address.rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    await client_handshake(stream, secret)
    return stream


async def test_a_long_running_agent_survives_coordinators_that_misbehave():
    """An authenticated coordinator that leaves before sending the job, one that announces a
    2**40-byte message, one that sends something else than a job, and a coordinator given an
    unreachable second agent: the agent logs each and serves the next job."""
    secret = generate_secret()
    with trio.fail_after(WITHIN), structlog.testing.capture_logs() as logs:
        async with agents(1, secret) as (address,):
            stream = await authenticated(address, secret)
            await stream.aclose()  # gone before the job
            stream = await authenticated(address, secret)
            await stream.send_all(struct.pack("<Q", 1 << 40))  # an absurd length, then nothing
            assert await stream.receive_some(1) == b""  # the agent hangs up
            await stream.aclose()
            stream = await authenticated(address, secret)
            await send_message(stream, "start")  # not a job
            assert await stream.receive_some(1) == b""
            await stream.aclose()
            stream = await authenticated(address, secret)
            await send_message(stream, "job", "not a job")
            kind, why = await receive_message(stream)
            assert kind == "failed" and "not a Job" in why
            await stream.aclose()
            with pytest.raises(ClusterError, match="cannot reach executor 1"):
                await run_job([address, "127.0.0.1:1"], secret)
            await run_job([address], secret)  # still serving
            await run_job([address], secret, seed=2)
    refused = [e for e in logs if e["event"] == "control connection dropped"]
    # the four above, and the coordinator that could not reach executor 1 if it had reached this
    # agent first (it reaches its executors concurrently: it may have given up before)
    assert 4 <= len(refused) <= 5, refused


async def test_a_job_message_whose_parts_are_damaged_is_refused_in_one_sentence_and_the_agent_serves_on():
    secret = generate_secret()
    with trio.fail_after(WITHIN):
        async with agents(1, secret) as (address,):
            stream = await authenticated(address, secret)
            damaged = {"index": 0, "heartbeat_interval": 10.0, "heartbeat_timeout": 50.0, "shared": b"\x78\x01garbage",
                       "own": b"not a pickle"}
            await send_message(stream, "job", damaged)
            kind, why = await receive_message(stream)
            assert kind == "failed" and why.startswith(
                "ChannelClosed: the coordinator's job message holds no job: its parts do not unpickle (")
            assert "\n" not in why
            await stream.aclose()
            await run_job([address], secret)  # still serving


async def test_a_coordinator_arriving_while_another_is_served_waits_its_turn():
    """The agent keeps accepting (and authenticating) while it serves a coordinator: the next
    one proves the secret at once and is served when the first is done, never dropped."""
    secret = generate_secret()
    with trio.fail_after(WITHIN):
        async with agents(1, secret) as (address,):
            first = await authenticated(address, secret)
            second = await authenticated(address, secret)  # while the agent waits for the first's job
            await first.aclose()
            await send_message(second, "job", "not a Job")
            kind, why = await receive_message(second)
            assert kind == "failed" and "not a Job" in why
            await second.aclose()


async def test_slashrt_executor_serves_job_after_job_whatever_its_peers_do():
    """The `slashrt executor --listen` process itself: strangers, a coordinator that leaves
    before its job and one that announces 2**40 bytes leave it serving jobs, still running."""
    secret = generate_secret()
    env = dict(os.environ, SLASHRT_SECRET=secret.hex(), PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
    cmd = [sys.executable, "-m", "slashrt", "executor", "--listen", "127.0.0.1:0", "--log-level", "warning"]
    proc = await trio.lowlevel.open_process(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    try:
        with trio.fail_after(WITHIN):
            line = b""
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(256)
                assert chunk, "the agent exited before listening"
                line += chunk
            _, _, host, port = line.decode().split()
            address = f"{host}:{port}"
            async with hostile_connections((host, int(port)), STRANGERS):
                for announce in (None, struct.pack("<Q", 1 << 40)):
                    stream = await trio.open_tcp_stream(host, int(port))
                    await client_handshake(stream, secret)
                    if announce:
                        await stream.send_all(announce)
                    await stream.aclose()
                await run_job([address], secret)
                await run_job([address], secret, seed=3)
        assert proc.returncode is None, "the agent exited"
    finally:
        proc.kill()
        await proc.wait()
