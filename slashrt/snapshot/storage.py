"""Where checkpoints live: a directory per job, a file per part, a manifest that makes one complete.

Layout under `location` (a local directory, or any fsspec URL such as `memory://` or `s3://`)::

    <job>/chk-<n>/<step id>.<executor>.state    one part: an operator instance's state (state_format)
    <job>/chk-<n>/_manifest.json                 written last; lists every part with size and checksum
    <job>/_highest                               the highest checkpoint number completed so far

The manifest rule: checkpoint n is complete exactly when `chk-<n>/_manifest.json` exists and
verifies (its own checksum, a known version, every part present with the size and checksum it
lists). The manifest is written under a temporary name and renamed: atomic on a local (POSIX)
filesystem, where parts and manifest are also fsynced first. Object stores have no rename; there
fsspec's move copies a finished object, and an object store shows an object whole or not at all,
so a reader still never sees half a manifest (only the leftover temporary, removed on open).

Retention (after each `complete` and on open): the last `keep` complete checkpoints stay; an
incomplete checkpoint older than the newest complete one is removed, unless this store is writing
it (a part or its manifest) now; removing one that another process still writes into is left
to a later pass. `latest()` falls back past a checkpoint whose part is missing, truncated or corrupt, logs
what it skipped and why, and keeps it in `skipped`.

Checkpoint numbers are never used twice: `next_checkpoint()` is past every directory and past
`_highest` (rewritten after each manifest), so a lost newest directory does not give its number
to the next run (whose sinks would publish under a published checkpoint's name).

Writes block on I/O; from trio, `await store.awrite_part(...)` runs them in a worker thread so the
event loop keeps running. On a local disk a part or a manifest is written with a few system calls
(`_write_file`: open, one writev of the state's buffers, fsync, close), not through fsspec's Python
layers: each call releases the GIL, and the writer thread waits for it again only between them,
while the executor holds it (docs/architecture.md, "Checkpoint storage").
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import functools
import json
import os
import re
import shutil
import threading
import uuid
import zlib
from urllib.parse import quote

import attrs
import fsspec
import structlog
import trio
from fsspec.implementations.local import LocalFileSystem

from slashrt._version import __version__
from slashrt.errors import OptionError, SnapshotCorrupt, SnapshotError, SnapshotVersionError, SnapshotWriteError
from slashrt.snapshot._durable import fsync_path
from slashrt.snapshot.state_format import FORMAT_VERSION, State, decode_state, state_chunks, write_state

__all__ = ["Checkpoint", "Part", "Skipped", "SnapshotStore", "MANIFEST_VERSION"]

log = structlog.get_logger("slashrt.snapshot")

MANIFEST = "_manifest.json"
HIGHEST = "_highest"
MANIFEST_VERSION = 1
_CHECKPOINT_DIR = re.compile(r"chk-(\d+)$")
_IOV_MAX = 1024  # buffers one writev takes (POSIX's minimum of IOV_MAX)


@attrs.frozen
class Part:
    """One part file of a checkpoint: the state of `step` on executor `executor`."""

    step: str
    executor: int
    file: str  # name inside chk-<n>/
    size: int
    crc32: int  # the checksum in the file's trailer (of everything before it)


@attrs.frozen
class Skipped:
    """A complete-looking checkpoint that `latest()` passed over, and why."""

    checkpoint: int
    reason: str


@attrs.frozen
class Checkpoint:
    """A verified checkpoint: its number, the caller's metadata, its parts and their decoded states."""

    number: int
    meta: dict
    parts: tuple[Part, ...]
    states: dict  # (step, executor) -> State, for the parts that were loaded
    created: str
    slashrt_version: str

    def state(self, step: str, executor: int) -> State:
        return self.states[(step, executor)]


class SnapshotStore:
    """The checkpoints of one job under `location` (a directory or an fsspec URL); see the module doc.
    `readonly`: only to look (`slashrt checkpoints`): makes no directory, removes nothing."""

    def __init__(self, location, *, job: str = "job", keep: int = 3, readonly: bool = False):
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise OptionError(f"SnapshotStore keep={keep!r}: keep at least 1 complete checkpoint (an int >= 1)")
        if not job or "/" in job or job in (".", ".."):
            raise OptionError(f"SnapshotStore job={job!r}: a job name is one non-empty path component")
        self.fs, root = fsspec.core.url_to_fs(str(location))
        self.location = str(location)
        self.job = job
        self.keep = keep
        self.directory = f"{root.rstrip('/')}/{job}"
        self.skipped: list[Skipped] = []  # what the last latest() passed over
        self._local = isinstance(self.fs, LocalFileSystem)
        self._written: dict[int, dict[tuple[str, int], Part]] = {}
        self._writing: dict[int, int] = {}  # checkpoint -> parts being written by this store now
        self._lock = threading.Lock()  # parts are written from worker threads
        self._highest_lock = threading.Lock()
        if not readonly:
            self.fs.makedirs(self.directory, exist_ok=True)
            self._retain()

    def __repr__(self) -> str:
        return f"SnapshotStore({self.location!r}, job={self.job!r}, keep={self.keep})"

    # -- paths

    def checkpoint_dir(self, n: int) -> str:
        return f"{self.directory}/chk-{n}"

    @staticmethod
    def part_name(step: str, executor: int) -> str:
        return f"{quote(step, safe='')}.{executor}.state"  # a step id may hold any character

    def _size(self, path: str) -> int | None:
        """A file's size (None: there is none)."""
        try:
            return os.stat(path).st_size if self._local else self.fs.size(path)
        except FileNotFoundError:
            return None

    def _numbers(self) -> list[int]:
        """Every checkpoint directory's number, complete or not, ascending."""
        found = []
        for path in os.listdir(self.directory) if self._local else self.fs.ls(self.directory, detail=False):
            if match := _CHECKPOINT_DIR.search(path.rstrip("/")):
                found.append(int(match.group(1)))
        return sorted(found)

    def checkpoints(self) -> list[int]:
        """The numbers of the checkpoints whose manifest exists, ascending (`load` verifies them)."""
        exists = os.path.exists if self._local else self.fs.exists
        return [n for n in self._numbers() if exists(f"{self.checkpoint_dir(n)}/{MANIFEST}")]

    def next_checkpoint(self) -> int:
        """A number no checkpoint has used yet: 1 more than the highest directory's, or than the
        highest ever completed here, whose directory may be gone."""
        return max([*self._numbers(), self.highest() or 0]) + 1

    def highest(self) -> int | None:
        """The highest checkpoint number completed in this store (None: none recorded)."""
        path = f"{self.directory}/{HIGHEST}"
        try:
            if self._local:
                with open(path, "rb") as f:
                    return int(f.read())
            return int(self.fs.cat_file(path))
        except (FileNotFoundError, ValueError):
            return None

    def _record_highest(self, n: int) -> None:
        with self._highest_lock:  # two manifests written by worker threads at once: the higher stays
            if n <= (self.highest() or 0):
                return
            temporary, final = f"{self.directory}/.{HIGHEST}.{uuid.uuid4().hex}.tmp", f"{self.directory}/{HIGHEST}"
            with _naming(n, final):  # (a full disk: declined as the manifest's write would be)
                if self._local:  # as a part: a few system calls, no fsspec (`_write_file`)
                    _write_file(temporary, [str(n).encode()])
                    os.replace(temporary, final)
                else:
                    self.fs.pipe_file(temporary, str(n).encode())
                    self.fs.mv(temporary, final)

    # -- writing

    def write_part(self, n: int, step: str, executor: int, arrays, meta=None) -> Part:
        """Write the state of `step` on `executor` as part of checkpoint n; returns its `Part`
        (give it to `complete` when another process completes the checkpoint)."""
        with self._busy(n):
            directory = self.checkpoint_dir(n)
            name = self.part_name(step, executor)
            path = f"{directory}/{name}"
            with _naming(n, path):
                if self._local:  # a handful of system calls, the GIL released in each (`_write_file`)
                    os.makedirs(directory, exist_ok=True)
                    chunks, size, crc = state_chunks(arrays, meta, name=path)
                    _write_file(path, chunks)
                else:
                    self.fs.makedirs(directory, exist_ok=True)
                    with self.fs.open(path, "wb") as out:
                        size, crc = write_state(out, arrays, meta, name=path)
                        _sync(out)
            part = Part(step, executor, name, size, crc)
            with self._lock:
                self._written.setdefault(n, {})[(step, executor)] = part
            return part

    @contextlib.contextmanager
    def _busy(self, n: int):
        """Checkpoint n is being written (a part, or its manifest) by this store: retention,
        here or in another thread (another checkpoint completing meanwhile), leaves it."""
        with self._lock:
            self._writing[n] = self._writing.get(n, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._writing[n] -= 1
                if not self._writing[n]:
                    del self._writing[n]

    async def awrite_part(self, n: int, step: str, executor: int, arrays, meta=None) -> Part:
        """`write_part` in a worker thread: the event loop runs on while the bytes go out."""
        return await trio.to_thread.run_sync(functools.partial(self.write_part, n, step, executor, arrays, meta))

    def complete(self, n: int, meta: dict | None = None, parts=()) -> str:
        """Make checkpoint n complete: write its manifest, listing the parts this store wrote and
        `parts` (from other processes), with the caller's `meta` (source positions, executor
        count, ...); then apply retention. Returns the manifest's path."""
        with self._busy(n):
            final = self._write_manifest(n, meta, parts)
        self._retain()
        return final

    def _write_manifest(self, n: int, meta: dict | None, parts) -> str:
        with self._lock:
            listed = dict(self._written.get(n, {}))
        for part in parts:
            listed[(part.step, part.executor)] = part
        directory = self.checkpoint_dir(n)
        for part in listed.values():
            path = f"{directory}/{part.file}"
            if self._size(path) != part.size:
                raise SnapshotError(f"checkpoint {n} cannot complete: part {path} is missing or not {part.size} bytes")
        body = {
            "manifest": MANIFEST_VERSION,
            "state_format": FORMAT_VERSION,
            "slashrt": __version__,
            "job": self.job,
            "checkpoint": n,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "parts": [attrs.asdict(p) for p in sorted(listed.values(), key=lambda p: (p.step, p.executor))],
            "meta": meta or {},
        }
        try:
            text = _canonical(body)
        except (TypeError, ValueError) as exc:
            raise SnapshotError(f"checkpoint {n}: its metadata is not JSON-able ({exc})") from None
        body["checksum"] = zlib.crc32(text)
        temporary = f"{directory}/.{MANIFEST}.{uuid.uuid4().hex}.tmp"
        final = f"{directory}/{MANIFEST}"
        with _naming(n, final):
            try:
                if self._local:
                    _write_file(temporary, [json.dumps(body, indent=1).encode()])
                else:
                    with self.fs.open(temporary, "wb") as out:
                        out.write(json.dumps(body, indent=1).encode())
                        _sync(out)
            except OSError:
                with contextlib.suppress(OSError):
                    self.fs.rm(temporary)
                raise
            os.replace(temporary, final) if self._local else self.fs.mv(temporary, final)
            if self._local:  # the rename, and chk-<n> itself in the job's directory
                fsync_path(directory)
                fsync_path(self.directory)
        with self._lock:
            self._written.pop(n, None)
        self._record_highest(n)
        log.debug("snapshot.complete", job=self.job, checkpoint=n, parts=len(listed))
        return final

    async def acomplete(self, n: int, meta: dict | None = None, parts=()) -> str:
        """`complete` in a worker thread; n counts as being written from now on, before the
        thread starts: a newer checkpoint completing meanwhile (in another thread) must not
        remove it, whose parts other processes wrote, so that this store's writes never marked it."""
        with self._busy(n):
            return await trio.to_thread.run_sync(functools.partial(self.complete, n, meta, parts))

    def discard(self, n: int) -> None:
        """Remove checkpoint n (e.g. one abandoned by a failed attempt)."""
        if self._local:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(self.checkpoint_dir(n))
        elif self.fs.exists(self.checkpoint_dir(n)):
            self.fs.rm(self.checkpoint_dir(n), recursive=True)
        self._written.pop(n, None)

    def _retain(self) -> None:
        complete = self.checkpoints()
        newest = complete[-1] if complete else None
        drop = set(complete[: -self.keep])
        if newest is not None:
            drop |= {n for n in self._numbers() if n < newest and n not in complete}
        with self._lock:
            drop -= set(self._writing)
        for n in sorted(drop):
            log.debug("snapshot.remove", job=self.job, checkpoint=n, complete=n in complete)
            try:
                self.discard(n)
            except OSError as exc:  # another process still writes a part of it (a subsumed checkpoint's):
                log.debug("snapshot.remove.later", job=self.job, checkpoint=n, reason=str(exc))  # a later pass

    # -- reading

    def manifest(self, n: int) -> dict:
        """Checkpoint n's manifest, checked: it exists, parses, is of a known version, and its
        checksum matches."""
        path = f"{self.checkpoint_dir(n)}/{MANIFEST}"
        try:
            raw = self.fs.cat_file(path)
        except FileNotFoundError:
            if not self.fs.exists(self.checkpoint_dir(n)):
                complete = ", ".join(map(str, self.checkpoints())) or "none"
                raise SnapshotError(
                    f"checkpoint {n} does not exist in {self.directory} (its complete checkpoints: {complete})"
                ) from None
            raise SnapshotCorrupt(f"checkpoint {n} has no manifest ({path}): it is incomplete") from None
        try:
            body = json.loads(raw)
            checksum = body.pop("checksum")
            version = body["manifest"]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise SnapshotCorrupt(f"manifest {path} is corrupt: it is not a slashrt manifest") from None
        if zlib.crc32(_canonical(body)) != checksum:
            raise SnapshotCorrupt(f"manifest {path} is corrupt: its checksum does not match its contents")
        if version != MANIFEST_VERSION or body.get("state_format") != FORMAT_VERSION:
            raise SnapshotVersionError(
                f"manifest {path} was written by slashrt {body.get('slashrt')} (manifest version {version}, "
                f"state format {body.get('state_format')}); this slashrt {__version__} reads manifest "
                f"version {MANIFEST_VERSION}, state format {FORMAT_VERSION}"
            )
        return body

    def load(self, n: int, *, executor: int | None = None) -> Checkpoint:
        """Checkpoint n, verified: its manifest, and every part's size, checksum and contents.
        With `executor`, only that executor's parts are read (the others only checked present)."""
        body = self.manifest(n)
        directory = self.checkpoint_dir(n)
        parts = _parts(body, f"{directory}/{MANIFEST}")
        states = {}
        for part in parts:
            path = f"{directory}/{part.file}"
            if executor is not None and part.executor != executor:
                if not self.fs.exists(path):
                    raise SnapshotCorrupt(f"checkpoint {n}: part {path} is missing")
                continue
            states[(part.step, part.executor)] = self._read_part(n, path, part)
        return Checkpoint(n, body["meta"], parts, states, body["created"], body["slashrt"])

    def _read_part(self, n: int, path: str, part: Part) -> State:
        buffer = bytearray(part.size)
        try:
            with self.fs.open(path, "rb") as f:
                got = f.readinto(buffer)
                extra = f.read(1)
        except FileNotFoundError:
            raise SnapshotCorrupt(f"checkpoint {n}: part {path} is missing") from None
        if got != part.size or extra:
            raise SnapshotCorrupt(
                f"checkpoint {n}: part {path} is {'truncated' if got < part.size else 'longer than listed'} "
                f"(the manifest lists {part.size} bytes)"
            )
        state = decode_state(buffer, name=path)  # checks every byte against the file's trailer
        if int.from_bytes(buffer[-4:], "little") != part.crc32:
            raise SnapshotCorrupt(f"checkpoint {n}: part {path} is not the file its manifest lists (checksum differs)")
        return state

    async def aload(self, n: int, *, executor: int | None = None) -> Checkpoint:
        return await trio.to_thread.run_sync(functools.partial(self.load, n, executor=executor))

    def latest(self, *, executor: int | None = None) -> Checkpoint | None:
        """The newest checkpoint that verifies (None if there is none). Each newer one that does
        not is logged and listed in `skipped`, with the reason."""
        self.skipped = []
        for n in reversed(self.checkpoints()):
            try:
                return self.load(n, executor=executor)
            except SnapshotError as exc:
                self.skipped.append(Skipped(n, str(exc)))
                log.warning("snapshot.skipped", job=self.job, checkpoint=n, reason=str(exc))
        return None

    async def alatest(self, *, executor: int | None = None) -> Checkpoint | None:
        return await trio.to_thread.run_sync(functools.partial(self.latest, executor=executor))


def _parts(body: dict, path: str) -> tuple[Part, ...]:
    """The manifest's parts, each a file inside its checkpoint's directory."""
    try:
        parts = tuple(Part(**p) for p in body["parts"])
        if all(isinstance(p.file, str) and "/" not in p.file and not p.file.startswith(".") for p in parts):
            return parts
    except (KeyError, TypeError):
        pass
    raise SnapshotCorrupt(f"manifest {path} is corrupt: its list of parts is malformed")


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _write_file(path: str, chunks) -> None:
    """A new local file at `path` holding `chunks`, fsynced: a few system calls (open, writev,
    fsync, close), each releasing the GIL. The writer thread takes the GIL back only between
    them: under an executor that holds it, each taking waits up to a switch interval or a long
    native call, so the fewer, the sooner the checkpoint is written (docs/architecture.md)."""
    views = [v for v in (memoryview(c).cast("B") for c in chunks) if len(v)]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        while views:
            written = os.writev(fd, views[:_IOV_MAX])
            while written:  # a short write: go on after its last byte
                if written >= len(views[0]):
                    written -= len(views.pop(0))
                else:
                    views[0], written = views[0][written:], 0
        _fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _naming(n: int, path: str):
    """An OSError writing checkpoint n (ENOSPC: a full disk) as one sentence naming `path`."""
    try:
        yield
    except OSError as exc:
        raise SnapshotWriteError(n, path, exc.strerror or str(exc)) from None


def _sync(f) -> None:
    """Flush a written file to stable storage where it is a local file (elsewhere the
    filesystem decides when closed data is durable). A failing fsync (EIO, ENOSPC) is raised:
    the file may not be on disk."""
    f.flush()
    try:
        fd = f.fileno()
    except (AttributeError, OSError, ValueError, NotImplementedError):  # io.UnsupportedOperation: in memory
        return
    _fsync(fd)


def _fsync(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # a file that cannot be synced (a pipe, ...)
            raise

