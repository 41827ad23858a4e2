"""A fork server for local agents: replacement executors in milliseconds, not an interpreter's start.

A spawned agent (`python -m slashrt.cluster.agent`) spends most of a second, seconds on a
loaded machine, starting Python and importing slashrt, numpy and trio before it listens: N of
them on a few cores take N times that to start a job, and in a recovery it is most of the time
to processing again. A run with local executors therefore starts one zygote (`open_zygote`), a
separate process (started with exec, so it holds no thread, socket or lock of the
coordinator's) that imports the agent's modules once and then forks an agent for each request,
a copy of an interpreter that has already imported them.

::

    coordinator                                  zygote (a single-threaded process: `_zygote.main`)
      socketpair; the zygote's stdin is one end     import slashrt.cluster.agent (and with it numpy, trio)
      "preload" (the flow and input makers,
        pickled)                            ───>    unpickle them: import the job's modules too
      "spawn" (argv, env, sys.path, cwd)
        + the write ends of two pipes       ───>    fork: the child puts the pipes on its stdout and
                                                    stderr, takes env, sys.path and cwd, runs the agent
                                            <───    ("forked", pid)
                                            <───    ("exited", pid, code), as it reaps each child
      closes the socket (the run ended)     ───>    SIGKILLs the children left, reaps them, exits

The coordinator holds a `ForkedAgent` per child: what it uses of a `trio.Process` (`wait`,
`returncode`, `kill`, `send_signal`, `stdout`, `stderr`), the exit status as the zygote
reaped it, so a forked agent's death is named as a spawned one's is ("killed by signal 9").
A forked agent's parent is the zygote: it exits when the zygote does (`--with-parent`), and
the zygote exits when the coordinator's end of the socket closes, a coordinator killed by
SIGKILL included.
"""

from __future__ import annotations

import array
import contextlib
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys

import structlog
import trio

from slashrt.errors import unwrap_groups

__all__ = ["ForkedAgent", "Session", "Zygote", "open_zygote"]

log = structlog.get_logger("slashrt.cluster")

# the agent, and what it imports only as a job's set-up needs it (the shm and tcp channels, a
# checkpointed one's store, the agents' checkpointing, chunked inputs), and numpy.ma, which
# numpy imports at the first `np.unique` (an SSB window's join): 10 ms of every agent's run otherwise
_PRELOAD = ("slashrt.cluster.agent", "slashrt.transport.shm", "slashrt.transport.tcp", "slashrt.snapshot.storage",
            "slashrt.snapshot.cluster_agent", "slashrt.ops.chunks", "numpy.ma")
_HEADER = struct.Struct("!I")
_MAIN = "from slashrt.cluster._zygote import main; main()"  # (its command line names it: `slashrt.bench.chaos`)
_FDS = 2  # the child's stdout and stderr


def _frame(message) -> bytes:
    data = pickle.dumps(message, protocol=5)
    return _HEADER.pack(len(data)) + data


class ForkedAgent:
    """An agent process the zygote forked: what the coordinator uses of a `trio.Process`."""

    def __init__(self, stdout: trio.lowlevel.FdStream, stderr: trio.lowlevel.FdStream):
        self.pid: int | None = None
        self.stdout, self.stderr = stdout, stderr
        self.returncode: int | None = None
        self._forked, self._ended = trio.Event(), trio.Event()
        self._abandoned = False  # its request was cancelled: killed as soon as it is forked

    async def wait(self) -> int:
        await self._ended.wait()
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None and self.pid is not None:
            with contextlib.suppress(ProcessLookupError):  # (not yet reaped: the pid is still its own)
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _exited(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._ended.set()


class Zygote:
    """The coordinator's end of a running zygote (made by `open_zygote`)."""

    def __init__(self, proc: trio.Process, sock: trio.socket.SocketType):
        self.proc, self.sock = proc, sock
        self._lock = trio.Lock()  # one request at a time: its "forked" answers it
        self._waiting: ForkedAgent | None = None
        self._agents: dict[int, ForkedAgent] = {}
        self._gone = False
        self._preloaded = trio.Event()  # the preload is sent (or there is none): requests may follow

    async def spawn(self, argv: list[str], env: dict) -> ForkedAgent:
        """Fork an agent running `slashrt.cluster.agent.main(argv)` with `env`, this process's
        sys.path and working directory; its stdout and stderr are pipes to this process."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        agent = ForkedAgent(trio.lowlevel.FdStream(out_r), trio.lowlevel.FdStream(err_r))
        try:
            await self._preloaded.wait()
            async with self._lock:
                if self._gone:
                    raise OSError("the executors' fork server exited")
                data = _frame(("spawn", argv, env, list(sys.path), os.getcwd()))
                self._waiting = agent
                sent = await self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [out_w, err_w]))])
                await self.send(data[sent:])
                try:
                    await agent._forked.wait()
                except BaseException:  # (cancelled: nobody will reap it but the zygote)
                    agent._abandoned = True
                    agent.kill()
                    raise
        finally:
            os.close(out_w)
            os.close(err_w)
        if agent.pid is None:
            raise OSError("the executors' fork server exited")
        return agent

    async def send(self, data: bytes) -> None:
        while data:
            data = data[await self.sock.send(data):]

    async def _read(self) -> None:
        """Hand each "forked" to the request waiting for it, each "exited" to its agent."""
        pending = b""
        try:
            while True:
                while len(pending) < _HEADER.size or len(pending) < _HEADER.size + _HEADER.unpack_from(pending)[0]:
                    chunk = await self.sock.recv(65536)
                    if not chunk:
                        return
                    pending += chunk
                size = _HEADER.unpack_from(pending)[0]
                message, pending = pickle.loads(pending[_HEADER.size:_HEADER.size + size]), pending[_HEADER.size + size:]
                if message[0] == "forked":
                    agent, self._waiting = self._waiting, None
                    agent.pid = message[1]
                    self._agents[agent.pid] = agent
                    agent._forked.set()
                    if agent._abandoned:
                        agent.kill()
                elif message[0] == "exited":
                    if (agent := self._agents.pop(message[1], None)) is not None:
                        agent._exited(message[2])
        finally:  # the zygote is gone (or this run ends): no answer will come
            self._gone = True
            if self._waiting is not None:
                self._waiting._forked.set()
            for agent in self._agents.values():  # (orphans exit on their own: `--with-parent`)
                agent.kill()
                agent._exited(-signal.SIGKILL)


@contextlib.contextmanager
def _socketpair():
    """(mine, theirs): theirs is closed on the way out (handed to another process by then), mine
    too if the block fails."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        yield mine, theirs
    except BaseException:
        mine.close()
        raise
    finally:
        theirs.close()


def _zygote_env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))


class Session:
    """A zygote that outlives runs: the runs given it (`run(..., session=)`) fork their local
    agents from it, so none but the first waits for an interpreter to import slashrt, numpy
    and trio. Use as a context manager (or `close()`): the zygote exits, and with it any agent
    still running; so it does when this process ends, however it ends. Each run has a
    connection of its own to it (`connect`): the agents forked for a run are killed when that
    run's connection closes, as a run's own zygote's are when it exits."""

    def __init__(self):
        with _socketpair() as (mine, theirs):
            self._proc = subprocess.Popen([sys.executable, "-c", _MAIN], stdin=theirs.fileno(),
                                          stdout=subprocess.DEVNULL, env=_zygote_env())
        self._lifeline = mine
        self.pid = self._proc.pid

    def connect(self) -> socket.socket:
        """A new run's connection to the zygote (its end here)."""
        if self._lifeline is None or self._proc.poll() is not None:
            raise OSError("the session's fork server is not running")
        with _socketpair() as (mine, theirs):
            self._lifeline.sendmsg([_frame(("run",))],
                                   [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [theirs.fileno()]))])
        return mine

    def close(self) -> None:
        if self._lifeline is not None:
            self._lifeline.close()  # the zygote kills what it forked and is left, reaps it, exits
            self._lifeline = None
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.asynccontextmanager
async def open_zygote(preload=None, session: Session | None = None):
    """Start a zygote (it imports the agent's modules meanwhile; requests wait for it) and stop
    it on the way out, with every agent it forked still running: none is left behind.
    `preload` (e.g. the flow): unpickled by the zygote before its first fork, so that the
    modules a job imports as its agent unpickles it are imported once, not by every agent.
    With a `session`, its zygote instead, on a connection of this run's own: on the way out
    the connection closes and the agents forked for the run are killed; the zygote stays."""
    if session is not None:
        zygote = Zygote(None, trio.socket.from_stdlib_socket(session.connect()))
        try:
            async with unwrap_groups(), trio.open_nursery() as nursery:
                nursery.start_soon(zygote._read)
                nursery.start_soon(_preload_in, zygote, preload)
                try:
                    yield zygote
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            zygote.sock.close()
        return
    with _socketpair() as (mine, theirs):
        proc = await trio.lowlevel.open_process([sys.executable, "-c", _MAIN], stdin=theirs.fileno(),
                                                stdout=subprocess.DEVNULL, env=_zygote_env())
    zygote = Zygote(proc, trio.socket.from_stdlib_socket(mine))
    try:
        async with unwrap_groups(), trio.open_nursery() as nursery:  # (the run's error itself, not a group)
            nursery.start_soon(zygote._read)
            nursery.start_soon(_preload_in, zygote, preload)  # (in the background: a zygote may not read yet)
            try:
                yield zygote
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            zygote.sock.close()  # the zygote kills what it forked and is left, reaps it, exits
            with trio.move_on_after(5):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def _preload_in(zygote: Zygote, preload) -> None:
    """Send `preload` before any request (they wait for it)."""
    import cloudpickle

    try:
        if preload is not None:
            data = cloudpickle.dumps(preload, protocol=5)
            with contextlib.suppress(OSError):  # (a zygote gone says so at the first spawn)
                await zygote.send(_frame(("preload", data)))
    except Exception:  # (not picklable: the job's own pickling says what is wrong, in its words)
        pass
    finally:
        zygote._preloaded.set()


# -- the zygote process -------------------------------------------------------------------------

def _child(request, fds: list[int], closing: list[int]) -> None:
    """In the forked child: become the agent the request describes; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _, argv, env, path, cwd = request
        for fd in closing:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # (fd 0 was the zygote's socket: the coordinator's only, from here)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in (null, *fds):
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = path
        with contextlib.suppress(OSError):
            os.chdir(cwd)
        import random

        import numpy as np

        random.seed()  # not the zygote's state, shared by every child
        np.random.seed()
        from slashrt.cluster.agent import main

        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _preload(data: bytes) -> None:
    """Import what unpickling the job's flow imports (an error is the agent's to report)."""
    import cloudpickle

    with contextlib.suppress(Exception):
        cloudpickle.loads(data)


class _Connection:
    """One coordinator's connection to the zygote: its requests and the children it forked."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.pending, self.fds = b"", []
        self.children: set[int] = set()


def _kill(pids) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _serve(lifeline: socket.socket) -> None:
    """Fork an agent per request until the coordinator's end closes; report each child's exit.
    `lifeline` is the coordinator's connection; a session's (`Session`) also hands over a
    connection per run ("run"), whose children are killed when that run's end closes."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # (the wake-up fd is what matters)
    connections = {lifeline: _Connection(lifeline)}
    owner: dict[int, _Connection] = {}  # child -> the connection it was forked for
    dropped: set[int] = set()  # children of a closed connection, killed, to reap

    def reap() -> None:
        while owner or dropped:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            dropped.discard(pid)
            if (connection := owner.pop(pid, None)) is not None:
                connection.children.discard(pid)
                with contextlib.suppress(OSError):
                    connection.sock.sendall(_frame(("exited", pid, os.waitstatus_to_exitcode(status))))

    def close(connection: _Connection) -> None:
        _kill(connection.children)  # nothing forked for a run outlives it
        for pid in connection.children:
            owner.pop(pid, None)
        dropped.update(connection.children)
        for fd in connection.fds:
            os.close(fd)
        connections.pop(connection.sock, None)
        connection.sock.close()

    try:
        while True:
            ready, _, _ = select.select([*connections, wake_r], [], [])
            if wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                reap()
            for sock in ready:
                if sock is wake_r or sock not in connections:
                    continue
                connection = connections[sock]
                try:
                    data, ancillary, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(_FDS * 4 * 4))
                except OSError:
                    data, ancillary = b"", []
                for level, kind, payload in ancillary:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        connection.fds.extend(array.array("i", payload[: len(payload) - len(payload) % 4]))
                if not data:
                    if sock is lifeline:
                        return
                    close(connection)
                    continue
                connection.pending += data
                while _whole(connection.pending):
                    size = _HEADER.unpack_from(connection.pending)[0]
                    request = pickle.loads(connection.pending[_HEADER.size:_HEADER.size + size])
                    connection.pending = connection.pending[_HEADER.size + size:]
                    if request[0] == "preload":
                        _preload(request[1])
                        continue
                    if request[0] == "run":  # a session's run: its connection, handed over
                        (fd,), connection.fds = connection.fds[:1], connection.fds[1:]
                        run = socket.socket(fileno=fd)
                        connections[run] = _Connection(run)
                        continue
                    mine, connection.fds = connection.fds[:_FDS], connection.fds[_FDS:]
                    others = [c.sock.fileno() for c in connections.values()]
                    others += [fd for c in connections.values() for fd in c.fds]
                    pid = os.fork()
                    if pid == 0:
                        _child(request, mine, [*others, wake_r, wake_w])
                    connection.children.add(pid)
                    owner[pid] = connection
                    for fd in mine:
                        os.close(fd)
                    try:
                        sock.sendall(_frame(("forked", pid)))
                    except OSError:  # the coordinator is gone (interrupted, killed) mid-request
                        if sock is lifeline:
                            return
                        close(connection)
                        break
    finally:  # the coordinator is gone or done: nothing forked here outlives it
        _kill(list(owner) + list(dropped))
        for pid in list(owner) + list(dropped):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _whole(pending: bytes) -> bool:
    return len(pending) >= _HEADER.size and len(pending) >= _HEADER.size + _HEADER.unpack_from(pending)[0]


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the coordinator's to handle
    sock = socket.socket(fileno=os.dup(0))
    os.close(0)
    os.open(os.devnull, os.O_RDONLY)  # (fd 0 again)
    import importlib

    for module in _PRELOAD:  # what every agent imports, once, before any fork
        importlib.import_module(module)

    _serve(sock)

