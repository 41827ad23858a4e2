"""The file format of one operator instance's snapshot: named numpy arrays plus JSON metadata.

No pickle: a snapshot written by one slashrt is read by a later one, or refused clearly.
Layout (little-endian)::

    preamble  16 B   magic b"SLASHSNP" | format version u32 | crc32 of those 12 bytes
    head      16 B   index length u64 | payload length u64                    (version 1)
    index            UTF-8 JSON: {"arrays": [{name, dtype, shape, offset, nbytes}], "meta": ...}
    padding          to a multiple of 64, so every array starts 64-byte aligned
    payload          the arrays' bytes in C order, each at a 64-byte aligned offset
    trailer    4 B   crc32 of every byte before it

The preamble is frozen across versions: its own checksum tells a corrupt version field
(`SnapshotCorrupt`) from a file a later slashrt wrote (`SnapshotVersionError`). Lengths are
checked against the file's size before anything else is trusted, then the trailer's checksum.

Writing streams each array's own buffer to the file (no copy of a C-contiguous array; one
for any other layout); reading takes one buffer and returns arrays that are views into it.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping
from typing import BinaryIO

import numpy as np

from slashrt.errors import SnapshotCorrupt, SnapshotError, SnapshotVersionError

__all__ = ["FORMAT_VERSION", "State", "state_chunks", "write_state", "encode_state", "decode_state"]

MAGIC = b"SLASHSNP"
FORMAT_VERSION = 1
_PREAMBLE = struct.Struct("<8sII")  # magic, version, crc32(magic + version)
_HEAD = struct.Struct("<QQ")  # index length, payload length
_TRAILER = struct.Struct("<I")
_ALIGN = 64


class State:
    """A decoded snapshot: `arrays` (name -> numpy array) and `meta` (JSON-able metadata)."""

    __slots__ = ("arrays", "meta")

    def __init__(self, arrays: dict[str, np.ndarray], meta):
        self.arrays = arrays
        self.meta = meta

    def __repr__(self) -> str:
        shapes = ", ".join(f"{name}: {a.dtype.str}{list(a.shape)}" for name, a in self.arrays.items())
        return f"State({{{shapes}}}, meta={self.meta!r})"


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _preamble(version: int) -> bytes:
    body = MAGIC + struct.pack("<I", version)
    return _PREAMBLE.pack(MAGIC, version, zlib.crc32(body))


def _layout(arrays: Mapping[str, np.ndarray], meta, name: str):
    """The index (as bytes), the arrays in C order and their payload offsets."""
    if not isinstance(arrays, Mapping):
        raise SnapshotError(f"snapshot {name}: a state is a mapping of names to arrays, not {type(arrays).__name__}")
    entries, ready, offset = [], [], 0
    for key, value in arrays.items():
        if not isinstance(key, str):
            raise SnapshotError(f"snapshot {name}: array names must be strings, not {key!r}")
        array = np.asarray(value)
        if array.dtype.hasobject:
            raise SnapshotError(
                f"snapshot {name}: array {key!r} holds Python objects ({array.dtype}); "
                "snapshot state as numeric, bytes or structured arrays"
            )
        array = np.ascontiguousarray(array) if array.ndim else array.reshape(())
        entries.append(
            {"name": key, "dtype": _descr(array.dtype), "shape": list(array.shape), "offset": offset, "nbytes": array.nbytes}
        )
        ready.append(array)
        offset = _aligned(offset + array.nbytes)
    try:
        index = json.dumps({"arrays": entries, "meta": meta}, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise SnapshotError(f"snapshot {name}: metadata is not JSON-able ({exc}); keep arrays in the arrays") from None
    payload_len = _aligned(offset) if entries else 0
    return index, ready, entries, payload_len


def state_chunks(arrays: Mapping[str, np.ndarray], meta=None, *, name: str = "<state>") -> tuple[list, int, int]:
    """A snapshot as the chunks of bytes to write in order (each array's own buffer: nothing is
    copied for C-contiguous arrays), its size and the checksum in its trailer (the crc32 of
    every byte before it). Few, large chunks: a writer hands them to one `os.writev`."""
    index, ready, entries, payload_len = _layout(arrays, meta, name)
    header_len = _PREAMBLE.size + _HEAD.size + len(index)
    chunks = [_preamble(FORMAT_VERSION) + _HEAD.pack(len(index), payload_len) + index + bytes(_aligned(header_len) - header_len)]
    position = 0
    for entry, array in zip(entries, ready):
        if entry["offset"] > position:
            chunks.append(bytes(entry["offset"] - position))
        if array.nbytes:
            chunks.append(array.reshape(-1).view(np.uint8))  # the array's own buffer
        position = entry["offset"] + array.nbytes
    if payload_len > position:
        chunks.append(bytes(payload_len - position))
    crc = 0
    for chunk in chunks:
        crc = zlib.crc32(chunk, crc)  # (releases the GIL over a large buffer)
    chunks.append(_TRAILER.pack(crc))
    return chunks, sum(len(c) if isinstance(c, bytes) else c.nbytes for c in chunks), crc


def write_state(out: BinaryIO, arrays: Mapping[str, np.ndarray], meta=None, *, name: str = "<state>") -> tuple[int, int]:
    """Write a snapshot to the binary file `out`; returns (bytes written, the checksum in its
    trailer: the crc32 of every byte before it)."""
    chunks, size, crc = state_chunks(arrays, meta, name=name)
    for chunk in chunks:
        out.write(chunk)
    return size, crc


def encode_state(arrays: Mapping[str, np.ndarray], meta=None) -> bytes:
    """A snapshot as bytes (for small states and tests; `write_state` streams to a file)."""
    import io

    out = io.BytesIO()
    write_state(out, arrays, meta)
    return out.getvalue()


def decode_state(buffer, *, name: str = "<state>") -> State:
    """Validate and decode a snapshot; arrays are views into `buffer` (writable if it is).

    Raises `SnapshotCorrupt` (truncated, bad magic, bad checksum) or `SnapshotVersionError`
    (a format this slashrt does not know), both naming `name`."""
    view = memoryview(buffer).cast("B")
    size = len(view)
    if size < _PREAMBLE.size:
        raise SnapshotCorrupt(f"snapshot {name} is truncated: {size} bytes, shorter than its {_PREAMBLE.size}-byte preamble")
    magic, version, check = _PREAMBLE.unpack_from(view)
    if magic != MAGIC:
        raise SnapshotCorrupt(f"snapshot {name} is not a slashrt snapshot (it starts with {bytes(magic)!r}, not {MAGIC!r})")
    if zlib.crc32(view[:12]) != check:
        raise SnapshotCorrupt(f"snapshot {name} is corrupt: the checksum of its preamble does not match")
    if version != FORMAT_VERSION:
        raise SnapshotVersionError(
            f"snapshot {name} has format version {version}, this slashrt reads version {FORMAT_VERSION}: "
            "read it with the slashrt that wrote it (or a later one)"
        )
    if size < _PREAMBLE.size + _HEAD.size:
        raise SnapshotCorrupt(f"snapshot {name} is truncated: {size} bytes, its header is cut off")
    index_len, payload_len = _HEAD.unpack_from(view, _PREAMBLE.size)
    payload_start = _aligned(_PREAMBLE.size + _HEAD.size + index_len)
    expected = payload_start + payload_len + _TRAILER.size
    if size != expected:
        what = "truncated or corrupt" if size < expected else "corrupt (longer than its header says)"
        raise SnapshotCorrupt(f"snapshot {name} is {what}: {size} bytes, its header says {expected}")
    (crc,) = _TRAILER.unpack_from(view, size - _TRAILER.size)
    if zlib.crc32(view[: size - _TRAILER.size]) != crc:
        raise SnapshotCorrupt(f"snapshot {name} is corrupt: its checksum does not match its contents")
    start = _PREAMBLE.size + _HEAD.size
    try:
        index = json.loads(bytes(view[start : start + index_len]))
        arrays = {}
        for entry in index["arrays"]:
            dtype = _dtype(entry["dtype"])
            shape = tuple(entry["shape"])
            if dtype.itemsize == 0 or entry["nbytes"] == 0:
                arrays[entry["name"]] = np.empty(shape, dtype)
                continue
            count = int(np.prod(shape, dtype=np.int64))
            flat = np.frombuffer(buffer, dtype, count, payload_start + entry["offset"])
            arrays[entry["name"]] = flat.reshape(shape)
    except (ValueError, KeyError, TypeError) as exc:  # a checksum collision or a writer's bug
        raise SnapshotCorrupt(f"snapshot {name} is corrupt: its index does not describe its payload ({exc})") from None
    return State(arrays, index["meta"])


def _descr(dtype: np.dtype):
    """A dtype as JSON (numpy's .npy descriptor: structured, padded and subarray dtypes too)."""
    return np.lib.format.dtype_to_descr(dtype)


def _dtype(descr) -> np.dtype:
    return np.lib.format.descr_to_dtype(_tuples(descr))


def _tuples(descr):
    """JSON turned the descriptor's tuples into lists: a field is a list, a field list a list of them."""
    if isinstance(descr, str):
        return descr
    if isinstance(descr, list) and descr and all(isinstance(f, list) for f in descr):
        return [_field(f) for f in descr]
    return descr


def _field(field):
    name = tuple(field[0]) if isinstance(field[0], list) else field[0]  # (title, name)
    rest = [_tuples(field[1])]
    if len(field) > 2:
        rest.append(tuple(field[2]))
    return (name, *rest)
