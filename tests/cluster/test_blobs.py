"""Large parts of the agents' messages go to a blob store once (`cluster._blobs`): agents read
them, check them and cache them; a damaged blob fails the job in one sentence; the run's blobs
are gone when it ends."""

import hashlib
import os
import tempfile

import numpy as np
import pytest

import slashrt
from slashrt import Dataflow, Schema
from slashrt.cluster import _blobs
from slashrt.cluster._blobs import BlobCache, BlobRef, RunBlobs, fetch
from slashrt.errors import ChannelClosed, ClusterError, DataflowError
from slashrt.ops.sinks import Collect

SCHEMA = Schema({"t": "i8", "k": "i8"})
TABLE = np.random.default_rng(3).integers(0, 256, 2_000_000, dtype=np.uint8)  # 2 MB that do not compress


def lookup_flow(out: Collect) -> Dataflow:
    """A filter whose function captures TABLE: every executor's job carries 2 MB."""
    table = TABLE.copy()
    flow = Dataflow("lookup")
    flow.source("a", SCHEMA, time="t").filter(lambda b: table[b["k"]] % 2 == 1).sink(out)
    return flow


def records(n: int) -> np.ndarray:
    r = np.zeros(n, SCHEMA.dtype)
    r["t"] = np.arange(n)
    r["k"] = np.random.default_rng(4).integers(0, TABLE.size, n)
    return r


def test_a_small_part_stays_inline_and_a_large_one_is_written_once_and_read_back(tmp_path):
    blobs = RunBlobs(tmp_path, offload_min_bytes=100)
    assert blobs.offload(b"x" * 99) == b"x" * 99 and blobs.location is None  # nothing made for it
    data = os.urandom(1000)
    ref = blobs.offload(data)
    assert isinstance(ref, BlobRef) and ref.key == hashlib.sha256(data).hexdigest() and ref.size == 1000
    assert os.path.dirname(ref.url) == blobs.location and blobs.location.startswith(str(tmp_path))
    assert fetch(ref) == data and blobs.offloaded == 1000
    blobs.remove()
    assert os.listdir(tmp_path) == []


def test_a_file_url_store_works_as_a_directory(tmp_path):
    blobs = RunBlobs(f"file://{tmp_path}", offload_min_bytes=1)
    ref = blobs.offload(b"abc")
    assert ref.url.startswith("file://") and BlobCache().get(ref) == b"abc"
    blobs.remove()
    assert os.listdir(tmp_path) == []


def test_a_damaged_or_missing_blob_is_one_sentence(tmp_path):
    blobs = RunBlobs(tmp_path, offload_min_bytes=1)
    ref = blobs.offload(b"the job")
    with open(ref.url, "r+b") as f:
        f.write(b"THE")
    with pytest.raises(ChannelClosed, match=r"^the job's blob .* is damaged: its 7 bytes do not hash to its name$"):
        BlobCache().get(ref)
    os.remove(ref.url)
    with pytest.raises(ChannelClosed, match=r"^cannot read the job's blob .*No such file"):
        BlobCache().get(ref)


def test_the_cache_keeps_the_most_recently_used_blobs_within_its_bytes(tmp_path):
    blobs = RunBlobs(tmp_path, offload_min_bytes=1)
    a, b, c = (blobs.offload(bytes([i]) * 100) for i in range(3))
    cache = BlobCache(max_bytes=250)
    cache.get(a), cache.get(b), cache.get(a)  # a used last
    cache.get(c)  # b goes
    assert cache.reads == 3 and len(cache) == 2
    blobs.remove()  # what is cached is read from the cache, not the store
    assert cache.get(a) == bytes([0]) * 100 and cache.get(c) == bytes([2]) * 100 and cache.reads == 3
    with pytest.raises(ChannelClosed, match="cannot read"):
        cache.get(b)


def test_a_store_that_cannot_be_made_is_refused_in_one_sentence(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(DataflowError, match="cannot make a directory in the blob store"):
        RunBlobs(tmp_path / "file", offload_min_bytes=1).offload(b"xy")
    with pytest.raises(DataflowError, match="offload_min_bytes=0 must be positive"):
        RunBlobs(tmp_path, offload_min_bytes=0)


@pytest.mark.parametrize("executors", [2, 3])
def test_a_job_carrying_a_large_table_reaches_its_executors_through_the_store(tmp_path, executors):
    out, seen = Collect(), []
    data = records(200_000)

    def ready(_targets):  # the agents have their jobs: the blob is in the run's directory
        seen.extend(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(tmp_path) for f in files)

    slashrt.run(lookup_flow(out), {"a": data}, executors=executors, blob_store=tmp_path,
                offload_min_bytes=64 << 10, on_ready=ready)
    expected = data[TABLE[data["k"]] % 2 == 1]
    np.testing.assert_array_equal(np.sort(out.records, order="t"), expected)
    assert len(seen) == 1 and seen[0] > TABLE.nbytes  # the shared part, once
    assert os.listdir(tmp_path) == []  # the run's blobs are removed with it


def test_local_executors_use_a_temporary_store_by_default(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out, seen = Collect(), []
    data = records(50_000)
    slashrt.run(lookup_flow(out), {"a": data}, executors=2,
                on_ready=lambda _: seen.extend(p.name for p in tmp_path.glob("slashrt-blobs-*/*")))
    np.testing.assert_array_equal(np.sort(out.records, order="t"), data[TABLE[data["k"]] % 2 == 1])
    assert len(seen) == 1 and list(tmp_path.glob("slashrt-blobs-*")) == []


def test_a_blob_damaged_before_the_agents_read_it_fails_the_job_naming_it(tmp_path, monkeypatch):
    offload = RunBlobs.offload

    def damaging(self, data):
        ref = offload(self, data)
        if isinstance(ref, BlobRef):
            with open(ref.url, "r+b") as f:
                f.write(b"\0" * 16)
        return ref

    monkeypatch.setattr(RunBlobs, "offload", damaging)
    with pytest.raises(ClusterError, match=r"the job's blob .* is damaged: its \d+ bytes do not hash to its name"):
        slashrt.run(lookup_flow(Collect()), {"a": records(1000)}, executors=2, blob_store=tmp_path)
    assert os.listdir(tmp_path) == []


def test_blob_options_are_refused_on_one_executor():
    with pytest.raises(DataflowError, match="blob_store= is an option of multi-executor runs"):
        slashrt.run(lookup_flow(Collect()), {"a": records(10)}, blob_store="/tmp")


def test_an_agent_caches_a_blob_across_reads(tmp_path, monkeypatch):
    cache = BlobCache()
    monkeypatch.setattr(_blobs, "CACHE", cache)
    ref = RunBlobs(tmp_path, offload_min_bytes=1).offload(b"shared part")
    assert fetch(ref) == fetch(ref) == b"shared part" and cache.reads == 1
