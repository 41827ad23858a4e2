"""`PerExecutor(make)` whose `make` returns chunks (an iterable of structured arrays), made lazily
while the run goes (`slashrt.ops.chunks`):

- the same records given as chunks or as one array give the same windows and the same late
  records, on one executor, on 2 executors over shm and on 3 over tcp (rings of 4 slots of 1 KiB:
  the data is hundreds of times a ring), with generators, lists, empty chunks and out-of-order
  records across chunk boundaries;
- memory stays bounded: an endless generator runs (stopped with a savepoint), and no chunk is
  made more than a few ahead of what the dataflow has seen; the resume from that savepoint
  skips the chunks fed before it without making them (a sequence input), and the two runs'
  committed output together equals one run's over the same chunks;
- bad returns (not an iterable, a chunk that is not an array, not 1-D, of another schema) are
  refused in one sentence naming the source and the chunk, also on a cluster.
"""

import itertools

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Schema, StopHandle, Tumbling
from slashrt.cluster import ClusterError, PerExecutor
from slashrt.errors import SchemaError
from slashrt.ops.sinks import Collect

SCHEMA = Schema({"t": "i8", "k": "i8", "v": "i8"})
RING = {"slots": 4, "slot_size": 1024}
SIZES = [3000, 0, 7000, 1, 2500] * 3  # records per chunk: empty ones too


def chunk(index: int, executor: int, n: int) -> np.ndarray:
    """Chunk `index` of an executor's stream: times go on from the previous chunk's, out of order
    by up to 30 ms (beyond the sources' bound of 10: some records are late, also across chunks)."""
    rng = np.random.default_rng([executor, index])
    first = sum(SIZES[:index]) if index < len(SIZES) else index * 3000
    out = np.zeros(n, SCHEMA.dtype)
    out["t"] = np.maximum((first + np.arange(n, dtype=np.int64)) // 20 - rng.integers(0, 30, n), 0)
    out["k"] = rng.integers(0, 40, n) * 7919 - 100
    out["v"] = rng.integers(-1000, 1000, n)
    return out


def chunks(index: int, executors: int):
    """Executor 0: a generator; the others: a list."""
    made = (chunk(i, index, n) for i, n in enumerate(SIZES))
    return made if index == 0 else list(made)


def whole(index: int, executors: int) -> np.ndarray:
    return np.concatenate([chunk(i, index, n) for i, n in enumerate(SIZES)])


def flow(sink, late) -> Dataflow:
    f = Dataflow("chunked")
    f.source("r", SCHEMA, time="t", max_delay=10).window(Tumbling(ms=50), late=late).sum(
        "v", key="k", output="total").sink(sink, name="out")
    return f


def run(make, **options):
    sink, late = Collect(), Collect()
    result = slashrt.run(flow(sink, late), {"r": PerExecutor(make)}, **RING, **options)
    return np.sort(sink.records), np.sort(late.records), result


@pytest.mark.parametrize("options", [
    pytest.param({}, id="one-executor"),
    pytest.param({"executors": 2, "transport": "shm"}, id="2-shm"),
    pytest.param({"executors": 3, "transport": "tcp"}, id="3-tcp"),
])
def test_chunks_give_what_the_same_records_as_one_array_give(options):
    out, late, result = run(chunks, **options)
    want_out, want_late, want = run(whole, **options)
    assert len(late) and len(out) > 100  # late records, across chunk boundaries, are judged alike
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(late, want_late)
    assert result.late_records == want.late_records


def test_a_list_of_chunks_on_one_executor():
    out, late, _ = run(lambda i, n: list(chunks(i, n)))
    want_out, want_late, _ = run(whole)
    np.testing.assert_array_equal(out, want_out)
    np.testing.assert_array_equal(late, want_late)


CHUNK = 5000  # records per chunk: tens of rings
IN_FLIGHT = (RING["slots"] + 1) * RING["slot_size"] // SCHEMA.dtype.itemsize  # records a ring and a batch hold at most


class Made:
    """The chunks of an endless stream, counting what was made ahead of what was fed whole."""

    def __init__(self):
        self.seen = 0  # records the dataflow has seen
        self.made: list[int] = []  # chunk indices made, in order
        self.ahead: list[int] = []  # at each chunk made: chunks made minus chunks the dataflow saw whole
        self.stop = StopHandle()

    def make(self, index: int) -> np.ndarray:
        self.made.append(index)
        # a chunk is fed whole once its last records are in the ring (or being handled): those
        # are not seen yet, so what the ring and one batch hold counts as seen
        self.ahead.append(len(self.made) - (self.seen + IN_FLIGHT) // CHUNK)
        if len(self.made) == 40:
            self.stop.request()  # from the worker thread making the chunks
        out = np.zeros(CHUNK, SCHEMA.dtype)
        out["t"] = (index * CHUNK + np.arange(CHUNK, dtype=np.int64)) // 100
        out["k"] = np.arange(CHUNK) % 13
        out["v"] = index
        return out

    def endless(self, index: int, executors: int):
        for i in itertools.count():  # drained eagerly, it would never end (nor fit in memory)
            yield self.make(i)


class Sequence:
    """The same chunks as a sequence (`len` and `[i]`), `count` of them."""

    def __init__(self, made: Made, count: int):
        self.made, self.count = made, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> np.ndarray:
        return self.made.make(index)


def counting_flow(made: Made, sink) -> Dataflow:
    def observe(batch):
        made.seen += len(batch)
        return batch

    f = Dataflow("endless")
    f.source("r", SCHEMA, time="t").apply(observe).window(Tumbling(ms=1000)).sum("v", key="k", output="total").sink(
        sink, name="out")
    return f


def test_an_endless_generator_runs_in_bounded_memory_and_resumes_skipping_whole_chunks(tmp_path):
    made = Made()
    first = Collect(transactional=True)
    result = slashrt.run(counting_flow(made, first), {"r": PerExecutor(made.endless, deterministic=True)},
                         checkpoint_dir=tmp_path, stop=made.stop, **RING)
    assert result.savepoint is not None
    assert 40 <= len(made.made) <= 45, len(made.made)  # it stopped soon after the 40th chunk
    # made ahead of what was fed whole (its tail may still be in the ring): the chunk being fed, one waiting, one being made
    assert max(made.ahead) <= 3, made.ahead

    fed = len(made.made)
    made.made.clear()
    second = Collect(transactional=True)
    slashrt.run(counting_flow(made, second), {"r": PerExecutor(lambda i, n: Sequence(made, 60), deterministic=True)},
                checkpoint_dir=tmp_path, resume_from="latest", **RING)
    assert made.made[0] >= fed - 4 > 0 and made.made == list(range(made.made[0], 60))  # not made again before it

    reference = Collect()
    slashrt.run(counting_flow(Made(), reference), {"r": PerExecutor(lambda i, n: Sequence(Made(), 60))}, **RING)
    both = np.concatenate([first.records, second.records])
    np.testing.assert_array_equal(np.sort(both), np.sort(reference.records))


def _not_iterable(index, executors):
    return 5


def _bad_chunk(kind):
    def make(index, executors):
        yield chunk(0, index, 100)
        if kind == "list":
            yield [1, 2, 3]
        elif kind == "2-D":
            yield np.zeros((2, 3), SCHEMA.dtype)
        else:
            yield np.zeros(4, [("t", "<i8"), ("k", "<i8")])
    return make


@pytest.mark.parametrize("make,message", [
    (_not_iterable, r"^the PerExecutor input for source 'chunked.r': make returned int, not a numpy structured array nor "
                    r"an iterable of them \(chunks\)$"),
    (_bad_chunk("list"), r"^chunk 1 of the PerExecutor input for source 'chunked.r' is list, not a numpy structured "
                         r"array; it came after 1 whole chunks \(100 records\) were fed$"),
    (_bad_chunk("2-D"), r"^chunk 1 of the PerExecutor input for source 'chunked.r' must be 1-D, has shape \(2, 3\); "),
    (_bad_chunk("schema"), r"^chunk 1 of the PerExecutor input for source 'chunked.r': missing field 'v' "),
])
def test_bad_returns_are_refused_in_one_sentence_naming_the_source(make, message):
    with pytest.raises(SchemaError, match=message) as refused:
        run(make)
    assert "\n" not in str(refused.value)


def test_a_bad_chunk_on_a_cluster_fails_the_job_in_one_sentence():
    with pytest.raises(ClusterError, match=r"^SchemaError: chunk 1 of the PerExecutor input for source 'chunked.r' "
                                           r"must be 1-D, has shape \(2, 3\); .* \(on executor \d\)$") as failed:
        run(_bad_chunk("2-D"), executors=2)
    assert "\n" not in str(failed.value)
