"""Redis Streams plumbing shared by the source and the sink: connecting, the packed entry
format, and turning a client's failure into one sentence naming the server.

A stream entry holds a batch of records, packed:

    b       the records' raw bytes, little-endian, in the schema's packed layout
    n       how many records (decimal text): len(b) == n * record size
    schema  a short fingerprint of the record layout (`fingerprint`), so that a stream written
            with another schema is refused instead of read as garbage

An entry with the field `end` (and no records) ends the stream for whoever reads it.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import urllib.parse

import numpy as np

from slashrt._schema import Schema, _layout
from slashrt.errors import BrokerUnavailable, ConnectorError, OptionError, SchemaError, SlashError

# 256 KiB an entry by default: big enough that the per-entry cost of a command and of a
# np.frombuffer vanishes, small enough that one XREAD of `count` entries stays modest
DEFAULT_ENTRY_BYTES = 256 * 1024
END_FIELD = b"end"
DEFAULT_COUNT = 64  # entries per read: replies of ~16 MiB; far larger ones parse slower
# seconds a broker call (connecting included) may take before the broker is deemed hung: far
# above a loaded machine's round trip and a 16 MiB pipeline, far below the heartbeat timeout
# (50 s), so a hung broker is named as the cause, not the executor waiting on it
DEFAULT_TIMEOUT = 5.0


def fingerprint(dtype: np.dtype) -> str:
    """12 hex digits naming a record layout: field names, types, byte order and offsets."""
    layout = ",".join(f"{n}:{dtype.fields[n][0].str}@{dtype.fields[n][1]}" for n in dtype.names)
    return hashlib.blake2b(f"{layout}/{dtype.itemsize}".encode(), digest_size=6).hexdigest()


def shown(url: str) -> str:
    """`url` as messages show it: a password in it (user:password@ or ?password=) as ***."""
    try:
        password = urllib.parse.urlsplit(url).password
    except (TypeError, ValueError, AttributeError):
        return repr(url)
    if password is not None:
        url = url.replace(f":{password}@", ":***@", 1)
    return re.sub(r"([?&])password=[^&]*", r"\1password=***", url)


def connect(url: str, *, timeout: float = DEFAULT_TIMEOUT, read_timeout: float | None = None):
    """A client for `url` (redis://, rediss:// or unix://), made without connecting yet; every
    call (connecting included) fails after `timeout` seconds (`read_timeout`, if given, for
    answers: a blocked XREAD's block time and `timeout`).

    A wrong URL is an OptionError now; an unreachable server shows on the first command (see
    `failure`). redis-py's own retries are off: a server that went away is reported at once,
    not after seconds of back-off, and whoever holds the position decides what to retry."""
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError:
        raise OptionError(
            "the Redis connectors need the Python package redis: install slashrt with the extra [redis]"
        ) from None
    if not isinstance(url, str):
        raise OptionError(f"a Redis URL must be a string such as 'redis://127.0.0.1:6379/0', got {url!r}")
    try:
        return redis.Redis.from_url(
            url, socket_connect_timeout=timeout, socket_timeout=read_timeout or timeout, retry=Retry(NoBackoff(), 0)
        )
    except ValueError as exc:
        raise OptionError(f"{shown(url)!r} is not a Redis URL ({exc}); write e.g. 'redis://127.0.0.1:6379/0'") from None


def check_timeout(timeout) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float, np.integer, np.floating)) or not timeout > 0:
        raise OptionError(f"timeout must be a positive number of seconds (each call to the broker), got {timeout!r}")
    return float(timeout)


def broker(url: str) -> str:
    """The broker's address as failures name it: host:port (or a unix socket's path)."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme == "unix":
            return parts.path
        return f"{parts.hostname or 'localhost'}:{parts.port or 6379}"
    except (TypeError, ValueError, AttributeError):
        return shown(url)


@contextlib.contextmanager
def failure(url: str, doing: str, hint: str = "", timeout: float | None = None):
    """Around client calls: a redis error becomes one sentence naming the broker and what was
    being done (`doing`), followed by `hint` (e.g. where to resume). A broker that cannot be
    reached, or does not answer within `timeout` (the client's), is a BrokerUnavailable, which
    a restart strategy retries; a refused command or another failure is a ConnectorError."""
    import redis

    try:
        yield
    except redis.exceptions.TimeoutError as exc:
        within = f"within {timeout:g} s" if timeout is not None else f"in time ({_reason(exc)})"
        raise BrokerUnavailable(
            f"the Redis broker at {broker(url)} did not answer {within} while {doing}{hint}"
        ) from None
    except redis.exceptions.ConnectionError as exc:
        raise BrokerUnavailable(
            f"the Redis broker at {broker(url)} cannot be reached while {doing}: {_reason(exc)}{hint}"
        ) from None
    except redis.exceptions.ResponseError as exc:
        raise ConnectorError(f"Redis at {shown(url)} refused a command while {doing}: {exc}{hint}") from None
    except redis.exceptions.RedisError as exc:
        raise ConnectorError(f"Redis at {shown(url)} failed while {doing}: {type(exc).__name__}: {exc}{hint}") from None


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().rstrip(".")
    return text or type(exc).__name__


def stream_schema(records: np.ndarray, what: str) -> tuple[np.ndarray, str]:
    """`records` in their packed little-endian layout (a copy only if they are not), and the
    fingerprint of that layout."""
    if not isinstance(records, np.ndarray) or records.dtype.names is None or records.ndim != 1:
        raise SchemaError(f"{what}: expected a 1-D numpy structured array, got {_describe(records)}")
    schema = Schema.from_dtype(records.dtype)
    return schema.conform(records, what), fingerprint(schema.dtype)


def _describe(value) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} and dtype {value.dtype}"
    return type(value).__name__


def packed_entries(records: np.ndarray, fp: str, entry_bytes: int = DEFAULT_ENTRY_BYTES):
    """The fields of the entries that carry `records` (packed, contiguous), each at most
    `entry_bytes` of records (at least one record)."""
    size = records.dtype.itemsize
    per_entry = max(1, entry_bytes // size)
    raw = records.view(np.uint8)
    for first in range(0, len(records), per_entry):
        count = min(per_entry, len(records) - first)
        yield {b"b": raw[first * size : (first + count) * size].tobytes(), b"n": count, b"schema": fp}


def check_entry_bytes(entry_bytes) -> int:
    if isinstance(entry_bytes, bool) or not isinstance(entry_bytes, (int, np.integer)) or entry_bytes < 1:
        raise OptionError(f"entry_bytes must be a positive number of bytes, got {entry_bytes!r}")
    return int(entry_bytes)


class EntryDecoder:
    """Decodes the entries of one stream into arrays of one record layout, refusing (naming
    the entry's id) any entry that is not a packed batch of that layout. Per entry, not per
    record: the entries' bytes are joined (one copy) and become records with one np.frombuffer."""

    def __init__(self, url: str, key: str, dtype: np.dtype, reader: str):
        self.url, self.key, self.dtype, self.reader = shown(url), key, dtype, reader
        self.fp = fingerprint(dtype).encode()

    def decode(self, entries: list) -> tuple[np.ndarray, bytes | None, bool, SlashError | None]:
        """(records of `entries` as one array, id of the last entry used, whether an end
        entry came, the error of a bad entry); entries after an end or a bad entry are not
        used, those before a bad one are."""
        payloads, last, ended, error = self.payloads(entries)
        return self.records(payloads), last, ended, error

    def payloads(self, entries: list) -> tuple[list[bytes], bytes | None, bool, SlashError | None]:
        """`decode`, with the records still as the entries' checked bytes (`records` joins them)."""
        parts = []
        last = None
        for entry_id, fields in entries:
            if END_FIELD in fields:
                return parts, entry_id, True, None
            try:
                parts.append(self._payload(entry_id, fields))
            except SlashError as exc:
                return parts, last, False, exc
            last = entry_id
        return parts, last, False, None

    def records(self, payloads: list[bytes], *, writable: bool = False) -> np.ndarray:
        """Checked payloads as one array, joined as bytes (a structured concatenate is far
        slower); a view of the one payload if there is one (read-only) unless `writable`."""
        if len(payloads) == 1 and not writable:
            return np.frombuffer(payloads[0], self.dtype)
        return np.frombuffer(bytearray().join(payloads), self.dtype)

    def _payload(self, entry_id: bytes, fields: dict) -> bytes:
        where = f"stream {self.key!r} at {self.url}, entry {entry_id.decode()}"
        missing = [name for name in (b"b", b"n", b"schema") if name not in fields]
        if missing:
            have = ", ".join(sorted(f.decode(errors="replace") for f in fields)) or "none"
            raise ConnectorError(
                f"{where} has no field(s) {', '.join(m.decode() for m in missing)} (it has: {have}); "
                "slashrt reads entries written by slashrt.connectors.write_stream or RedisStreamSink"
            )
        if fields[b"schema"] != self.fp:
            raise SchemaError(
                f"{where} was written with schema fingerprint {fields[b'schema'].decode(errors='replace')!r}, "
                f"but {self.reader} reads schema {self.fp.decode()!r} ({_layout(self.dtype)}): read the stream "
                "with the schema it was written with"
            )
        payload = fields[b"b"]
        size = self.dtype.itemsize
        try:
            n = int(fields[b"n"])
        except ValueError:
            raise ConnectorError(f"{where} has n={fields[b'n']!r}, not a record count") from None
        if len(payload) % size or len(payload) // size != n:
            raise ConnectorError(
                f"{where} holds {len(payload)} bytes for n={n} records of {size} bytes: the entry is truncated or "
                "was not written by slashrt"
            )
        return payload
