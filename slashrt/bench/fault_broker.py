"""Fault trials of `slashrt bench chaos --faults`: the Redis broker fails under a running job.

A checkpointed cluster job reads a Redis stream and writes a transactional Redis stream
(`RedisStream` -> `RedisStreamSink(transactional=True)`), on a throw-away redis-server with an
append-only file (`slashrt.testing.redis_server(persistent=True)`: what the broker
acknowledged survives its death, as with a production broker's AOF), under the restart
strategy "fixed-delay:attempts=20,delay=0.5". Once two checkpoints completed:

- `broker-outage` (`outage`): the redis-server is SIGKILLed and started again on the same port
  3 s later;
- `broker-hang` (`hang`): it is SIGSTOPped for the broker timeout and 2 s more, then SIGCONTed.

The stream is slowed (`_held.HeldUntil`) until the fault was made, so the fault always meets a running
job. Each trial returns the `--faults` fields: `exact` (the published output holds every input
record once: `duplicates` and `missing` are 0), `refused` (the job ended with a sentence
instead, `cause`), `cause` (the first recovered failure's sentence, or the final one),
`recoveries`, `recovery_s` (each from the failure's first agent exit, or its detection, to
processing again: the outage itself included), `seconds` (the job's wall time). `args` may set `executors`, `transport` and
`broker_records` (the input's size, 30,000 records by default).
"""

from __future__ import annotations

import glob
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from slashrt.bench._held import HeldUntil

__all__ = ["outage", "hang", "TRIALS"]

RESTART = "fixed-delay:attempts=20,delay=0.5"
TIMEOUT = 1.0  # the broker timeout of the trial's source and sink (seconds)
RECORDS = 30_000
OUTAGE_S = 3.0


def _schema():
    from slashrt import Schema

    return Schema({"t": "<i8", "k": "<i8", "v": "<i8"})


def _flow(url: str, until: str):
    from slashrt import Dataflow
    from slashrt.connectors import RedisStreamSink

    flow = Dataflow("broker")
    events = flow.source("events", _schema(), time="t", max_delay=20).filter(HeldUntil(until, 0.01), name="held")
    events.sink(RedisStreamSink(url, "out", transactional=True, timeout=TIMEOUT), name="out")
    return flow


def outage(args) -> dict:
    def fault(server) -> None:
        server.kill()
        time.sleep(OUTAGE_S)
        server.restart()

    return _trial("broker-outage", fault, args)


def hang(args) -> dict:
    def fault(server) -> None:
        server.pause()
        time.sleep(TIMEOUT + 2.0)
        server.resume()

    return _trial("broker-hang", fault, args)


TRIALS = {"broker-outage": outage, "broker-hang": hang}


def _trial(name: str, fault, args) -> dict:
    import slashrt
    from slashrt.connectors import RedisStream, read_stream, write_stream
    from slashrt.errors import SlashError
    from slashrt.testing import redis_server

    executors = int(getattr(args, "executors", None) or 2)
    n = int(getattr(args, "broker_records", None) or RECORDS)
    transport = getattr(args, "transport", None) or "shm"
    records = np.zeros(n, _schema().dtype)
    records["t"] = np.arange(n)
    records["k"], records["v"] = records["t"] % 13, records["t"] * 3
    with tempfile.TemporaryDirectory(prefix="slashrt-fault-broker-") as tmp, redis_server(persistent=True) as server:
        write_stream(server.url, "in", records, entry_bytes=2400)
        fired, ended, made = Path(tmp) / "fired", threading.Event(), []

        def make() -> None:
            try:
                while len(glob.glob(f"{tmp}/chk/*/chk-*/_manifest.json")) < 2:
                    if ended.wait(0.01):
                        return  # the job ended first: reported as no fault made
                fault(server)
                made.append(True)
            finally:
                fired.touch()

        thread = threading.Thread(target=make, name=f"fault {name}", daemon=True)
        thread.start()
        started, result, cause = time.perf_counter(), None, None
        try:
            result = slashrt.run(_flow(server.url, str(fired)), {"events": RedisStream(server.url, "in", count=4,
                                                                                      timeout=TIMEOUT)},
                                 executors=executors, transport=transport, checkpoint={"interval": 0.05, "keep": 3},
                                 checkpoint_dir=Path(tmp) / "chk", restart=RESTART, slots=4, slot_size=1024)
        except SlashError as exc:
            cause = str(exc)
        finally:
            seconds = time.perf_counter() - started
            ended.set()
            thread.join()
            server.resume()
        got = read_stream(server.url, "out", _schema())["t"]
    seen = np.bincount(got, minlength=n)
    duplicates, missing = int((seen > 1).sum()), int((seen == 0).sum())
    recoveries = result.recoveries if result is not None else []
    if cause is None and recoveries:
        cause = recoveries[0]["cause"]
    return {"fault": name, "made": bool(made), "refused": result is None,
            "exact": result is not None and duplicates == 0 and missing == 0,
            "duplicates": duplicates, "missing": missing, "cause": cause, "recoveries": len(recoveries),
            "recovery_s": [round(r["seconds"], 2) for r in recoveries if "seconds" in r],
            "executors": executors, "transport": transport, "records": n, "restart": RESTART,
            "broker_timeout_s": TIMEOUT, "seconds": round(seconds, 3)}
