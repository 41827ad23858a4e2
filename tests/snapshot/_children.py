"""Helpers of the kill tests: run a child script in a new process, SIGKILL one at a chosen
call and slow it down until then (the child scripts import `kill_at`, `pace_at`; the tests
`run_child`), and read a job's published output."""

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_child(script: Path, *args: str) -> subprocess.CompletedProcess:
    """Run `script` with `args` in a new process with this tree on its path; killed if it
    outlives the timeout or the test fails."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(script), *map(str, args)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def kill_at(target, name: str, k: int, marker=None):
    """`target.name`, SIGKILLing this process after its k-th call returns (for an async
    function: before the k-th coroutine runs), creating the file `marker` first if given."""
    original, calls = getattr(target, name), [0]

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        calls[0] += 1
        if calls[0] == k:
            if marker is not None:
                Path(marker).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(target, name, wrapped)


def pace_at(target, name: str, pace) -> None:
    """`target.name`, each call first taking the time `pace` (`tests.snapshot._paced.Paced`)
    says, each call one record seen: the pace of a step that is no filter (e.g. a loop's
    delivery of a fed-back batch)."""
    original = getattr(target, name)

    def wrapped(*args, **kwargs):
        pace.seen += 1
        pace.hold()
        return original(*args, **kwargs)

    setattr(target, name, wrapped)


def published(directory: Path, outputs) -> dict[str, list[str]]:
    """Every sink's committed rows (what a reader of its directory sees: part files without
    `.inprogress`, their header dropped), sorted, by sink directory name."""
    rows = {}
    for name in outputs:
        lines = []
        for part in (directory / name).glob("part-*.csv"):
            lines.extend(part.read_text().splitlines()[1:])
        rows[name] = sorted(lines)
    return rows
