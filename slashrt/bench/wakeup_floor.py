"""The floor under cross-process notification latency on this machine: what waking another
process and a trio task costs, with no slashrt code in the way.

    python -m slashrt.bench.wakeup_floor [--rounds N] [--json]

- `eventfd_us`: two processes ping-pong through a pair of eventfds with blocking reads (the
  kernel's wake-up of a sleeping process, both ways): half a round trip, p50 and p99;
- `eventfd_trio_us`: the same with each side in a trio loop waiting with
  `trio.lowlevel.wait_readable` (how the shm channels park): half a round trip;
- `spin_us`: the same through a shared-memory word that each side polls without sleeping (no
  wake-up at all: the floor while both processes have a core each);
- `trio_checkpoint_us`: one `trio.lowlevel.checkpoint()` (a loop turn with nothing else to run);
- `trio_unpark_us`: a task unparks another through a `ParkingLot` and parks itself until the
  other unparks it back: half a round (a hop from a receive task to the compute coroutine).

Every figure is p50 (and p99 where given) over `rounds` rounds after a warm-up; the machine's
load average is reported beside them, since on 2 shared cores it is most of the figure.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import time

import numpy as np
import trio

__all__ = ["bench"]

WARMUP = 200


def _half_round_us(ns: list[int]) -> dict:
    a = np.asarray(ns[WARMUP:], dtype=np.float64) / 2e3
    return {"p50": round(float(np.percentile(a, 50)), 1), "p99": round(float(np.percentile(a, 99)), 1)}


def _pair(rounds: int, child, parent) -> list[int]:
    """Run `child(rounds)` in a forked process and `parent(rounds)` here; the parent's times."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child's exit skips coverage)
        try:
            child(rounds)
        finally:
            os._exit(0)
    try:
        return parent(rounds)
    finally:
        os.waitpid(pid, 0)


def eventfd_pingpong(rounds: int) -> dict:
    ping, pong = os.eventfd(0), os.eventfd(0)

    def child(n):
        for _ in range(n):
            os.eventfd_read(ping)
            os.eventfd_write(pong, 1)

    def parent(n):
        times = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            os.eventfd_write(ping, 1)
            os.eventfd_read(pong)
            times.append(time.perf_counter_ns() - t0)
        return times

    try:
        return _half_round_us(_pair(rounds + WARMUP, child, parent))
    finally:
        os.close(ping)
        os.close(pong)


def eventfd_trio_pingpong(rounds: int) -> dict:
    ping, pong = os.eventfd(0, os.EFD_NONBLOCK), os.eventfd(0, os.EFD_NONBLOCK)

    async def wait(fd):
        await trio.lowlevel.wait_readable(fd)
        os.eventfd_read(fd)

    def child(n):
        async def main():
            for _ in range(n):
                await wait(ping)
                os.eventfd_write(pong, 1)

        trio.run(main)

    def parent(n):
        async def main():
            times = []
            for _ in range(n):
                t0 = time.perf_counter_ns()
                os.eventfd_write(ping, 1)
                await wait(pong)
                times.append(time.perf_counter_ns() - t0)
            return times

        return trio.run(main)

    try:
        return _half_round_us(_pair(rounds + WARMUP, child, parent))
    finally:
        os.close(ping)
        os.close(pong)


def spin_pingpong(rounds: int) -> dict:
    shared = mmap.mmap(-1, 16)
    word = np.frombuffer(shared, dtype=np.int64, count=1)

    def child(n):
        for k in range(n):
            while word[0] != 2 * k + 1:
                pass
            word[0] = 2 * k + 2

    def parent(n):
        times = []
        for k in range(n):
            t0 = time.perf_counter_ns()
            word[0] = 2 * k + 1
            while word[0] != 2 * k + 2:
                pass
            times.append(time.perf_counter_ns() - t0)
        return times

    return _half_round_us(_pair(rounds + WARMUP, child, parent))


def trio_costs(rounds: int) -> dict:
    async def main():
        t0 = time.perf_counter_ns()
        for _ in range(rounds):
            await trio.lowlevel.checkpoint()
        checkpoint = (time.perf_counter_ns() - t0) / rounds / 1e3
        a, b = trio.lowlevel.ParkingLot(), trio.lowlevel.ParkingLot()

        async def echo():
            while True:
                await a.park()
                b.unpark_all()

        times = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(echo)
            while not len(a):  # echo parks first (an unpark of an empty lot would be lost)
                await trio.sleep(0)
            for _ in range(rounds + WARMUP):
                t0 = time.perf_counter_ns()
                a.unpark_all()
                await b.park()
                times.append(time.perf_counter_ns() - t0)
            nursery.cancel_scope.cancel()
        return {"trio_checkpoint_us": round(checkpoint, 2), "trio_unpark_us": _half_round_us(times)}

    return trio.run(main)


def bench(rounds: int = 2000) -> dict:
    return {
        "rounds": rounds,
        "load_average": os.getloadavg()[0],
        "eventfd_us": eventfd_pingpong(rounds),
        "eventfd_trio_us": eventfd_trio_pingpong(rounds),
        "spin_us": spin_pingpong(rounds),
        **trio_costs(rounds),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slashrt.bench.wakeup_floor", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    result = bench(args.rounds)
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
