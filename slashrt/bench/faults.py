"""The faults `slashrt bench chaos --faults a,b,...` knows: name -> its trial, imported when run.

A trial is `trial(args) -> dict` (`args`: the CLI's namespace, or any object with the options it
reads) returning at least {"fault", "refused", "exact", "duplicates", "missing", "cause",
"seconds"}: the job was refused with the sentence `cause`, or ran to an exact output; either way
`duplicates` and `missing` must be 0. To add a fault, add its module and one line here (`_lazy(module)`: its `trial`).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable

__all__ = ["FAULTS", "run_faults"]


def _lazy(module: str, function: str = "trial") -> Callable[[object], dict]:
    """`slashrt.bench.<module>.<function>`, imported when the trial runs (not when --help does)."""

    def trial(args) -> dict:
        return getattr(importlib.import_module(f"slashrt.bench.{module}"), function)(args)

    return trial


FAULTS: dict[str, Callable[[object], dict]] = {
    "broker-outage": _lazy("fault_broker", "outage"),
    "broker-hang": _lazy("fault_broker", "hang"),
    "corrupt-newest": _lazy("fault_store", "corrupt_newest"),
    "disk-full": _lazy("fault_disk"),
    "lose-newest": _lazy("fault_store", "lose_newest"),
    "partition": _lazy("fault_partition"),
}


def unknown(names: list[str]) -> str | None:
    """One sentence naming the faults of `names` that are not known, and the known ones (None: all known)."""
    bad = [n for n in names if n not in FAULTS]
    if not bad:
        return None
    return f"unknown fault(s) {', '.join(bad)}: --faults takes a comma-separated list of {', '.join(FAULTS)}"


def run_faults(names: list[str], args) -> dict:
    """Each named fault's trial in turn: {"faults": [result, ...], "correct"} (correct: every one
    refused or exact, with no duplicates nor missing rows)."""
    results = []
    for name in names:
        started = time.perf_counter()
        result = FAULTS[name](args)
        result.setdefault("seconds", round(time.perf_counter() - started, 3))
        results.append(result)
    correct = all((r["refused"] or r["exact"]) and not r["duplicates"] and not r["missing"] and not r.get("rewritten")
                  for r in results)
    return {"faults": results, "correct": correct}
