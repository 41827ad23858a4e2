"""The faults of `slashrt bench chaos --faults NAME,...`: each a `trial(args) -> dict` in its own
module (`slashrt.bench.fault_<name>`), imported only when its fault is asked for."""

from __future__ import annotations

import importlib
from collections.abc import Callable

__all__ = ["FAULTS"]


def _lazy(module: str) -> Callable:
    def trial(args) -> dict:
        return importlib.import_module(f"slashrt.bench.{module}").trial(args)

    return trial


FAULTS: dict[str, Callable] = {
    "disk-full": _lazy("fault_disk"),
}
