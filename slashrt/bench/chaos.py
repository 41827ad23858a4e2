"""Exactly once under fire: a checkpointed cluster job whose executors are SIGKILLed, recovered
by its restart strategy, and whose committed output is checked against a failure-free run's.

    slashrt bench chaos [--kills N|0] [--query ysb|nexmark] [--executors N] [--transport shm|tcp]
                        [--sink csv|collect] [--seed S] [--events N] [--campaigns N] [--redis] [--json]
    slashrt bench chaos --faults a,b,... [--executors N] [--json]    (fault trials: `slashrt.bench.faults`)

Two kinds of kills, all SIGKILL of a real agent process:
- `kills` at random moments (seeded): a thread of this process picks one of the job's agents
  at random once they have been up a random while (0.5-2.5 s), and kills it (0: none). The
  sources pace (below) until they are all made, and the input is sized from them (`EVENTS`,
  or `EVENTS_PER_KILL` a kill); a run given too few `events` may still end first: then
  `random_kills` < `random_kills_asked` and `kills_short` says so and what to give (a warning
  too). One that lands once the results are in (the agents exiting) needs no recovery;
- kills at chosen points (`CHOSEN`), fired inside the agents by hooks this module installs in
  them when the environment variable `SLASHRT_CHAOS_KILLS` is set (it is set only here and in
  the tests): "align" (an operator started aligning a barrier), "async" (a state part was
  written, its checkpoint not acknowledged), "pre_commit" (a sink pre-committed, the
  checkpoint not complete); with an in-memory sink (`ChaosCollect`, `ChaosCallback`) also
  "commit" (a checkpoint committed, its records not yet sent to the coordinator) and "sent"
  (committed records sent, `slashrt.snapshot.collected`). Each entry `point:k` fires once in the job's life (a marker file
  under `SLASHRT_CHAOS_DIR` claims it; whichever executor reaches its k-th `point` first dies),
  in order, each in an attempt (agents) started after the previous one fired: two entries
  `pre_commit:1` in a row kill the job twice before any checkpoint completes. With
  `SLASHRT_CHAOS_PACE` (seconds; the bench sets 0.002) each source of an agent takes that much
  more per run of buffers until every chosen kill fired and the random ones were made (the
  file `RANDOM_PENDING` is gone), so that however fast the machine (or slow its checkpoints)
  the job cannot end before them.

The sink is a transactional CSV directory (`ChaosCsv`): what a reader sees is what was
committed; or with `--sink collect` a transactional Collect (`ChaosCollect`): what the run
returns, which its executors sent the coordinator as they committed it (`CHOSEN_COLLECT`: also
after a commit before its records were sent, and after they were sent). With `redis` the input is a Redis stream (`RedisStream`, its entries shared among
the executors) holding the query's events in event-time order, and the sink a transactional
Redis stream (`ChaosRedis`), on a throw-away redis-server (or the one at `url`, under fresh
keys removed after): both ends of a broker under the same kills. The JSON: kills, recoveries, correct, duplicates (rows committed more often than in
the failure-free run), missing (rows committed less often), recovery seconds (p50 / max) from
each death (the killed agent's exit, as the coordinator saw it) to processing again, made of
detect_s (death to the failure raised, the old agents reaped), respawn_s (the strategy's delay,
new agents forked by the run's zygote, `slashrt.cluster._zygote`, and connected) and restore_s
(job sent to every agent ready: the plan built, peers wired, the state read back, the input
sought to the checkpoint's position; each agent logs its steps' seconds with "executor ready",
at --log-level info).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import random
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import structlog

import slashrt
from slashrt.connectors.redis_sink import RedisStreamSink
from slashrt.ops.sinks import Callback, Collect, CsvFile

__all__ = ["bench", "ChaosCsv", "ChaosRedis", "ChaosCollect", "ChaosCallback", "CHOSEN", "published", "committed"]

KILLS_ENV, MARKS_ENV, PACE_ENV = "SLASHRT_CHAOS_KILLS", "SLASHRT_CHAOS_DIR", "SLASHRT_CHAOS_PACE"
RANDOM_PENDING = "random-pending"  # in the markers' directory while the random kills are not all made
EVENTS, EVENTS_PER_KILL = 2_000_000, 200_000  # the default input: this, or this many per random kill
PACE = 0.002  # the bench's: a run of 100k events per executor feeds ~800 runs of buffers
POINTS = ("align", "async", "pre_commit", "commit", "sent")
# during alignment, during the asynchronous write, between pre-commit and commit, twice in a row
CHOSEN = "align:2;async:3;pre_commit:2;pre_commit:1;pre_commit:1"
# with a Collect: alignment, asynchronous write, between pre-commit and commit, after a commit
# before its records were sent, then after sending them (twice in a row)
CHOSEN_COLLECT = "align:2;async:3;pre_commit:2;commit:1;sent:1"
log = structlog.get_logger("slashrt.bench.chaos")
SINKS = ("csv", "collect")


class _Hooked:
    """A transactional sink whose executors carry the chosen-point kill hooks (installed in the
    agent process when it builds its sink, if `SLASHRT_CHAOS_KILLS` is set)."""

    def for_executor(self, index: int):
        _install_hooks()
        return super().for_executor(index)

    def pre_commit(self, checkpoint: int) -> None:
        super().pre_commit(checkpoint)
        _reached("pre_commit")


class ChaosCsv(_Hooked, CsvFile):
    """A transactional CSV directory with the kill hooks."""


class ChaosRedis(_Hooked, RedisStreamSink):
    """A transactional Redis stream sink with the kill hooks."""


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


def _reborn() -> None:
    global _BORN
    _BORN = time.time()


os.register_at_fork(after_in_child=_reborn)  # an agent forked by a zygote that imported this module is born now


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


_all_fired = False


def _fired() -> bool:
    """Every chosen kill fired (its marker exists) and the random ones were made: once true,
    stays true in this process."""
    global _all_fired
    if not _all_fired:
        directory = os.environ.get(MARKS_ENV)
        if directory is None:
            _all_fired = True
        else:
            names = set(os.listdir(directory))
            _all_fired = RANDOM_PENDING not in names and all(f"kill-{i}" in names for i in range(len(_entries())))
    return _all_fired


def _install_hooks() -> None:
    """Wrap, in this agent process, the moments "align", "async" and "sent" pass (once per process)."""
    global _installed
    if _installed or not os.environ.get(KILLS_ENV):
        return
    _installed = True
    from slashrt.snapshot import alignment
    from slashrt.snapshot.cluster_agent import AgentCheckpointing
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
    pace = float(os.environ.get(PACE_ENV) or 0)
    if pace:
        from slashrt.snapshot.runtime import SourceBarriers

        due = SourceBarriers.due

        def pacing(barriers):  # asked by every source between two runs of buffers (or reads)
            if not _fired():
                time.sleep(pace)
            return due.fget(barriers)

        SourceBarriers.due = property(pacing)


def published(directory) -> collections.Counter:
    """The rows a reader of a transactional CSV directory sees (committed part files, headers
    dropped), counted."""
    rows: collections.Counter = collections.Counter()
    for part in Path(directory).glob("part-*.csv"):
        rows.update(part.read_text().splitlines()[1:])
    return rows


def committed(url: str, key: str, dtype) -> collections.Counter:
    """The records a reader of the Redis stream `key` sees (what was committed), counted by
    their bytes (one np.unique over the records, not a loop over them)."""
    import numpy as np

    from slashrt.connectors import read_stream

    records = read_stream(url, key, dtype)
    rows, counts = np.unique(records.view(np.dtype((np.void, records.dtype.itemsize))), return_counts=True)
    return collections.Counter(dict(zip((r.tobytes() for r in rows), counts.tolist())))


def _agents() -> list[int]:
    """The pids of this process's agents, alive: its children running `slashrt.cluster.agent`,
    and the children of its zygotes (`slashrt.cluster._zygote`: every one an agent)."""
    children: dict[int, list[tuple[int, bytes]]] = collections.defaultdict(list)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmdline = Path(entry.path, "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            children[int(fields[1])].append((int(entry.name), cmdline))
    mine = children[os.getpid()]
    zygotes = [pid for pid, cmdline in mine if b"slashrt.cluster._zygote" in cmdline]
    return [pid for pid, cmdline in mine if b"slashrt.cluster.agent" in cmdline] + [
        pid for z in zygotes for pid, _ in children[z]]


def _killer(kills: int, executors: int, rng: random.Random, done: threading.Event, times: list[float],
            pending: Path) -> None:
    """Kill a random agent `kills` times, each once a full set of agents has been up a random
    while; then remove `pending` (the sources pace until then)."""
    try:
        _kill(kills, executors, rng, done, times)
    finally:
        pending.unlink(missing_ok=True)


def _kill(kills: int, executors: int, rng: random.Random, done: threading.Event, times: list[float]) -> None:
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


def _flow(query: str, events: int, executors: int, sink, campaigns: int = 1000):
    from slashrt.bench.checkpoint import _query

    # random chunks (`long_stream.RandomStream`): an input with keys and windows drawn at random
    # checks more rows than tiled chunks would, and a recovery seeks to its checkpoint's chunk
    # (made again whole, the input took seconds of each recovery: docs/benchmarks.md)
    inputs, make_flow, _, _ = _query(query, events, executors, campaigns, chunked=False)
    return make_flow(sink), inputs


class _Files:
    """The CSV ends: the query's generated input, each run's output a transactional directory."""

    def __init__(self, query: str, events: int, executors: int, campaigns: int, directory: str):
        self.query, self.events, self.executors, self.campaigns, self.directory = query, events, executors, campaigns, directory
        self.sinks: dict = {}

    def run(self, name: str, **options):
        flow, inputs = _flow(self.query, self.events, self.executors, ChaosCsv(f"{self.directory}/{name}",
                                                                               transactional=True), self.campaigns)
        return slashrt.run(flow, inputs, **options)

    def output(self, name: str) -> collections.Counter:
        return published(f"{self.directory}/{name}")


class _Collected(_Files):
    """The Collect end: the query's generated input, each run's output a transactional
    `ChaosCollect` (what the run returns: what its executors committed and sent the coordinator)."""

    def run(self, name: str, **options):
        sink = self.sinks[name] = ChaosCollect(transactional=True)
        flow, inputs = _flow(self.query, self.events, self.executors, sink, self.campaigns)
        return slashrt.run(flow, inputs, **options)

    def output(self, name: str) -> collections.Counter:
        return collections.Counter(map(tuple, self.sinks[name].records.tolist()))


class _Redis(_Files):
    """The Redis ends: the query's input written once into a stream (in event-time order), read
    by a `RedisStream` shared among the executors; each run's output a transactional stream."""

    def __init__(self, url: str, *args):
        import uuid

        import numpy as np

        from slashrt._plan import build_plan
        from slashrt.connectors import write_stream

        super().__init__(*args)
        self.url, self.prefix = url, f"slashrt-chaos-{uuid.uuid4().hex[:8]}"  # nothing of a user's server is touched
        flow, inputs = _flow(self.query, self.events, self.executors, slashrt.sinks.Collect(), self.campaigns)
        (name, make), = inputs.items()
        records = np.concatenate([c for i in range(self.executors) for c in make.make(i, self.executors)])
        time = next(iter(build_plan(flow).sources.values())).time
        if time is not None:  # in event-time order, as a log of events would be
            records = records[np.argsort(records[time], kind="stable")]
        self.source = name
        write_stream(url, f"{self.prefix}:events", records)
        self.dtype = None

    def run(self, name: str, **options):
        from slashrt.connectors import RedisStream

        sink = ChaosRedis(self.url, f"{self.prefix}:{name}", transactional=True)
        flow, _ = _flow(self.query, self.events, self.executors, sink, self.campaigns)
        result = slashrt.run(flow, {self.source: RedisStream(self.url, f"{self.prefix}:events")}, **options)
        self.dtype = sink.record_dtype
        return result

    def output(self, name: str) -> collections.Counter:
        return committed(self.url, f"{self.prefix}:{name}", self.dtype)

    def remove(self) -> None:
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            stale = list(client.scan_iter(match=f"{self.prefix}:*"))
            if stale:
                client.delete(*stale)
        finally:
            client.close()


def bench(
    *, kills: int = 10, query: str = "ysb", executors: int = 2, transport: str = "shm", seed: int = 0,
    events: int | None = None, interval: float = 0.05, chosen: str | None = None, campaigns: int = 1000,
    redis: bool = False, url: str | None = None, sink: str = "csv",
) -> dict:
    """Run the chaos trial (see the module doc); `redis`: with the Redis source and sink, on the
    server at `url` or a throw-away redis-server; `sink`: "csv" or "collect" (without `redis`);
    `events` (default: `EVENTS`, or `EVENTS_PER_KILL` per random kill, whichever is more)."""
    if events is None:
        events = max(EVENTS, EVENTS_PER_KILL * kills)
    if sink not in SINKS:
        raise ValueError(f"sink must be one of {', '.join(SINKS)}, got {sink!r}")
    if redis and sink != "csv":
        raise ValueError("redis: the Redis trial has a Redis sink; sink= chooses the sink of the other trials")
    chosen = (CHOSEN_COLLECT if sink == "collect" else CHOSEN) if chosen is None else chosen
    if not redis:
        with tempfile.TemporaryDirectory(prefix="slashrt-chaos-") as directory:
            ends = (_Collected if sink == "collect" else _Files)(query, events, executors, campaigns, directory)
            return _trial(ends, directory, kills, query, executors, transport, seed, events, interval, chosen, campaigns)
    from slashrt.testing import redis_server

    with contextlib.ExitStack() as stack:
        if url is None:
            url = stack.enter_context(redis_server()).url
        directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="slashrt-chaos-"))
        ends = _Redis(url, query, events, executors, campaigns, directory)
        stack.callback(ends.remove)
        return _trial(ends, directory, kills, query, executors, transport, seed, events, interval, chosen, campaigns)


def _trial(ends, directory: str, kills: int, query: str, executors: int, transport: str, seed: int, events: int,
           interval: float, chosen: str, campaigns: int) -> dict:
    fields: dict = {"query": query, "executors": executors, "transport": transport, "seed": seed, "events": events,
                    "interval_s": interval, "chosen": chosen, "campaigns": campaigns if query == "ysb" else None}
    # small rings (8 slots of 4 KiB) stretch the run to seconds: time for kills in the middle of it
    options = dict(executors=executors, transport=transport, checkpoint={"interval": interval, "keep": 3}, slots=8,
                   slot_size=4096)
    clean = ends.run("ref", checkpoint_dir=f"{directory}/ref-chk", **options)
    fields["failure_free_s"] = round(clean.seconds, 3)
    reference = ends.output("ref")

    os.makedirs(f"{directory}/marks")
    pending = Path(directory, "marks", RANDOM_PENDING)
    pending.touch()  # the sources pace until the random kills are made too, not only the chosen ones
    planned = len(_entries_of(chosen))
    restart = f"fixed-delay:attempts={kills + planned + 2},delay=0"
    done, times = threading.Event(), []
    killer = threading.Thread(target=_killer, args=(kills, executors, random.Random(seed), done, times, pending),
                              daemon=True)
    saved = {k: os.environ.get(k) for k in (KILLS_ENV, MARKS_ENV, PACE_ENV)}
    os.environ.update({KILLS_ENV: chosen, MARKS_ENV: f"{directory}/marks", PACE_ENV: str(PACE)})
    killer.start()
    try:
        result = ends.run("out", checkpoint_dir=f"{directory}/chk", restart=restart, **options)
    finally:
        done.set()
        killer.join()
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    fired = sum(name.startswith("kill-") for name in os.listdir(f"{directory}/marks"))
    got = ends.output("out")
    duplicates = sum(((got - reference) & got).values())
    missing = sum((reference - got).values())
    recoveries = result.recoveries
    fields.update(
        kills=len(times) + fired, random_kills_asked=kills, random_kills=len(times), chosen_kills=fired, recoveries=len(recoveries),
        rows=sum(reference.values()), correct=got == reference, duplicates=duplicates, missing=missing,
        kills_short=None,
    )
    if len(times) < kills:  # the run ended first: say so, and what makes it long enough
        fields["kills_short"] = (f"the run ended after {len(times)} of {kills} random kills: its {events:,} events were "
                                 f"processed first; give more --events (e.g. {EVENTS_PER_KILL * 2 * kills:,})")
        log.warning("fewer random kills than asked", reason=fields["kills_short"])
    fields.update(_seconds("recovery_s", [r["seconds"] for r in recoveries if "seconds" in r]))
    fields.update(_seconds("restore_s", [r["restore_s"] for r in recoveries if "restore_s" in r]))
    for name in ("detect_s", "respawn_s"):
        fields.update(_seconds(name, [r[name] for r in recoveries if "seconds" in r]))
    completed = [c for c in result.checkpoints if c["status"] == "completed"]
    fields["checkpoint_bytes"] = round(statistics.mean(c["bytes"] for c in completed)) if completed else 0
    fields["redis"] = isinstance(ends, _Redis)
    fields["sink"] = "redis" if isinstance(ends, _Redis) else "collect" if isinstance(ends, _Collected) else "csv"
    return fields


def _entries_of(spec: str) -> list[str]:
    return [e for e in spec.split(";") if e]


def _seconds(name: str, values: list[float]) -> dict:
    if not values:
        return {f"{name}_p50": None, f"{name}_max": None}
    return {f"{name}_p50": round(statistics.median(values), 3), f"{name}_max": round(max(values), 3)}
