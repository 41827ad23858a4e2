"""Antichain, MutableAntichain and ChangeBatch laws, over timestamps (epoch, <counter>), a
genuinely partial order: (1, <5>) and (2, <0>) are incomparable."""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from slashrt.progress.antichain import Antichain, ChangeBatch, MutableAntichain
from slashrt.progress.timestamp import Timestamp

FAST = settings(max_examples=40, derandomize=True, deadline=None)

times = st.builds(Timestamp, st.integers(0, 4), st.tuples(st.integers(0, 4)))
updates = st.lists(st.tuples(times, st.integers(-2, 3)), max_size=30)


def minimal(elements):
    elements = set(elements)
    return {e for e in elements if not any(o.less_than(e) for o in elements)}


@FAST
@given(st.lists(times, max_size=20), times)
def test_antichain_is_the_minimal_inserted_elements(inserted, probe):
    chain = Antichain(inserted)
    assert set(chain) == minimal(inserted) and len(chain) == len(minimal(inserted))
    for a in chain:
        for b in chain:
            assert a == b or not a.less_equal(b)
    assert chain.less_equal(probe) == any(e <= probe for e in inserted)
    assert chain.less_than(probe) == any(e < probe for e in inserted)


@FAST
@given(st.lists(times, max_size=20), st.randoms(use_true_random=False))
def test_insertion_order_does_not_matter(inserted, rng):
    shuffled = list(inserted)
    rng.shuffle(shuffled)
    assert Antichain(inserted) == Antichain(shuffled)


@FAST
@given(st.lists(times, max_size=8), st.lists(times, max_size=8))
def test_dominates(a, b):
    expected = all(any(x <= y for x in a) for y in b)
    assert Antichain(a).dominates(Antichain(b)) == expected


def test_insert_reports_change():
    chain = Antichain()
    assert chain.insert(Timestamp(2, (2,)))
    assert not chain.insert(Timestamp(3, (3,)))  # above an element
    assert chain.insert(Timestamp(1, (5,)))  # incomparable: both stay
    assert chain.insert(Timestamp(1, (0,)))  # below both: replaces them
    assert chain.elements == (Timestamp(1, (0,)),)


@FAST
@given(st.lists(st.lists(st.tuples(times, st.integers(-2, 3)), max_size=3), max_size=12))
def test_mutable_frontier_is_the_minimal_positive_elements(batches):
    counts = MutableAntichain()
    totals = Counter()
    reported = set()
    for batch in batches:
        changes = counts.update_iter(batch)
        for element, delta in batch:
            totals[element] += delta
        for element, sign in changes:  # the reported changes turn the old frontier into the new
            assert sign in (1, -1)
            if sign > 0:
                assert element not in reported
                reported.add(element)
            else:
                reported.remove(element)
        expected = minimal(e for e, c in totals.items() if c > 0)
        assert set(counts.frontier) == expected == reported
        for element in totals:
            assert counts.count(element) == totals[element]


@FAST
@given(updates, st.randoms(use_true_random=False))
def test_mutable_frontier_does_not_depend_on_update_order(batch, rng):
    shuffled = list(batch)
    rng.shuffle(shuffled)
    a, b = MutableAntichain(), MutableAntichain()
    a.update_iter(batch)
    for update in shuffled:
        b.update_iter([update])
    assert a.frontier == b.frontier


@FAST
@given(updates, st.randoms(use_true_random=False))
def test_change_batch_sums_and_drops_zeros(batch, rng):
    expected = Counter()
    for item, delta in batch:
        expected[item] += delta
    shuffled = list(batch)
    rng.shuffle(shuffled)
    changes = ChangeBatch(shuffled)
    drained = changes.drain()
    assert dict(drained) == {k: v for k, v in expected.items() if v}
    assert all(delta for _, delta in drained)
    assert changes.is_empty() and changes.drain() == []


def test_mutable_frontier_moves_when_its_element_leaves():
    counts = MutableAntichain()
    low, high = Timestamp(1, (0,)), Timestamp(2, (0,))
    assert counts.update_iter([(high, 1), (low, 2)]) == [(low, 1)]
    assert counts.update_iter([(low, -1)]) == []  # still one at low
    assert counts.update_iter([(low, -1)]) == [(low, -1), (high, 1)]
    assert counts.update_iter([(high, -1)]) == [(high, -1)] and counts.is_empty()


# --- fast paths equal the general path ---------------------------------------------------------

epochs = st.builds(Timestamp, st.integers(0, 6))  # outside loops: a total order
epoch_updates = st.lists(st.lists(st.tuples(epochs, st.integers(-2, 3)), max_size=4), max_size=15)


@FAST
@given(epoch_updates)
def test_one_element_frontier_equals_the_general_path(batches):
    """`total=True` (timestamps outside loops) reports the same changes and frontiers."""
    fast, general = MutableAntichain(total=True), MutableAntichain()
    for batch in batches:
        assert sorted(fast.update_iter(batch), key=repr) == sorted(general.update_iter(batch), key=repr)
        assert fast.frontier == general.frontier and len(fast.frontier) <= 1
        assert dict(fast.positive()) == dict(general.positive())
        for probe in range(-1, 8):
            assert fast.less_equal(Timestamp(probe)) == general.less_equal(Timestamp(probe))


@FAST
@given(st.lists(st.lists(st.tuples(times, st.integers(-2, 3)), max_size=4), max_size=15))
def test_merged_frontier_equals_one_rebuilt_from_the_counts(batches):
    """Merging what became positive into the frontier (instead of rebuilding it) changes nothing."""
    counts = MutableAntichain()
    for batch in batches:
        counts.update_iter(batch)
        assert set(counts.frontier) == set(counts._rebuilt())


def test_frontier_objects_are_never_changed_once_handed_out():
    """A caller may keep a frontier and compare it with a later one (the bus's next_frontier)."""
    counts = MutableAntichain(total=True)
    counts.update_iter([(Timestamp(1), 1)])
    before = counts.frontier
    counts.update_iter([(Timestamp(2), 1), (Timestamp(1), -1)])
    assert before.elements == (Timestamp(1),) and counts.frontier.elements == (Timestamp(2),)
    assert before != counts.frontier


class Divisor:
    """A partial order with nothing but `less_equal`: a <= b iff a divides b."""

    def __init__(self, n):
        self.n = n

    def less_equal(self, other):
        return other.n % self.n == 0

    def __eq__(self, other):
        return self.n == other.n

    def __hash__(self):
        return hash(self.n)


def test_counts_of_elements_without_a_sort_key():
    """Elements with only `less_equal` (no linear extension to sort by) get the minimal ones."""
    counts = MutableAntichain()
    counts.update_iter([(Divisor(4), 1), (Divisor(2), 1), (Divisor(3), 1), (Divisor(1), 1)])
    assert counts.frontier.elements == (Divisor(1),)
    changes = counts.update_iter([(Divisor(1), -1)])  # rebuilt from the counts
    assert sorted((e.n, d) for e, d in changes) == [(1, -1), (2, 1), (3, 1)]
    assert set(counts.frontier) == {Divisor(2), Divisor(3)}
