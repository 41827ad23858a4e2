"""`slashrt run`: a user's job from the command line, stopped with a savepoint on a signal.

The job is `MODULE_OR_FILE[:NAME]` (NAME defaults to `job`): a module on the path (`pkg.jobs`)
or a Python file (`jobs/orders.py`, its directory put first on the path as `python FILE` does),
and in it NAME: a function of no arguments returning `(flow, inputs)` (a `slashrt.Dataflow`
and the dict of its inputs that `slashrt.run` takes), or such a tuple itself.

Signals (with a checkpoint directory): the first SIGINT or SIGTERM stops the run with a final
savepoint (`slashrt.StopHandle`), on one executor or a cluster (whose coordinator is this
process); a second one aborts at once. Without one, the first aborts.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import signal
import sys
import traceback
from pathlib import Path

import trio

from slashrt.errors import OptionError, unwrap_groups

__all__ = ["load_job", "run_job", "summary", "Interrupted"]

USAGE = "give the job as MODULE_OR_FILE[:NAME], e.g. jobs/orders.py:job or mypkg.jobs:orders"


class Interrupted(Exception):
    """A signal aborted the run (a second one, or one without a checkpoint directory)."""


def _where(exc: BaseException) -> str:
    """' (file, line n)' of the innermost frame of a user's code that raised `exc`."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""


def _module(spec: str):
    """The module `spec` names: a file (ends in .py, or a path that exists) or an importable name."""
    path = Path(spec)
    if spec.endswith(".py") or os.sep in spec or path.is_file():
        if not path.is_file():
            raise OptionError(f"job file {spec} does not exist")
        # its neighbours import, as with `python FILE`, here and in executor processes spawned
        folder = str(path.resolve().parent)
        sys.path.insert(0, folder)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")]))
        loader = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(loader)
        sys.modules[path.stem] = module

        def run():
            loader.loader.exec_module(module)
            import cloudpickle

            cloudpickle.register_pickle_by_value(module)  # its functions go to executors by value
    else:
        module = None
        run = lambda: importlib.import_module(spec)  # noqa: E731
    try:
        return run() or module
    except ModuleNotFoundError as exc:
        if module is None and exc.name and spec.startswith(exc.name):
            raise OptionError(f"no module named {spec!r} (and no file {spec}): {USAGE}") from None
        raise OptionError(f"importing job {spec} failed: {type(exc).__name__}: {exc}{_where(exc)}") from None
    except Exception as exc:  # the user's module is broken: one line, where
        raise OptionError(f"importing job {spec} failed: {type(exc).__name__}: {exc}{_where(exc)}") from None


def load_job(target: str):
    """`(flow, inputs)` from `MODULE_OR_FILE[:NAME]`; OptionError in one sentence otherwise."""
    from slashrt._dataflow import Dataflow

    spec, colon, name = target.rpartition(":")
    if not colon or not spec or os.sep in name:  # no NAME (a Windows-free world: ':' separates it)
        spec, name = target, "job"
    if not name.isidentifier():
        raise OptionError(f"{target!r}: {name!r} is not a Python name; {USAGE}")
    module = _module(spec)
    if not hasattr(module, name):
        names = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise OptionError(f"{spec} has no {name!r} (its functions and classes: {', '.join(names) or 'none'}); {USAGE}")
    job = getattr(module, name)
    if callable(job):
        try:
            inspect.signature(job).bind()
        except TypeError as exc:
            raise OptionError(f"{spec}:{name} cannot be called without arguments ({exc}): a job function takes none") from None
        except ValueError:  # no signature to look at (a builtin): calling it says
            pass
        try:
            job = job()
        except Exception as exc:
            raise OptionError(f"{spec}:{name}() raised {type(exc).__name__}: {exc}{_where(exc)}") from None
    if not (isinstance(job, tuple) and len(job) == 2 and isinstance(job[0], Dataflow) and isinstance(job[1], dict)):
        got = f"a tuple of {len(job)}" if isinstance(job, tuple) else type(job).__name__
        raise OptionError(
            f"{spec}:{name} gave {got}; a job is (flow, inputs): a slashrt.Dataflow and a dict of its inputs "
            "(or a function of no arguments returning them)"
        )
    return job


async def _supervised(job, stop) -> object:
    """Run `job()` with SIGINT and SIGTERM handled: the first asks `stop` (if any) for a
    savepoint, the next (or the first without `stop`) aborts the run."""
    aborted = False
    result = None
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with unwrap_groups(), trio.open_nursery() as nursery:

            async def watch():
                nonlocal aborted
                async for signum in signals:
                    if stop is not None and not stop.requested:
                        print(f"slashrt: {signal.Signals(signum).name}: stopping with a savepoint "
                              "(again to abort)", file=sys.stderr, flush=True)
                        stop.request()
                        continue
                    aborted = True
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(watch)
            result = await job()
            nursery.cancel_scope.cancel()
    if aborted:
        raise Interrupted()
    return result


def run_job(flow, inputs, *, executors, transport, mode, options: dict):
    """Run the job as `slashrt.run` would (its checks first), under `_supervised`."""
    from slashrt._run import prepare_run
    from slashrt.snapshot.stop import StopHandle

    stop = StopHandle() if options.get("checkpoint_dir") is not None else None
    if stop is not None:
        options = {**options, "stop": stop}
    job = prepare_run(flow, inputs, executors=executors, transport=transport, mode=mode, **options)
    result = trio.run(_supervised, job, stop)
    _ignore_late_signals()
    return result


_LATE = (signal.SIGINT, signal.SIGTERM)
_before: dict = {}  # the handlers `_ignore_late_signals` replaced


def _ignore_late_signals() -> None:
    """The job is over (its executors stopped, its output committed): what is left is printing its
    figures, which a SIGINT or SIGTERM arriving now must not turn into a failed exit. Until
    `restore_signals` (`slashrt run` calls it once printed: main() may run inside a program, e.g.
    a test, whose later children must not inherit ignored signals)."""
    for signum in _LATE:
        _before.setdefault(signum, signal.signal(signum, signal.SIG_IGN))


def restore_signals() -> None:
    """Give SIGINT and SIGTERM back the handlers they had before the job ended."""
    while _before:
        signum, handler = _before.popitem()
        signal.signal(signum, handler)


def summary(flow, result, executors: int) -> dict:
    """What `slashrt run` prints: the run's figures, its sinks' row counts, its checkpoints."""
    completed = [c for c in result.checkpoints if c["status"] == "completed"]
    out = {
        "job": flow.name,
        "executors": executors,
        "records": result.records,
        "seconds": result.seconds,
        "records_per_s": result.records / result.seconds if result.seconds > 0 else 0.0,
        "late_records": sum(result.late_records.values()),
        "outputs": {step: len(rows) for step, rows in result.outputs.items()},
        "checkpoints": len(completed),
        "unaligned_checkpoints": sum(1 for c in completed if c["unaligned"]),
        "latest_checkpoint": completed[-1]["checkpoint"] if completed else None,
        "resumed_from": result.resumed_from,
        "stopped": result.savepoint is not None,
        "savepoint": result.savepoint,
        "recoveries": len(result.recoveries),
        "restarted": [r.get("restarted") for r in result.recoveries],
        "startup_s": result.startup_s,  # several executors: from the call until every one processed
    }
    if result.latency:  # sinks fed from Paced sources: their rows' latency
        out["latency"] = {step: histogram.summary() for step, histogram in result.latency.items()}
    return out
