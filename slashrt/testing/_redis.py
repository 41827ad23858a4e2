"""`redis_server()`: a real, throw-away redis-server for tests.

It listens on a free loopback port, keeps nothing on disk (no RDB snapshots, no AOF), works
in its own temporary directory, is ready when the context is entered (it printed that it
accepts connections and answered PING) and is killed and reaped when it is left, whatever
happened inside.

A `persistent` one keeps an append-only file (appendonly yes, fsync every second), as a
broker in production does: every write it acknowledged is in the file before the reply, so
after a SIGKILL `restart()` brings the same server back on the same port with all of it (an
outage, not a data loss). `pause()` / `resume()` hang it (SIGSTOP / SIGCONT).
"""

from __future__ import annotations

import contextlib
import selectors
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["RedisServer", "redis_server"]

_READY = b"Ready to accept connections"
_START_TIMEOUT = 20.0
NOT_INSTALLED = "redis-server is not installed: run make install"


class RedisServer:
    """A running redis-server: its `url`, `port`, `directory`, and `kill()` to make it vanish
    in the middle of something (SIGKILL, then reaped)."""

    def __init__(self, process: subprocess.Popen, port: int, directory: Path, log: list[bytes],
                 drainer: threading.Thread, persistent: bool = False):
        self.process, self.port, self.directory, self._log = process, port, directory, log
        self._drainer, self.persistent = drainer, persistent
        self.url = f"redis://127.0.0.1:{port}/0"

    def kill(self) -> None:
        self.resume()  # (a stopped process dies of SIGKILL too; it just must not stay stopped)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._drainer.join()  # it reads to the end of the dead server's output
        self.process.stdout.close()

    def restart(self) -> None:
        """After `kill`: the server again, on the same port and directory (a persistent one
        with what it had acknowledged)."""
        again = _start(shutil.which("redis-server"), self.directory, self.port, self.persistent)
        if again is None:
            raise RuntimeError(f"redis-server could not listen on port {self.port} again: another process took it")
        self.process, self._drainer, self._log = again.process, again._drainer, self._log + again._log

    def pause(self) -> None:
        """Hang the server (SIGSTOP): it accepts nothing and answers nothing until `resume`."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)

    @property
    def log(self) -> str:
        """What the server printed (for a failing test's message)."""
        return b"".join(self._log).decode(errors="replace")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(executable: str, directory: Path, port: int | None = None, persistent: bool = False) -> RedisServer | None:
    """A started server, or None if its port was taken meanwhile (the caller tries another)."""
    port = port or _free_port()
    process = subprocess.Popen(
        [executable, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "yes" if persistent else "no", "--appendfsync", "everysec",
         "--dir", str(directory), "--daemonize", "no", "--logfile", "", "--loglevel", "notice"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        bufsize=0,  # unbuffered: readline reads no further than the line the selector announced
    )
    log: list[bytes] = []
    try:
        deadline = time.monotonic() + _START_TIMEOUT
        with selectors.DefaultSelector() as sel:
            sel.register(process.stdout, selectors.EVENT_READ)
            while not any(_READY in line for line in log):
                if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                    raise RuntimeError(f"redis-server did not get ready in {_START_TIMEOUT:.0f} s: {b''.join(log)!r}")
                line = process.stdout.readline()
                if not line:  # it exited
                    process.wait()
                    process.stdout.close()
                    text = b"".join(log).decode(errors="replace")
                    if "Address already in use" in text:
                        return None
                    raise RuntimeError(f"redis-server exited with status {process.returncode}: {text.strip()}")
                log.append(line)
        # keep draining its output, so it never blocks on a full pipe
        drainer = threading.Thread(target=_drain, args=(process, log), daemon=True)
        drainer.start()
        server = RedisServer(process, port, directory, log, drainer, persistent)
        _ping(server.url)
        return server
    except BaseException:
        process.kill()
        process.wait()
        process.stdout.close()
        raise


def _drain(process: subprocess.Popen, log: list[bytes]) -> None:
    for line in process.stdout:
        log.append(line)


def _ping(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
    try:
        if not client.ping():
            raise RuntimeError(f"redis-server at {url} did not answer PING")
    finally:
        client.close()


@contextlib.contextmanager
def redis_server(persistent: bool = False):
    """Start a throw-away redis-server (`persistent`: with an append-only file); yield its
    `RedisServer`; kill and reap it at the end (resumed first if it was paused). Raises
    FileNotFoundError saying how to install it when redis-server is not on PATH."""
    executable = shutil.which("redis-server")
    if executable is None:
        raise FileNotFoundError(NOT_INSTALLED)
    with tempfile.TemporaryDirectory(prefix="slashrt-redis-") as tmp:
        server = None
        for _ in range(5):  # a free port can be taken between probing and binding it
            server = _start(executable, Path(tmp), persistent=persistent)
            if server is not None:
                break
        if server is None:
            raise RuntimeError("redis-server found no free port in 5 tries")
        try:
            yield server
        finally:
            server.kill()
