"""The fork server of a run with local executors (`slashrt.cluster._zygote`): its agents, the
first ones and (with a restart strategy) the replacements of killed ones, are forked from one
zygote that imported slashrt once; their deaths are named as spawned agents' are; nothing
outlives the run, nor a coordinator killed by SIGKILL; `RunResult.startup_s` says how long the
run took to process. A `Session`'s zygote serves run after run, each run's agents gone with it."""

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import trio

import slashrt
from slashrt import Dataflow, Schema, Tumbling
from slashrt.bench import chaos
from slashrt.bench.chaos import ChaosCsv, published
from slashrt.cluster import ClusterError, PerExecutor
from slashrt.cluster._zygote import Session, open_zygote
from slashrt.ops.sinks import Collect

from tests.cluster._processes import children
from tests.snapshot._paced import until_fired

SCHEMA = Schema({"ts": "i8", "key": "i8", "value": "i8"})


def _make(index, executors, n=40_000):
    out = np.zeros(n, SCHEMA.dtype)
    out["ts"] = np.arange(n) // 10
    out["key"] = np.arange(n) % 20
    out["value"] = index
    return out


def _note_parent(directory, pace, batch):
    """Once per process: a file `agent-<pid>` holding its parent's pid and command line."""
    note = Path(directory, f"agent-{os.getpid()}")
    if not note.exists():
        parent = os.getppid()
        note.write_text(f"{parent}\n{Path(f'/proc/{parent}/cmdline').read_bytes().decode(errors='replace')}")
    return pace(batch) if pace is not None else np.ones(len(batch), bool)


def _flow(out, notes, pace=None) -> Dataflow:
    f = Dataflow("zygote")
    step = functools.partial(_note_parent, str(notes), pace)
    f.source("r", SCHEMA, time="ts").filter(step, name="noted").window(Tumbling(ms=100)).sum(
        "value", key="key", output="total").sink(ChaosCsv(out, transactional=True), name="out")
    return f


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def _parents(notes: Path) -> dict[int, str]:
    """agent pid -> its parent's "pid\\ncommand line"."""
    return {int(p.name.split("-")[1]): p.read_text() for p in notes.glob("agent-*")}


def test_agents_and_their_replacements_are_forked_from_one_zygote_and_nothing_is_left(tmp_path, monkeypatch):
    notes, marks = tmp_path / "notes", tmp_path / "marks"
    notes.mkdir()
    marks.mkdir()
    kills = "pre_commit:1"  # executor 0 or 1 dies once its sink pre-committed: one recovery
    monkeypatch.setenv(chaos.KILLS_ENV, kills)
    monkeypatch.setenv(chaos.MARKS_ENV, str(marks))
    before = children()
    result = slashrt.run(_flow(tmp_path / "out", notes, until_fired(marks, kills)), {"r": PerExecutor(_make, deterministic=True)},
                         executors=2, checkpoint={"interval": 0.02, "keep": 2}, checkpoint_dir=tmp_path / "chk",
                         restart="fixed-delay:attempts=2,delay=0", slots=8, slot_size=1024, partitions=16)
    assert len(result.recoveries) == 1 and "killed by signal 9 (SIGKILL)" in result.recoveries[0]["cause"]
    parents = _parents(notes)
    assert len(parents) >= 3, parents  # the first two agents and at least one replacement
    assert len(set(parents.values())) == 1, parents  # one parent: the zygote
    zygote, cmdline = next(iter(parents.values())).split("\n")
    assert "slashrt.cluster._zygote" in cmdline
    # every agent, and the zygote, ended with the run; no child of this process is left
    assert all(_gone(pid) for pid in [*parents, int(zygote)]), parents
    assert children() - before == set()
    rows = published(tmp_path / "out")  # (exactness under kills: tests/snapshot/test_recovery.py)
    assert sum(rows.values()) == 40 * 20 and max(rows.values()) == 1


@pytest.mark.parametrize("executors", [2, 3])
def test_a_run_without_restarts_forks_its_agents_from_one_zygote_and_says_how_long_it_took_to_start(
        tmp_path, executors):
    notes = tmp_path / "notes"
    notes.mkdir()
    before = children()
    started = time.monotonic()
    result = slashrt.run(_flow(tmp_path / "out", notes), {"r": PerExecutor(_make, deterministic=True)},
                         executors=executors, checkpoint_dir=tmp_path / "chk", slots=8, slot_size=1024, partitions=16)
    called = time.monotonic() - started
    parents = _parents(notes)
    assert len(parents) == executors and len(set(parents.values())) == 1, parents
    zygote, cmdline = next(iter(parents.values())).split("\n")
    assert "slashrt.cluster._zygote" in cmdline and int(zygote) != os.getpid()
    assert all(_gone(pid) for pid in [*parents, int(zygote)]) and children() - before == set(), parents
    # from the call to processing: within the call, and before the processing it precedes
    assert 0 < result.startup_s < called - result.seconds, (result.startup_s, called, result.seconds)
    rows = published(tmp_path / "out")  # 40 windows x 20 keys, each 50 records of every executor
    total = 50 * sum(range(executors))
    assert sum(rows.values()) == 40 * 20 and max(rows.values()) == 1, rows
    assert all(int(row.rsplit(",", 1)[1]) == total for row in rows), rows


def _killing(mark, batch):
    """Executor 1 SIGKILLs itself in its first batch past 50 ms (once: `mark`)."""
    if len(batch) and batch["value"][0] == 1 and batch["ts"][0] > 50 and not os.path.exists(mark):
        Path(mark).write_text("killed")
        os.kill(os.getpid(), signal.SIGKILL)
    return batch


def _attempt(flow, **options):
    """One attempt of the recovery loop, its agents forked by a zygote."""
    from slashrt.cluster.coordinator import _run_attempt

    async def run():
        async with open_zygote() as zygote:
            return await _run_attempt(flow, {"r": PerExecutor(_make)}, executors=2, zygote=zygote, **options)

    return trio.run(run)


def test_a_forked_agent_killed_mid_job_is_named_as_a_spawned_one_is(tmp_path):
    f = Dataflow("zygote")
    f.source("r", SCHEMA, time="ts").apply(functools.partial(_killing, str(tmp_path / "mark"))).window(
        Tumbling(ms=100)).count(key="key").sink(slashrt.sinks.Collect(), name="out")
    before = children()
    with pytest.raises(ClusterError, match=r"^executor 1 was killed by signal 9 \(SIGKILL\)") as err:
        _attempt(f, epoch_bytes=4096)
    assert err.value.retryable
    assert children() - before == set()


@pytest.mark.parametrize("index", [0, 1])
def test_a_forked_agent_killed_before_the_driver_reached_it_is_named_so(index, monkeypatch):
    """Forced interleaving, as for spawned agents (test_liveness.py): SIGKILLed right after it
    said where it listens."""
    from slashrt.cluster import coordinator

    spawn = coordinator._spawn_agent

    async def spawn_then_kill(secret, i, procs, silent_s, relay, zygote, **options):
        address = await spawn(secret, i, procs, silent_s, relay, zygote, **options)
        if i == index:
            procs[i].kill()
        return address

    monkeypatch.setattr(coordinator, "_spawn_agent", spawn_then_kill)
    f = Dataflow("zygote")
    f.source("r", SCHEMA, time="ts").window(Tumbling(ms=100)).count(key="key").sink(slashrt.sinks.Collect(), name="out")
    with pytest.raises(ClusterError, match=rf"^executor {index} was killed by signal 9 \(SIGKILL\) before the driver "
                                           "reached it") as err:
        _attempt(f, heartbeat_interval=0.25, heartbeat_timeout=1.5)
    assert err.value.retryable


_COORDINATOR = """
import functools, sys
import numpy as np
import slashrt
from slashrt.cluster import PerExecutor
from tests.cluster import test_zygote as t
from tests.snapshot._paced import Paced

notes = sys.argv[1]
slow = Paced(seconds=0.05)  # a run of minutes: it is killed long before its end
slashrt.run(t._flow(notes + "/out", notes, slow), {"r": PerExecutor(functools.partial(t._make, n=10**6), deterministic=True)}, executors=2,
            checkpoint=0.5, checkpoint_dir=notes + "/chk", restart="fixed-delay:attempts=1,delay=0", slots=8,
            slot_size=1024)
"""


def _killed_coordinator_leaves_nothing(script: str, directory) -> None:
    """Run `script` (a coordinator) in a process, SIGKILL it once two agents are up: its zygote
    and agents must be gone soon after."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
    coordinator = subprocess.Popen([sys.executable, "-c", script, str(directory)], env=env, stdin=subprocess.DEVNULL)
    agents: dict = {}
    try:
        deadline = time.monotonic() + 120  # (a bound on a loaded machine, not a pace: it waits for the agents)
        while len(agents := _parents(directory)) < 2:
            assert coordinator.poll() is None and time.monotonic() < deadline, "the agents did not start"
            time.sleep(0.05)
        zygote = int(next(iter(agents.values())).split("\n")[0])
        coordinator.kill()
        coordinator.wait()
        deadline = time.monotonic() + 30  # the zygote sees its socket close; agents their parent go (0.5 s)
        while not all(_gone(pid) for pid in [zygote, *agents]):
            assert time.monotonic() < deadline, "left behind by a coordinator killed by SIGKILL"
            time.sleep(0.05)
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
            coordinator.wait()
        for pid in agents:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_coordinator_killed_by_sigkill_leaves_no_zygote_nor_agent(tmp_path):
    _killed_coordinator_leaves_nothing(_COORDINATOR, tmp_path)


def test_a_frozen_zygote_is_named_within_the_listen_timeout():
    """A zygote that does not answer (SIGSTOPped) fails the spawn at the timeout in one
    sentence, and is still stopped and reaped with the run."""
    from slashrt.cluster.coordinator import _spawn_agent

    async def main():
        async with open_zygote() as zygote:
            zygote.proc.send_signal(signal.SIGSTOP)
            try:
                async with trio.open_nursery() as relay:
                    await _spawn_agent(b"0" * 32, 1, [None], 1.0, relay, zygote)
            finally:
                zygote.proc.send_signal(signal.SIGCONT)

    before = children()
    with pytest.raises(ClusterError, match=r"^cannot start executor 1: the executors' fork server did not answer "
                                           r"within 1 s$"):
        trio.run(main)
    assert children() - before == set()


def test_the_jobs_modules_are_imported_once_by_the_zygote_not_by_each_agent(tmp_path, monkeypatch):
    """The zygote unpickles the flow before its first fork: a module of the job (a filter's) is
    imported there once, and the agents forked from it, replacements included, have it already."""
    from tests.cluster import _imported_once

    imports = tmp_path / "imports"
    monkeypatch.setenv("SLASHRT_TEST_IMPORTS", str(imports))
    notes, marks = tmp_path / "notes", tmp_path / "marks"
    notes.mkdir()
    marks.mkdir()
    kills = "pre_commit:1"
    monkeypatch.setenv(chaos.KILLS_ENV, kills)
    monkeypatch.setenv(chaos.MARKS_ENV, str(marks))
    f = Dataflow("zygote")
    noted = functools.partial(_note_parent, str(notes), until_fired(marks, kills))
    f.source("r", SCHEMA, time="ts").filter(_imported_once.keep).filter(noted, name="noted").window(
        Tumbling(ms=100)).count(key="key").sink(ChaosCsv(tmp_path / "out", transactional=True), name="out")
    result = slashrt.run(f, {"r": PerExecutor(_make, deterministic=True)}, executors=2, checkpoint=0.02,
                         checkpoint_dir=tmp_path / "chk", restart="fixed-delay:attempts=2,delay=0", slots=8,
                         slot_size=1024, partitions=16)
    assert len(result.recoveries) == 1
    parents = _parents(notes)
    assert len(parents) >= 3
    zygote = int(next(iter(parents.values())).split("\n")[0])
    assert imports.read_text().split() == [str(zygote)]


def _numpy_ma_imported(batch):
    if "numpy.ma" not in sys.modules:
        raise RuntimeError("this agent had not imported numpy.ma before its first batch")
    return np.ones(len(batch), bool)


def test_agents_are_forked_with_what_numpy_imports_at_its_first_unique(tmp_path):
    """numpy imports numpy.ma at the first `np.unique` (a graph flow's SSB window joins with it):
    about 10 ms of CPU in every agent's run, unless the zygote imported it before forking."""
    f = Dataflow("ma")
    left = f.source("a", SCHEMA, time="ts").filter(_numpy_ma_imported, name="checked")
    left.union(f.source("b", SCHEMA, time="ts")).window(Tumbling(ms=100)).count(key="key").sink(
        ChaosCsv(tmp_path / "out", transactional=False), name="out")
    inputs = {"a": PerExecutor(_make, deterministic=True), "b": PerExecutor(_make, deterministic=True)}
    result = slashrt.run(f, inputs, executors=2, mode="slash")
    # (it ran: the filter raised nothing, and the window's partials were joined on the SSB)
    assert sum(e.shipped_rows for epochs in result.epochs["ma.count_window_2"] for e in epochs) > 0


# --- a session: one zygote for many runs -------------------------------------------------------


def _zygote_children(pid: int) -> set[int]:
    return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def test_runs_of_a_session_fork_their_agents_from_its_zygote_and_leave_none_behind(tmp_path):
    before = children()
    with Session() as session:
        for run in range(3):
            notes = tmp_path / f"notes{run}"
            notes.mkdir()
            result = slashrt.run(_flow(tmp_path / f"out{run}", notes), {"r": PerExecutor(_make, deterministic=True)},
                                 executors=2, session=session, checkpoint_dir=tmp_path / f"chk{run}", slots=8,
                                 slot_size=1024, partitions=16)
            parents = _parents(notes)
            assert {p.split("\n")[0] for p in parents.values()} == {str(session.pid)}, parents  # the session's zygote
            assert all(_gone(pid) for pid in parents) and _zygote_children(session.pid) == set()
            rows = published(tmp_path / f"out{run}")
            assert sum(rows.values()) == 40 * 20 and max(rows.values()) == 1
            assert result.startup_s > 0
    assert _gone(session.pid) and children() - before == set()


def test_a_failed_run_of_a_session_leaves_no_agent_and_the_next_run_works(tmp_path):
    with Session() as session:
        with pytest.raises(ClusterError, match="record 5 is poisoned"):
            slashrt.run(_poisoned(), {"r": PerExecutor(_make)}, executors=2, session=session, slots=8, slot_size=1024)
        assert _zygote_children(session.pid) == set()
        notes = tmp_path / "notes"
        notes.mkdir()
        slashrt.run(_flow(tmp_path / "out", notes), {"r": PerExecutor(_make, deterministic=True)}, executors=2,
                    session=session, checkpoint_dir=tmp_path / "chk", slots=8, slot_size=1024, partitions=16)
        assert sum(published(tmp_path / "out").values()) == 40 * 20


def _poison(batch):
    if (batch["ts"] == 5).any() and batch["value"][0] == 1:  # (executor 1's share only)
        raise ValueError("record 5 is poisoned")
    return np.ones(len(batch), bool)


def _poisoned() -> Dataflow:
    f = Dataflow("poisoned")
    f.source("r", SCHEMA, time="ts").filter(_poison).sink(Collect())
    return f


def test_a_session_is_refused_where_it_cannot_fork_the_executors(tmp_path):
    with Session() as session:
        with pytest.raises(slashrt.DataflowError, match="session= forks local executors: give executors=N"):
            slashrt.run(_poisoned(), {"r": PerExecutor(_make)}, executors=["127.0.0.1:1"], session=session)
        with pytest.raises(slashrt.DataflowError, match="session= is an option of multi-executor runs"):
            slashrt.run(_poisoned(), {"r": _make(0, 1)}, session=session)


_SESSION = """
import functools, sys
import slashrt
from slashrt.cluster import PerExecutor, Session
from tests.cluster import test_zygote as t
from tests.snapshot._paced import Paced

notes = sys.argv[1]
session = Session()
slashrt.run(t._flow(notes + "/out", notes, Paced(seconds=0.05)),
            {"r": PerExecutor(functools.partial(t._make, n=10**6), deterministic=True)}, executors=2, session=session,
            checkpoint_dir=notes + "/chk", slots=8, slot_size=1024)
"""


def test_a_coordinator_killed_by_sigkill_leaves_no_session_zygote_nor_agent(tmp_path):
    _killed_coordinator_leaves_nothing(_SESSION, tmp_path)


def test_the_startup_bench_runs_alone_and_in_a_session_and_checks_every_run(capsys):
    from slashrt.bench import startup

    assert startup.main(["--executors", "2", "--runs", "2", "--events", "5000", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["correct"] and len(result["alone_startup_s"]) == len(result["session_startup_s"]) == 2
    assert result["session_s"] == result["session_startup_s"][1] and all(s > 0 for s in result["alone_startup_s"])
    with pytest.raises(SystemExit):
        startup.main(["--runs", "1"])
    assert "--executors and --runs must be at least 2" in capsys.readouterr().err
