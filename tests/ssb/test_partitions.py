import numpy as np
import pytest

from slashrt.ssb.partitions import Partitioning


def test_every_key_has_one_partition_and_leader():
    p = Partitioning(256, 3)
    keys = np.array([0, 1, -1, 2**63 - 1, -(2**63), 12345], np.int64)
    parts = p.partition_of(keys)
    assert parts.dtype == np.int64
    assert ((parts >= 0) & (parts < 256)).all()
    assert np.array_equal(p.owner_of(keys), parts % 3)
    assert np.array_equal(p.partition_of(keys), parts)  # a function of the key alone


def test_neighbouring_keys_spread_over_partitions_and_leaders():
    p = Partitioning(256, 4)
    parts = p.partition_of(np.arange(100_000, dtype=np.int64))
    counts = np.bincount(parts, minlength=256)
    assert counts.min() > 0.8 * counts.mean() and counts.max() < 1.2 * counts.mean()
    owners = np.bincount(p.owner_of(np.arange(100_000, dtype=np.int64)), minlength=4)
    assert owners.min() > 0.9 * owners.mean()


def test_led_by_partitions_cover_the_key_space_once():
    p = Partitioning(10, 3)
    led = np.concatenate([p.led_by(e) for e in range(3)])
    assert sorted(led.tolist()) == list(range(10))
    assert all((p.leader_of(p.led_by(e)) == e).all() for e in range(3))


@pytest.mark.parametrize("partitions, executors", [(0, 1), (4, 0)])
def test_bad_sizes_are_refused(partitions, executors):
    with pytest.raises(ValueError, match="at least one"):
        Partitioning(partitions, executors)


@pytest.mark.parametrize("native", [True, False])
def test_route_groups_rows_by_owner_stably(native, monkeypatch):
    from slashrt import _kernels

    if not native:
        monkeypatch.setattr(_kernels, "_native", None)
    p = Partitioning(64, 3)
    rng = np.random.default_rng(0)
    keys = rng.integers(-(2**62), 2**62, 10_000)
    counts = np.arange(10_000, dtype=np.int64)
    vals = rng.random(10_000)
    # written in place into the fields of structured rows, as an epoch's delta rows are
    rows = np.zeros(10_000, [("epoch", "<i8"), ("key", "<i8"), ("count", "<i8"), ("value", "<f8")])
    parts = p.route(keys, counts, vals, (rows["key"], rows["count"], rows["value"]))
    owners = p.owner_of(keys)
    assert parts[0].start == 0 and parts[-1].stop == 10_000
    assert all(a.stop == b.start for a, b in zip(parts[:-1], parts[1:]))
    for o, part in enumerate(parts):
        mine = owners == o
        np.testing.assert_array_equal(rows["key"][part], keys[mine])  # same rows, same order
        np.testing.assert_array_equal(rows["count"][part], counts[mine])
        np.testing.assert_array_equal(rows["value"][part], vals[mine])
    assert not rows["epoch"].any()  # the other fields untouched
    out = np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0)
    empty = p.route(keys[:0], counts[:0], vals[:0], out)
    assert [s.stop - s.start for s in empty] == [0, 0, 0]


def test_route_refuses_leaders_outside_the_executors():
    from slashrt import _kernels

    with pytest.raises(ValueError, match="leader"):
        _kernels.route(np.arange(4), np.ones(4, np.int64), np.zeros(4), np.array([0, 5]), 2)
    with pytest.raises(ValueError, match="length"):
        _kernels.route(np.arange(4), np.ones(3, np.int64), np.zeros(4), np.array([0, 1]), 2)
    with pytest.raises(ValueError, match="as long as keys"):
        _kernels.route(np.arange(4), np.ones(4, np.int64), np.zeros(4), np.array([0, 1]), 2, out=(np.empty(3),) * 3)
    rows = np.zeros(4, [("key", "<i8"), ("count", "<i8"), ("value", "<i8")])
    with pytest.raises(TypeError, match="one stride"):  # the outputs must share their stride
        _kernels.route(
            np.arange(4), np.ones(4, np.int64), np.zeros(4), np.array([0, 1]), 2,
            out=(rows["key"], np.empty(4, np.int64), rows["value"]),
        )
