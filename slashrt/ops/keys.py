"""Keys of any fixed-width type up to 8 bytes (a window's, an exchange's), as int64 codes.

The hash tables, the SSB's partitions, the UpPar routing and the snapshots all key on int64.
A key column of another type is coded into one, exactly and the same on every executor:

- integers are their own code (a uint64 by its bits);
- bytes (`S<n>`, `V<n>`, n <= 8), booleans and floats are their bytes zero-padded to 8,
  read as a little-endian int64; a float's NaNs are made one first (as Java's
  `Double.equals`: every NaN is one key, and -0.0 another than 0.0).

So equal keys have equal codes, distinct keys distinct ones, and a key's partition is the
same wherever it is computed. Results decode the codes back to the key column's type.
Wider keys (`S16`, several columns) need more than 64 bits and are refused in one sentence.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MAX_KEY_BYTES", "codes", "decode", "key_problem"]

MAX_KEY_BYTES = 8


def key_problem(dtype: np.dtype) -> str | None:
    """Why a column of `dtype` cannot be a key (a clause), or None if it can."""
    if dtype.kind in "iu":
        return None
    if dtype.kind not in "bfSV" or dtype.names is not None or dtype.subdtype is not None:
        return f"is {dtype}: a key is an integer, bytes (S<n>, V<n>), a boolean or a float column"
    if dtype.itemsize > MAX_KEY_BYTES:
        return (f"is {dtype}, {dtype.itemsize} bytes wide: a key is at most {MAX_KEY_BYTES} bytes "
                "(an integer, S<n> or V<n> with n <= 8, a boolean or a float)")
    return None


def codes(keys: np.ndarray) -> np.ndarray:
    """The int64 code of each key (1-D; an integer column as int64, as before)."""
    if keys.dtype.kind in "iu":
        return keys.astype(np.int64, copy=False)  # a uint64 key keeps its bits (modulo 2**64)
    keys = np.ascontiguousarray(keys).reshape(-1)
    if keys.dtype.kind == "f":  # little-endian (the results' type), and one NaN
        keys = keys.astype(keys.dtype.newbyteorder("<"), copy=False)
        keys = np.where(np.isnan(keys), np.array(np.nan, keys.dtype), keys)
    width = keys.dtype.itemsize
    if width == MAX_KEY_BYTES:
        return keys.view("<i8").copy()
    padded = np.zeros((len(keys), MAX_KEY_BYTES), np.uint8)
    padded[:, :width] = keys.view(np.uint8).reshape(len(keys), width)
    return padded.view("<i8").reshape(-1)


def decode(codes: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The keys of `dtype` whose codes these are (`codes`' inverse)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return codes.astype(dtype, copy=False)
    raw = np.ascontiguousarray(codes, dtype="<i8").view(np.uint8).reshape(len(codes), MAX_KEY_BYTES)
    return np.ascontiguousarray(raw[:, : dtype.itemsize]).view(dtype).reshape(-1)
