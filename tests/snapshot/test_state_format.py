"""The snapshot file format: random states round-trip, every damage is caught with the right error."""

import io
import struct
import tracemalloc
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from slashrt.errors import SnapshotCorrupt, SnapshotError, SnapshotVersionError
from slashrt.snapshot.state_format import FORMAT_VERSION, MAGIC, decode_state, encode_state, write_state

_scalar = st.one_of(
    hnp.integer_dtypes(), hnp.unsigned_integer_dtypes(), hnp.floating_dtypes(), hnp.complex_number_dtypes(),
    hnp.boolean_dtypes(), hnp.datetime64_dtypes(), hnp.timedelta64_dtypes(),
    hnp.byte_string_dtypes(min_len=1, max_len=8), hnp.unicode_string_dtypes(min_len=1, max_len=4),
)
_dtypes = st.one_of(_scalar, hnp.array_dtypes(_scalar, min_size=1, max_size=4), hnp.nested_dtypes(_scalar, max_leaves=4))
_arrays = _dtypes.flatmap(lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)))
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_states = st.dictionaries(st.text(max_size=10), _arrays, max_size=4)


def _same(restored: np.ndarray, written: np.ndarray) -> bool:
    written = np.asarray(written)
    return (
        restored.dtype == written.dtype
        and restored.shape == written.shape
        and restored.tobytes() == np.ascontiguousarray(written).tobytes()  # bit-exact, NaN too
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=_states, meta=_json)
def test_random_states_round_trip(state, meta):
    restored = decode_state(bytearray(encode_state(state, meta)))
    assert list(restored.arrays) == list(state)
    for name, array in state.items():
        assert _same(restored.arrays[name], array), name
    assert restored.meta == meta


def test_non_contiguous_and_zero_dim_arrays_round_trip():
    state = {"t": np.arange(12.0).reshape(3, 4).T, "step": np.arange(10)[::3], "scalar": np.float32(2.5)}
    restored = decode_state(bytearray(encode_state(state, {})))
    for name, array in state.items():
        assert _same(restored.arrays[name], array)


def test_arrays_are_64_byte_aligned_writable_views():
    buffer = bytearray(encode_state({"a": np.arange(3, dtype=np.int8), "b": np.arange(5.0)}))
    restored = decode_state(buffer)
    for array in restored.arrays.values():
        assert array.ctypes.data % 64 == (np.frombuffer(buffer, np.uint8).ctypes.data % 64)
        assert np.shares_memory(array, np.frombuffer(buffer, np.uint8))
        array[0] = 7  # a restored state is the operator's to change


@pytest.fixture
def small_snapshot():
    dt = np.dtype([("key", "<u8"), ("name", "S4"), ("sum", "<f8", (2,))])
    state = {"slices": np.zeros(3, dt), "epoch": np.array([5, 6], np.int32)}
    return encode_state(state, {"watermark": 17})


def test_every_single_byte_flip_is_detected(small_snapshot):
    for i in range(len(small_snapshot)):
        damaged = bytearray(small_snapshot)
        damaged[i] ^= 0x5A
        with pytest.raises(SnapshotCorrupt, match="snapshot part-x"):
            decode_state(damaged, name="part-x")


def test_every_truncation_and_an_extension_are_detected(small_snapshot):
    for size in range(len(small_snapshot)):
        with pytest.raises(SnapshotCorrupt, match="part-x is truncated"):
            decode_state(bytearray(small_snapshot[:size]), name="part-x")
    with pytest.raises(SnapshotCorrupt, match="longer than its header says"):
        decode_state(bytearray(small_snapshot + b"\0"), name="part-x")


def test_wrong_magic_is_named(small_snapshot):
    with pytest.raises(SnapshotCorrupt, match=r"part-x is not a slashrt snapshot \(it starts with b'PAR1"):
        decode_state(b"PAR1" + small_snapshot[4:], name="part-x")


def test_a_later_format_version_is_refused_as_such(small_snapshot):
    later = bytearray(small_snapshot)
    body = MAGIC + struct.pack("<I", FORMAT_VERSION + 1)
    later[:16] = body + struct.pack("<I", zlib.crc32(body))  # a consistent preamble of version 2
    with pytest.raises(SnapshotVersionError, match="part-x has format version 2, this slashrt reads version 1"):
        decode_state(later, name="part-x")


def test_object_arrays_and_non_json_metadata_are_refused():
    with pytest.raises(SnapshotError, match="array 'o' holds Python objects"):
        encode_state({"o": np.array([object()])})
    with pytest.raises(SnapshotError, match="a state is a mapping of names to arrays, not list"):
        encode_state([np.arange(3)])
    with pytest.raises(SnapshotError, match="metadata is not JSON-able"):
        encode_state({}, {"when": object()})


def test_writing_a_large_array_does_not_copy_it(tmp_path):
    big = np.arange(8 << 20, dtype=np.int64)  # 64 MiB
    with open(tmp_path / "big.state", "wb") as out:
        tracemalloc.start()
        try:
            size, _ = write_state(out, {"big": big, "small": np.arange(3)}, {"n": 1})
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 1 << 20  # no copy of the 64 MiB array (the header and padding are small)
    assert size == (tmp_path / "big.state").stat().st_size
    with open(tmp_path / "big.state", "rb") as f:
        assert _same(decode_state(bytearray(f.read())).arrays["big"], big)


def test_write_reports_the_trailer_checksum():
    out = io.BytesIO()
    size, crc = write_state(out, {"a": np.arange(4)})
    data = out.getvalue()
    assert size == len(data) and crc == zlib.crc32(data[:-4]) == int.from_bytes(data[-4:], "little")
