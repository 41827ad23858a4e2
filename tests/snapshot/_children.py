"""Running a test job in a child process (it may SIGKILL itself), and reading its published output."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_child(script: Path, *args: str) -> subprocess.CompletedProcess:
    """Run `script` with `args` in a new process (this tree first on its path), at most 120 s."""
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
