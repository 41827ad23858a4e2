"""The faults `slashrt bench chaos --faults a,b,...` knows: name -> its trial, imported when run.

A trial is `trial(args) -> dict` (`args`: the CLI's namespace, or any object with the options it
reads) returning at least {"fault", "refused", "exact", "duplicates", "missing", "cause",
"seconds"}: the job was refused with the sentence `cause`, or ran to an exact output; either way
`duplicates` and `missing` must be 0. To add a fault, add its module and one line here (`_lazy(module)`: its `trial`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

__all__ = ["FAULTS"]


def _lazy(module: str, function: str = "trial") -> Callable[[object], dict]:
    """`slashrt.bench.<module>.<function>`, imported when the trial runs (not when --help does)."""

    def trial(args) -> dict:
        return getattr(importlib.import_module(f"slashrt.bench.{module}"), function)(args)

    return trial


FAULTS: dict[str, Callable[[object], dict]] = {
    "broker-outage": _lazy("fault_broker", "outage"),
    "broker-hang": _lazy("fault_broker", "hang"),
    "disk-full": _lazy("fault_disk"),
    "partition": _lazy("fault_partition"),
}
