"""Batch: zero-copy column views, composable selections, derived columns, 2-D slot views."""

import numpy as np
import pytest

from slashrt import Batch, SchemaError
from slashrt._batch import as_batch

DT = np.dtype([("t", "<i8"), ("k", "<i4"), ("flag", "u1")])


def records(n=10):
    a = np.zeros(n, DT)
    a["t"] = np.arange(n) * 10
    a["k"] = np.arange(n) % 3
    a["flag"] = np.arange(n) % 2
    return a


def test_columns_are_views_of_the_records():
    a = records()
    b = Batch(a)
    assert len(b) == 10
    assert b.names == ("t", "k", "flag")
    t = b["t"]
    assert np.shares_memory(t, a)
    a["t"][3] = -1
    assert t[3] == -1


def test_select_by_mask_copies_no_record():
    a = records()
    b = Batch(a)
    sel = b[b["flag"] == 1]
    assert len(sel) == 5
    assert sel._records is a  # the records are shared, only row indices are kept
    assert list(sel["t"]) == [10, 30, 50, 70, 90]


@pytest.mark.parametrize(
    "first, second, expected",
    [
        (np.arange(10) % 2 == 0, [1, 3], [20, 60]),  # mask then indices
        ([9, 8, 7, 6, 5], np.array([True, False, True, False, True]), [90, 70, 50]),  # indices then mask
        (slice(2, 8), slice(None, None, 2), [20, 40, 60]),  # slice then slice
        (slice(None, None, -1), np.array([0, 1]), [90, 80]),  # reversed slice then indices
        ([-1, 0], slice(1, None), [0]),  # negative indices
    ],
)
def test_selections_compose(first, second, expected):
    a = records()
    b = Batch(a).select(first).select(second)
    assert len(b) == len(expected)
    assert list(b["t"]) == expected
    assert list(b["k"]) == [t // 10 % 3 for t in expected]


def test_select_nothing():
    b = Batch(records())
    assert len(b.select([])) == 0
    assert b.select([])["t"].shape == (0,)
    assert len(b.select(np.zeros(10, bool))) == 0


def test_with_columns_adds_and_replaces_and_survives_select():
    a = records()
    b = Batch(a).with_columns(double=a["t"] * 2, k=np.full(10, 7, np.int64))
    assert b.names == ("t", "flag", "double", "k")
    assert list(b["k"]) == [7] * 10
    assert list(a["k"]) == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0], "records untouched"
    s = b.select(slice(1, 4)).select(np.array([True, False, True]))
    assert list(s["double"]) == [20, 60]
    assert list(s["t"]) == [10, 30]


def test_with_columns_on_a_selection_aligns_with_the_selected_rows():
    b = Batch(records())[[4, 2]]
    b = b.with_columns(pos=np.array([0, 1]))
    assert list(b["t"]) == [40, 20]
    assert list(b["pos"]) == [0, 1]


def test_with_columns_rejects_wrong_length():
    b = Batch(records())
    with pytest.raises(SchemaError, match=r"column 'x' has shape \(3,\), expected \(10,\)"):
        b.with_columns(x=np.arange(3))


def test_project_keeps_named_columns_in_order():
    b = Batch(records()).with_columns(y=np.arange(10))
    p = b.project(["y", "t"])
    assert p.names == ("y", "t")
    assert "k" not in p
    assert list(p.select(slice(0, 2))["t"]) == [0, 10]
    with pytest.raises(SchemaError, match="'k'"):
        p["k"]
    with pytest.raises(SchemaError, match="at least one column"):
        b.project([])


def test_to_numpy_without_changes_is_the_records_themselves():
    a = records()
    out = Batch(a).to_numpy()
    assert np.shares_memory(out, a)
    assert out.dtype == DT


def test_to_numpy_gathers_selection_and_derived_columns():
    a = records()
    b = Batch(a)[a["k"] == 1].with_columns(t=np.array([1.5, 2.5, 3.5]))
    out = b.to_numpy()
    assert out.dtype.names == ("k", "flag", "t")
    assert out["t"].dtype == np.float64
    assert list(out["t"]) == [1.5, 2.5, 3.5]
    assert list(out["flag"]) == [1, 0, 1]
    assert not np.shares_memory(out, a)


def test_to_numpy_with_a_target_dtype():
    b = Batch(records())
    out = b.to_numpy(np.dtype([("k", "<i8"), ("t", "<f8")]))
    assert list(out["k"][:4]) == [0, 1, 2, 0]
    assert out["t"][9] == 90.0


def slot_view(rows_per_slot=5, slots=3, slot_size=128):
    """Records of several consecutive ring slots as one 2-D view, as `Receiver.records_run` makes."""
    ring = np.full(slots * slot_size, 0xFF, np.uint8)  # bytes between the slots' records must never show
    view = np.ndarray((slots, rows_per_slot), dtype=DT, buffer=ring, strides=(slot_size, DT.itemsize))
    flat = records(slots * rows_per_slot)
    view[...] = flat.reshape(slots, rows_per_slot)
    return view, flat


def test_a_2d_slot_view_behaves_like_its_flattened_records():
    view, flat = slot_view()
    b2, b1 = Batch(view), Batch(flat)
    assert len(b2) == len(b1) == 15
    for name in DT.names:
        assert np.array_equal(b2[name], b1[name])
    assert np.array_equal(b2.to_numpy(), flat)
    mask = b1["k"] == 2
    assert np.array_equal(b2[mask].to_numpy(), b1[mask].to_numpy())
    assert np.array_equal(b2[[14, 0, 7]]["t"], [140, 0, 70])
    assert np.array_equal(b2.select(slice(4, 11))["t"], flat["t"][4:11])
    assert np.array_equal(b2.with_columns(x=np.arange(15))[mask]["x"], np.flatnonzero(mask))


def test_unknown_column_names_the_available_ones():
    b = Batch(records()).with_columns(extra=np.arange(10))
    with pytest.raises(SchemaError, match=r"no column 'nope' in batch with columns \['t', 'k', 'flag', 'extra'\]"):
        b["nope"]


@pytest.mark.parametrize("mask", [np.ones(9, bool), np.ones((10, 1), bool), np.ones((2, 5), bool)])
def test_mask_of_the_wrong_shape_is_rejected(mask):
    with pytest.raises(SchemaError, match=r"boolean mask of shape .* for a batch of 10 rows"):
        Batch(records())[mask]


def test_as_batch_accepts_batches_and_1d_structured_arrays_only():
    a = records()
    b = Batch(a)
    assert as_batch(b) is b
    assert as_batch(a)._records is a
    for bad in (np.arange(3), a.reshape(2, 5), [1, 2], None):
        with pytest.raises(TypeError):
            as_batch(bad)
