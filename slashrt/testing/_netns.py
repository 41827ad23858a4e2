"""Hosts on one machine for multi-host runs and network faults: each a network namespace with
its own address, joined by veth pairs on a bridge (the coordinator stays in the root
namespace), and agents started inside them (`slashrt executor` as on a real host). Needs root
and iproute2; `why_not()` says what is missing. Used by tests/cluster/test_netns.py and the
`partition` fault of `slashrt bench chaos --faults`."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator

import attrs

__all__ = ["Hosts", "why_not", "open_hosts", "blackhole", "start_agents", "stop_agents"]


@attrs.frozen
class Hosts:
    names: list[str]  # the namespaces
    addresses: list[str]  # host i's address, reachable from the root namespace and every other host


def why_not() -> str | None:
    """Why hosts cannot be made here (one sentence), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2 (the ip command)"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def open_hosts(n: int = 3) -> Iterator[Hosts]:
    """`n` hosts at 10.77.x.2.. on a bridge at 10.77.x.1, removed on exit (failed or not)."""
    tag = uuid.uuid4().hex[:6]
    subnet = 10 + int(tag, 16) % 200
    bridge = f"slbr{tag}"
    names = [f"slrt{tag}{i}" for i in range(n)]
    addresses = [f"10.77.{subnet}.{i + 2}" for i in range(n)]
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"10.77.{subnet}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, (ns, addr) in enumerate(zip(names, addresses)):
            _ip("netns", "add", ns)
            _ip("link", "add", f"slv{tag}{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", f"slv{tag}{i}", "master", bridge)
            _ip("link", "set", f"slv{tag}{i}", "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield Hosts(names, addresses)
    finally:
        for ns in names:
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        subprocess.run(["ip", "link", "delete", bridge], capture_output=True)


def blackhole(hosts: Hosts, a: int, b: int, on: bool = True) -> None:
    """Drop every packet between hosts a and b, silently, both ways (a route to nowhere on each
    side, as a failed link or a firewall's DROP does: no reset, no error, TCP retransmits); the
    coordinator still reaches both. `on=False` heals it (idempotent)."""
    verb = "add" if on else "del"
    for here, there in ((a, b), (b, a)):
        subprocess.run(["ip", "-n", hosts.names[here], "route", verb, "blackhole", f"{hosts.addresses[there]}/32"],
                       check=on, capture_output=True)


def start_agents(hosts: Hosts, secret: bytes, port: int, *, once: bool = True, log_level: str = "warning") -> list:
    """An agent per host listening on (its address, `port`), started once each printed its
    address; with `once` each exits after one job, else it serves job after job."""
    env = dict(os.environ, SLASHRT_SECRET=secret.hex(), PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
    procs = []
    try:
        for ns, addr in zip(hosts.names, hosts.addresses):
            cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "slashrt.cluster.agent", *(["--once"] if once else []),
                   "--listen", f"{addr}:{port}", "--log-level", log_level]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL))
        for proc in procs:  # each prints its address once it listens
            line = proc.stdout.readline().decode()
            if not line.startswith("slashrt-agent listening"):
                raise RuntimeError(f"an agent in a test host said {line!r} instead of its address")
    except BaseException:
        stop_agents(procs)
        raise
    return procs


def stop_agents(procs: list) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
