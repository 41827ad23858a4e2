"""The chaos job of `_checkpoint_child.py` as a `slashrt run` job (`slashrt run _cli_job.py:job`),
writing under $SLASHRT_TEST_OUT. $SLASHRT_TEST_AT ("<point>:<k>", several comma-separated): at
the k-th pass of <point> ("pre_commit": a sink pre-committed; "write_part": a part written,
during the asynchronous write; "complete": a manifest written, before the sinks commit) the
process prints "at <point>:<k>" and waits for a line on its standard input: the test then signals or
SIGKILLs it at that very point. Until every such point was reached each batch of source "a" takes
4 ms more, so that however fast the machine the job cannot end before them (a run at full speed
completes only 5-9 checkpoints)."""

import os
import sys
import tempfile
from pathlib import Path

from _checkpoint_child import SIZES, flow, job_sinks, records


def pause_at(target, name: str, k: int, marker: str) -> None:
    """Pause at the k-th call of `target.name` (after it returns), creating the file `marker` first."""
    original, calls = getattr(target, name), [0]

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        calls[0] += 1
        if calls[0] == k:
            Path(marker).touch()
            print(f"at {name}:{k}", flush=True)
            sys.stdin.readline()
        return result

    setattr(target, name, wrapped)


def job():
    from slashrt.snapshot.commit import PartFiles
    from slashrt.snapshot.storage import SnapshotStore

    from tests.snapshot._paced import Paced

    directory = os.environ["SLASHRT_TEST_OUT"]
    ats = [at for at in os.environ.get("SLASHRT_TEST_AT", "").split(",") if at]
    marks = tempfile.mkdtemp(prefix="marks-", dir=directory) if ats else None
    for at in ats:
        point, _, k = at.partition(":")
        pause_at({"pre_commit": PartFiles, "write_part": SnapshotStore, "complete": SnapshotStore}[point], point, int(k),
                 f"{marks}/{at}")
    pace = Paced(seconds=0.004, until=(marks, len(ats))) if ats else None
    return flow(job_sinks(directory, "arrays"), pace), {name: records(name) for name in SIZES}


class SignalAt:
    """A pass-through filter: the first executor of a cluster to have seen `k` records sends
    `signals` to the coordinator (the parent of the zygote that forked it), once for the whole job (`marker`, a file
    made exclusively); from then on every batch of every executor takes 4 ms more, so the stop
    reaches the sources in the middle of the stream however loaded the machine is."""

    def __init__(self, k: int | None, signals: list, marker: str):
        self.k, self.signals, self.marker, self.seen = k, signals, marker, 0

    def __call__(self, batch):
        import signal
        import time

        import numpy as np

        self.seen += len(batch)
        if self.k is not None and self.seen >= self.k:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                coordinator = _coordinator()
                for name in self.signals:
                    os.kill(coordinator, getattr(signal, name))
            time.sleep(0.004)
        return np.ones(len(batch), bool)


def _coordinator() -> int:
    """The coordinator's pid, seen from an agent: its parent, or its zygote's parent."""
    parent = os.getppid()
    with open(f"/proc/{parent}/cmdline", "rb") as f:
        if b"slashrt.cluster._zygote" not in f.read():
            return parent
    from tests.cluster._processes import parent as parent_of

    return parent_of(parent)


def cluster():
    """`_cluster_child`'s job (a window sum per key with late records, transactional CSV sinks
    `out` and `late` under $SLASHRT_TEST_OUT) for `slashrt run --executors N`, through a
    `SignalAt` filter: $SLASHRT_TEST_SIGNAL "<k>:<SIGNAL>[+<SIGNAL>...]" (none: it only passes)."""
    from _cluster_child import SCHEMA, records

    from slashrt import Dataflow, Tumbling
    from slashrt.ops.sinks import CsvFile

    directory = os.environ["SLASHRT_TEST_OUT"]
    k, _, names = os.environ.get("SLASHRT_TEST_SIGNAL", "").partition(":")
    flow = Dataflow("cluster-stop")
    source = flow.source("r", SCHEMA, time="t", max_delay=20)
    source = source.filter(SignalAt(int(k) if k else None, names.split("+"), f"{directory}/signalled"), name="signal")
    late, out = (CsvFile(f"{directory}/{name}", transactional=True) for name in ("late", "out"))
    source.window(Tumbling(ms=100), late=late).sum("v", key="k", output="total").sink(out)
    return flow, {"r": records()}


def graph():
    """The acyclic graph flow of `_graph_flow` (union, an exchange by key into a user operator with
    notifications, a keyed window behind a second exchange, connect().apply; transactional CSV
    sinks under $SLASHRT_TEST_OUT) for `slashrt run --executors N`, source a through a
    `SignalAt` filter ($SLASHRT_TEST_SIGNAL as for `cluster`)."""
    from tests.snapshot import _graph_flow

    directory = os.environ["SLASHRT_TEST_OUT"]
    k, _, names = os.environ.get("SLASHRT_TEST_SIGNAL", "").partition(":")
    pace = SignalAt(int(k) if k else None, names.split("+"), f"{directory}/signalled")
    return _graph_flow.flow(directory, pace=pace), _graph_flow.inputs()
