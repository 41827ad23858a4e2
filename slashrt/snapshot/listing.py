"""What a checkpoint directory holds, for `slashrt checkpoints`: per job, every checkpoint that
is complete (verified as a resume would: `SnapshotStore.load`) with its number, kind, time,
bytes, executors, how far each source had fed and the records it holds in flight (an unaligned
checkpoint), and every one that is not, with why.
Looking changes nothing (a read-only store: no retention, no directory made)."""

from __future__ import annotations

import fsspec

from slashrt.errors import OptionError, SnapshotCorrupt, SnapshotError, SnapshotVersionError
from slashrt.snapshot.channel_state import CHANNEL_KIND
from slashrt.snapshot.storage import MANIFEST, SnapshotStore, _CHECKPOINT_DIR

__all__ = ["describe", "render"]


def describe(location, job: str | None = None) -> dict:
    """{"location", "jobs": [{"job", "directory", "checkpoints": [...]}]} for every job under
    `location` (a checkpoint_dir, or one job's directory in it), or only `job`."""
    fs, root = fsspec.core.url_to_fs(str(location))
    root = root.rstrip("/")
    if not fs.isdir(root):
        raise OptionError(f"{location} is not a directory")
    names = _jobs(fs, root)
    if not names and _is_job(fs, root):  # the directory of one job itself
        root, _, own = root.rpartition("/")
        names = [own]
        location = root or "/"
    if job is not None:
        if job not in names:
            raise OptionError(f"no checkpoints of job {job!r} in {location} (jobs there: {', '.join(names) or 'none'})")
        names = [job]
    return {"location": str(location), "jobs": [_job(location, name) for name in names]}


def _jobs(fs, root: str) -> list[str]:
    return sorted(path.rstrip("/").rpartition("/")[2] for path in fs.ls(root, detail=False)
                  if fs.isdir(path) and _is_job(fs, path))


def _is_job(fs, path: str) -> bool:
    return any(_CHECKPOINT_DIR.search(p.rstrip("/")) for p in fs.ls(path, detail=False))


def _job(location, name: str) -> dict:
    store = SnapshotStore(location, job=name, readonly=True)
    return {"job": name, "directory": store.directory, "checkpoints": [_checkpoint(store, n) for n in store._numbers()]}


def _checkpoint(store: SnapshotStore, n: int) -> dict:
    if not store.fs.exists(f"{store.checkpoint_dir(n)}/{MANIFEST}"):
        return {"checkpoint": n, "status": "incomplete",
                "reason": "no manifest: being written, or the run ended before it completed"}
    try:
        checkpoint = store.load(n)
    except SnapshotVersionError as exc:
        return {"checkpoint": n, "status": "incompatible", "reason": str(exc)}
    except SnapshotCorrupt as exc:
        return {"checkpoint": n, "status": "corrupt", "reason": str(exc)}
    except SnapshotError as exc:
        return {"checkpoint": n, "status": "unreadable", "reason": str(exc)}
    meta = checkpoint.meta
    return {
        "checkpoint": n,
        "status": "complete",
        "kind": meta.get("kind", "checkpoint"),  # "savepoint" (stop), "final" (inputs ended)
        "created": checkpoint.created,
        "bytes": sum(p.size for p in checkpoint.parts),
        "parts": len(checkpoint.parts),
        "executors": meta.get("executors"),
        "sources": {step: _fed(positions) for step, positions in meta.get("sources", {}).items()},
        # an unaligned checkpoint's records in flight (`slashrt.snapshot.channel_state`), replayed on a resume
        "in_flight": sum(len(state.arrays["records"]) for state in checkpoint.states.values()
                         if isinstance(state.meta, dict) and state.meta.get("kind") == CHANNEL_KIND),
    }


def _fed(positions: dict) -> int | None:
    """Records a source had fed at the checkpoint, over its executors (None: not recorded)."""
    per_executor = {"0": positions} if "kind" in positions else positions  # before positions were per executor
    fed = [position.get("fed") for position in per_executor.values()]
    return sum(fed) if fed and all(isinstance(f, int) for f in fed) else None


def render(listing: dict) -> str:
    """The listing for people: a heading per job, a line per checkpoint."""
    lines = []
    for job in listing["jobs"]:
        complete = sum(c["status"] == "complete" for c in job["checkpoints"])
        lines.append(f"job {job['job']} ({job['directory']}): {complete} complete, "
                     f"{len(job['checkpoints']) - complete} not")
        for c in job["checkpoints"]:
            if c["status"] != "complete":
                lines.append(f"  chk-{c['checkpoint']:<6} {c['status']}: {c['reason']}")
                continue
            sources = ", ".join(f"{step} {fed:,}" if isinstance(fed, int) else f"{step} ?"
                                for step, fed in c["sources"].items())
            lines.append(f"  chk-{c['checkpoint']:<6} complete  {c['kind']:<10} {c['created']}  {c['bytes']:>12,} bytes  "
                         f"{c['executors']} executor(s)  records fed: {sources or 'no sources'}"
                         + (f" ({c['in_flight']:,} in flight)" if c.get("in_flight") else ""))
    return "\n".join(lines) if lines else f"no checkpoints in {listing['location']}"
