"""Executor processes for tests and benchmarks of cluster parts: N real local processes, each
running one program, that find each other's listeners through this process.

    results = await run_peers("package.module:program", executors=3, transport="shm", args={...})

starts ``python -m slashrt.testing._peers`` N times with the cluster secret in
$SLASHRT_SECRET. Each runs ``await program(peer)`` where `peer` (a `Peer`) says its index,
the count, the medium, the secret and the arguments, and offers `await peer.swap(addresses)`:
every process calls it with {other index: address of its listener for that one} and gets back
{other index: address of that one's listener for it} (a rendezvous through this process, over
the processes' standard input and output, one line each way per swap). The program's result
(anything picklable) comes back in a file; an exception in the program comes back as its one-
line message ({"error": ..., "type": its class name}), a process that exits without a result
as {"error": ..., "type": "exit", "code": its exit code}. Every process is killed when the call ends, however it ends;
one that outlives `timeout` fails the call with trio.TooSlowError.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pickle
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import attrs
import trio

from slashrt._logging import level_name
from slashrt.transport._auth import generate_secret, load_secret

__all__ = ["Peer", "run_peers"]


@attrs.define
class Peer:
    """What a peer program is given."""

    index: int
    executors: int
    transport: str
    secret: bytes
    args: dict

    async def swap(self, addresses: dict[int, object]) -> dict[int, object]:
        line = json.dumps({str(k): v for k, v in addresses.items()}) + "\n"
        await trio.to_thread.run_sync(_write_line, line)
        reply = await trio.to_thread.run_sync(sys.stdin.readline)
        if not reply:
            raise EOFError("the process that started this peer closed its pipe")
        return {int(k): tuple(v) if isinstance(v, list) else v for k, v in json.loads(reply).items()}

    @property
    def where(self) -> dict:
        """Where to bind listeners: tcp on the loopback interface."""
        return {"host": "127.0.0.1"} if self.transport == "tcp" else {}


def _write_line(line: str) -> None:
    sys.stdout.write(line)
    sys.stdout.flush()


async def run_peers(program: str, *, executors: int, transport: str, args: dict | None = None, timeout: float = 120.0) -> list:
    """Run `program` ("module:function") in `executors` processes; their results by index."""
    secret = generate_secret()
    env = dict(os.environ, SLASHRT_SECRET=secret.hex(), SLASHRT_LOG_LEVEL=level_name())
    procs: list[trio.Process] = []
    with tempfile.TemporaryDirectory(prefix="slashrt-peers-") as tmp:
        outs = [Path(tmp) / f"peer{i}.pickle" for i in range(executors)]
        try:
            with trio.fail_after(timeout):
                for i in range(executors):
                    cmd = [
                        sys.executable, "-m", "slashrt.testing._peers", program, "--index", str(i),
                        "--executors", str(executors), "--transport", transport,
                        "--args", json.dumps(args or {}), "--out", str(outs[i]),
                    ]
                    procs.append(await trio.lowlevel.open_process(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE))
                await _rendezvous(procs)
                for proc in procs:
                    await proc.wait()
        finally:
            with trio.CancelScope(shield=True):
                for proc in procs:
                    if proc.returncode is None:
                        proc.kill()
                    await proc.wait()
        results = []
        for i, out in enumerate(outs):
            if out.exists():
                results.append(pickle.loads(out.read_bytes()))
            else:
                code = procs[i].returncode
                results.append({"error": f"exited with code {code} without a result", "type": "exit", "code": code})
    return results


async def _rendezvous(procs: list[trio.Process]) -> None:
    """Answer the peers' swaps, round after round, until every peer closed its output."""
    readers = [_Lines(proc.stdout) for proc in procs]
    while True:
        lines = [await reader.next() for reader in readers]
        if any(line is None for line in lines):
            # done, or a peer ended (failed) before this swap: the others' swaps fail (EOFError)
            for proc in procs:
                await proc.stdin.aclose()
            return
        offers = [{int(k): v for k, v in json.loads(line).items()} for line in lines]
        for i, proc in enumerate(procs):
            answer = {str(p): offers[p][i] for p in range(len(procs)) if p != i}
            await proc.stdin.send_all((json.dumps(answer) + "\n").encode())


class _Lines:
    def __init__(self, stream):
        self._stream, self._buffer = stream, b""

    async def next(self) -> str | None:
        while b"\n" not in self._buffer:
            chunk = await self._stream.receive_some()
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slashrt.testing._peers")
    parser.add_argument("program")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--executors", type=int, required=True)
    parser.add_argument("--transport", required=True)
    parser.add_argument("--args", default="{}")
    parser.add_argument("--out", required=True)
    a = parser.parse_args(argv)
    module, _, name = a.program.partition(":")
    program = getattr(importlib.import_module(module), name)
    peer = Peer(a.index, a.executors, a.transport, load_secret(), json.loads(a.args))
    try:
        result = trio.run(program, peer)
    except Exception as exc:
        traceback.print_exc()  # on this peer's standard error, which the test shows when it fails
        result = {"error": str(exc), "type": type(exc).__name__}
    Path(a.out).write_bytes(pickle.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
