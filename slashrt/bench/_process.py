"""A consumer executor here, its producer in another process, one channel between them.

`run_with_producer` opens a listener of the chosen transport, starts
`python -m <producer module> --transport T --address A --slot-size B --slots C ...` with the
cluster secret in $SLASHRT_SECRET, accepts its channel and runs a dataflow on it. The
producer is killed if it outlives a bounded time or the consumer fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import trio

from slashrt._dataflow import Dataflow
from slashrt._logging import level_name
from slashrt._runtime import RunResult, run_receivers
from slashrt.transport import RingSpec, Sender
from slashrt.transport._auth import generate_secret
from slashrt.transport._registry import open_channels, open_slot_pool

__all__ = ["run_with_producer", "producer_channel", "PRODUCER_TIMEOUT"]

PRODUCER_TIMEOUT = 300.0


async def run_with_producer(
    transport: str, spec: RingSpec, flow: Dataflow, source: str, module: str, args: list[str], floating: int = 0
) -> RunResult:
    """Run `flow` on the channel a producer process (`module`, with `args`) streams `source`
    into; with `floating`, a channel of a slot pool with that many floating slots."""
    secret = generate_secret()
    pool = open_slot_pool(transport, spec, channels=1, floating=floating) if floating else None
    async with contextlib.AsyncExitStack() as stack, open_channels() as channels:
        if pool is not None:
            stack.callback(pool.close)  # after the channel
        listener = await channels.listen(transport, spec, secret, **({"pool": pool} if pool is not None else {}))
        cmd = [
            sys.executable, "-m", module, "--transport", transport, "--address", json.dumps(listener.address),
            "--slot-size", str(spec.slot_size), "--slots", str(spec.slots), *args,
        ]
        # the producer's output (its log lines) goes to stderr: stdout is the result's (--json)
        # (and logs at this process's level)
        env = dict(os.environ, SLASHRT_SECRET=secret.hex(), SLASHRT_LOG_LEVEL=level_name())
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=2)
        try:
            with trio.fail_after(PRODUCER_TIMEOUT):
                receiver = await channels.accept(listener)
                try:
                    result = await run_receivers(flow, {source: receiver})
                finally:
                    await receiver.aclose()
                if pool is not None:  # the most floating slots the channel borrowed at once
                    result.stats[0].floating_peak = pool.peak
                await trio.to_thread.run_sync(proc.wait)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"the producer process {module} failed with exit code {proc.returncode}")
    return result


@contextlib.asynccontextmanager
async def producer_channel(args, spec: RingSpec, secret: bytes) -> AsyncIterator[Sender]:
    """In a producer process: a sender connected to the consumer named on the command line,
    driven until the block ends."""
    address = json.loads(args.address)
    async with open_channels() as channels:
        yield await channels.connect(args.transport, tuple(address) if isinstance(address, list) else address, spec, secret)
