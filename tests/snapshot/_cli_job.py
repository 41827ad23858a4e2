"""The chaos job of `_checkpoint_child.py` as a `slashrt run` job (`slashrt run _cli_job.py:job`),
writing under $SLASHRT_TEST_OUT. $SLASHRT_TEST_AT ("<point>:<k>", several comma-separated): at
the k-th pass of <point> ("pre_commit": a sink pre-committed; "write_part": a part written,
during the asynchronous write; "complete": a manifest written, before the sinks commit) the
process prints "at <point>:<k>" and waits for a line on its standard input: the test then signals or
SIGKILLs it at that very point."""

import os
import sys

from _checkpoint_child import SIZES, flow, job_sinks, records


def pause_at(target, name: str, k: int) -> None:
    original, calls = getattr(target, name), [0]

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        calls[0] += 1
        if calls[0] == k:
            print(f"at {name}:{k}", flush=True)
            sys.stdin.readline()
        return result

    setattr(target, name, wrapped)


def job():
    from slashrt.snapshot.commit import PartFiles
    from slashrt.snapshot.storage import SnapshotStore

    for at in filter(None, os.environ.get("SLASHRT_TEST_AT", "").split(",")):
        point, _, k = at.partition(":")
        pause_at({"pre_commit": PartFiles, "write_part": SnapshotStore, "complete": SnapshotStore}[point], point, int(k))
    return flow(job_sinks(os.environ["SLASHRT_TEST_OUT"], "arrays")), {name: records(name) for name in SIZES}
