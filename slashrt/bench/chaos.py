"""Exactly once under fire: a checkpointed cluster job whose executors are SIGKILLed, recovered
by its restart strategy, and whose committed output is checked against a failure-free run's.

    slashrt bench chaos [--kills N] [--query ysb|nexmark] [--executors N] [--transport shm|tcp]
                        [--sink csv|collect] [--seed S] [--events N] [--campaigns N] [--json]

Two kinds of kills, all SIGKILL of a real agent process:
- `kills` at random moments (seeded): a thread of this process picks one of the job's agents
  at random once they have been up a random while (0.5-2.5 s), and kills it; the job may end
  before all of them (`random_kills` says how many were made), and one that lands once the
  results are in (the agents exiting) needs no recovery;
- kills at chosen points (`CHOSEN`), fired inside the agents by hooks this module installs in
  them when the environment variable `SLASHRT_CHAOS_KILLS` is set (it is set only here and in
  the tests): "align" (an operator started aligning a barrier), "async" (a state part was
  written, its checkpoint not acknowledged), "pre_commit" (a sink pre-committed, the
  checkpoint not complete); with an in-memory sink (`ChaosCollect`, `ChaosCallback`) also
  "commit" (a checkpoint committed, its records not yet sent to the coordinator) and "sent"
  (committed records sent, `slashrt.snapshot.collected`). Each entry `point:k` fires once in the job's life (a marker file
  under `SLASHRT_CHAOS_DIR` claims it; whichever executor reaches its k-th `point` first dies),
  in order, each in an attempt (agents) started after the previous one fired: two entries
  `pre_commit:1` in a row kill the job twice before any checkpoint completes.

The sink is a transactional CSV directory (`ChaosCsv`): what a reader sees is what was
committed; or with `--sink collect` a transactional Collect (`ChaosCollect`): what the run
returns, which its executors sent the coordinator as they committed it (`CHOSEN_COLLECT`: also
after a commit before its records were sent, and after they were sent). The JSON: kills, recoveries, correct, duplicates (rows committed more often than in
the failure-free run), missing (rows committed less often), recovery seconds (p50 / max) from
each death (the killed agent's exit, as the coordinator saw it) to processing again, made of
detect_s (death to the failure raised), respawn_s (reaping the old agents, the strategy's delay,
new agent processes started and connected) and restore_s (job sent to every agent ready: the
plan built, peers wired, the state read back).
"""

from __future__ import annotations

import collections
import functools
import os
import random
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import slashrt
from slashrt.ops.sinks import Callback, Collect, CsvFile

__all__ = ["bench", "ChaosCsv", "ChaosCollect", "ChaosCallback", "CHOSEN", "published"]

KILLS_ENV, MARKS_ENV = "SLASHRT_CHAOS_KILLS", "SLASHRT_CHAOS_DIR"
POINTS = ("align", "async", "pre_commit", "commit", "sent")
# during alignment, during the asynchronous write, between pre-commit and commit, twice in a row
CHOSEN = "align:2;async:3;pre_commit:2;pre_commit:1;pre_commit:1"
# with a Collect: alignment, asynchronous write, between pre-commit and commit, after a commit
# before its records were sent, then after sending them (twice in a row)
CHOSEN_COLLECT = "align:2;async:3;pre_commit:2;commit:1;sent:1"
SINKS = ("csv", "collect")


class ChaosCsv(CsvFile):
    """A transactional CSV sink whose executors carry the chosen-point kill hooks (installed in
    the agent process when it builds its sink, if `SLASHRT_CHAOS_KILLS` is set)."""

    def for_executor(self, index: int):
        _install_hooks()
        return super().for_executor(index)

    def pre_commit(self, checkpoint: int) -> None:
        super().pre_commit(checkpoint)
        _reached("pre_commit")


class ChaosCollect(Collect):
    """A Collect whose executors carry the kill hooks (installed in the agent process when it
    unpickles the sink, if `SLASHRT_CHAOS_KILLS` is set)."""

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        _install_hooks()

    def pre_commit(self, checkpoint: int) -> None:
        super().pre_commit(checkpoint)
        _reached("pre_commit")

    def commit(self, checkpoint: int) -> None:
        super().commit(checkpoint)
        _reached("commit")


class ChaosCallback(Callback):
    """A Callback whose executors collect into a `ChaosCollect`."""

    def for_executor(self, index: int, *, transactional: bool = False) -> Collect:
        _install_hooks()
        return ChaosCollect(transactional=transactional)


_counts: collections.Counter = collections.Counter()  # per entry, this process's passes of its point
_installed = False
_BORN = time.time()  # an entry fires in a process started after the previous entry fired


def _entries() -> list[tuple[str, int]]:
    spec = os.environ.get(KILLS_ENV, "")
    entries = [(p, int(k)) for p, _, k in (e.partition(":") for e in spec.split(";") if e)]
    bad = [p for p, _ in entries if p not in POINTS]
    if bad:
        raise ValueError(f"{KILLS_ENV}: {bad[0]!r} is not a kill point ({', '.join(POINTS)})")
    return entries


def _reached(point: str) -> None:
    """SIGKILL this process if the first kill entry not yet fired is `point` and this is its k-th pass."""
    directory = os.environ.get(MARKS_ENV)
    if directory is None:
        return
    for i, (name, k) in enumerate(_entries()):
        marker = Path(directory, f"kill-{i}")
        if marker.exists():
            continue
        if name != point or i and Path(directory, f"kill-{i - 1}").stat().st_mtime >= _BORN:
            return  # (an attempt whose peer just fired the previous entry is dying: the next attempt's)
        _counts[i] += 1
        if _counts[i] >= k:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:  # another executor took this one
                return
            os.kill(os.getpid(), signal.SIGKILL)
        return


def _install_hooks() -> None:
    """Wrap, in this agent process, the moments "align", "async" and "sent" pass (once per process)."""
    global _installed
    if _installed or not os.environ.get(KILLS_ENV):
        return
    _installed = True
    from slashrt.snapshot import alignment
    from slashrt.snapshot.cluster import AgentCheckpointing
    from slashrt.snapshot.storage import SnapshotStore

    barrier, write_part = alignment._Idle.barrier, SnapshotStore.write_part

    @functools.wraps(barrier)
    def aligning(self, aligner, input, n):
        state = barrier(self, aligner, input, n)
        if isinstance(state, alignment._Aligning):
            _reached("align")
        return state

    @functools.wraps(write_part)
    def writing(self, *args, **kwargs):
        part = write_part(self, *args, **kwargs)
        _reached("async")
        return part

    alignment._Idle.barrier, SnapshotStore.write_part = aligning, writing
    send = AgentCheckpointing._send

    @functools.wraps(send)
    async def sending(self, kind, payload=None):
        records = len(self.outbox)
        await send(self, kind, payload)
        if records:
            _reached("sent")

    AgentCheckpointing._send = sending


def published(directory) -> collections.Counter:
    """The rows a reader of a transactional CSV directory sees (committed part files, headers
    dropped), counted."""
    rows: collections.Counter = collections.Counter()
    for part in Path(directory).glob("part-*.csv"):
        rows.update(part.read_text().splitlines()[1:])
    return rows


def _agents() -> list[int]:
    """The pids of this process's agent children (`slashrt.cluster.agent`), alive."""
    me, pids = os.getpid(), []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmdline = Path(entry.path, "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == me and fields[0] != "Z" and b"slashrt.cluster.agent" in cmdline:
            pids.append(int(entry.name))
    return pids


def _killer(kills: int, executors: int, rng: random.Random, done: threading.Event, times: list[float]) -> None:
    """Kill a random agent `kills` times, each once a full set of agents has been up a random while."""
    seen: set[int] = set()
    while len(times) < kills and not done.is_set():
        agents = _agents()
        if len(agents) < executors or not set(agents) - seen:  # not (re)started yet
            done.wait(0.02)
            continue
        if done.wait(rng.uniform(0.5, 2.5)):
            return
        agents = _agents()
        if len(agents) < executors:  # a chosen-point kill came first
            continue
        seen.update(agents)
        os.kill(rng.choice(sorted(agents)), signal.SIGKILL)
        times.append(time.monotonic())


def _sink(kind: str, directory: str):
    return ChaosCsv(directory, transactional=True) if kind == "csv" else ChaosCollect(transactional=True)


def _committed(kind: str, sink, directory: str) -> collections.Counter:
    """The rows `sink` committed, counted: the CSV directory's published parts, or a Collect's records."""
    if kind == "csv":
        return published(directory)
    return collections.Counter(map(tuple, sink.records.tolist()))


def _flow(query: str, events: int, executors: int, sink, campaigns: int = 1000):
    from slashrt.bench.checkpoint import _query

    inputs, make_flow, _, _ = _query(query, events, executors, campaigns)
    return make_flow(sink), inputs


def bench(
    *, kills: int = 10, query: str = "ysb", executors: int = 2, transport: str = "shm", seed: int = 0,
    events: int = 2_000_000, interval: float = 0.05, chosen: str | None = None, campaigns: int = 1000,
    sink: str = "csv",
) -> dict:
    if sink not in SINKS:
        raise ValueError(f"sink must be one of {', '.join(SINKS)}, got {sink!r}")
    chosen = (CHOSEN if sink == "csv" else CHOSEN_COLLECT) if chosen is None else chosen
    fields: dict = {"query": query, "executors": executors, "transport": transport, "seed": seed, "events": events,
                    "interval_s": interval, "chosen": chosen, "campaigns": campaigns if query == "ysb" else None,
                    "sink": sink}
    # small rings (8 slots of 4 KiB) stretch the run to seconds: time for kills in the middle of it
    options = dict(executors=executors, transport=transport, checkpoint={"interval": interval, "keep": 3}, slots=8,
                   slot_size=4096)
    with tempfile.TemporaryDirectory(prefix="slashrt-chaos-") as directory:
        out = _sink(sink, f"{directory}/ref")
        flow, inputs = _flow(query, events, executors, out, campaigns)
        clean = slashrt.run(flow, inputs, checkpoint_dir=f"{directory}/ref-chk", **options)
        fields["failure_free_s"] = round(clean.seconds, 3)
        reference = _committed(sink, out, f"{directory}/ref")

        os.makedirs(f"{directory}/marks")
        planned = len(_entries_of(chosen))
        restart = f"fixed-delay:attempts={kills + planned + 2},delay=0"
        out = _sink(sink, f"{directory}/out")
        flow, inputs = _flow(query, events, executors, out, campaigns)
        done, times = threading.Event(), []
        killer = threading.Thread(target=_killer, args=(kills, executors, random.Random(seed), done, times), daemon=True)
        saved = {k: os.environ.get(k) for k in (KILLS_ENV, MARKS_ENV)}
        os.environ.update({KILLS_ENV: chosen, MARKS_ENV: f"{directory}/marks"})
        killer.start()
        try:
            result = slashrt.run(flow, inputs, checkpoint_dir=f"{directory}/chk", restart=restart, **options)
        finally:
            done.set()
            killer.join()
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        fired = len(os.listdir(f"{directory}/marks"))
        got = _committed(sink, out, f"{directory}/out")
    duplicates = sum(((got - reference) & got).values())
    missing = sum((reference - got).values())
    recoveries = result.recoveries
    fields.update(
        kills=len(times) + fired, random_kills_asked=kills, random_kills=len(times), chosen_kills=fired, recoveries=len(recoveries),
        rows=sum(reference.values()), correct=got == reference, duplicates=duplicates, missing=missing,
    )
    fields.update(_seconds("recovery_s", [r["seconds"] for r in recoveries if "seconds" in r]))
    fields.update(_seconds("restore_s", [r["restore_s"] for r in recoveries if "restore_s" in r]))
    for name in ("detect_s", "respawn_s"):
        fields.update(_seconds(name, [r[name] for r in recoveries if "seconds" in r]))
    completed = [c for c in result.checkpoints if c["status"] == "completed"]
    fields["checkpoint_bytes"] = round(statistics.mean(c["bytes"] for c in completed)) if completed else 0
    fields["redis"] = False
    return fields


def _entries_of(spec: str) -> list[str]:
    return [e for e in spec.split(";") if e]


def _seconds(name: str, values: list[float]) -> dict:
    if not values:
        return {f"{name}_p50": None, f"{name}_max": None}
    return {f"{name}_p50": round(statistics.median(values), 3), f"{name}_max": round(max(values), 3)}
