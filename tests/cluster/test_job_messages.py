"""What the coordinator sends its executors (`cluster._job`): the part every job shares is
pickled and compressed once per run, each message adds the executor's own part and gives the
agent its job back."""

import numpy as np
import pytest

from slashrt import Dataflow, Schema, Tumbling
from slashrt.cluster._job import JobMessages, job_message, job_of, Job
from slashrt.errors import ChannelClosed
from slashrt.ops.sinks import Collect

SCHEMA = Schema({"t": "i8", "k": "i8"})


def flow() -> Dataflow:
    f = Dataflow("jobs")
    f.source("a", SCHEMA, time="t").filter(lambda b: b["k"] % 3 == 0).window(Tumbling(ms=10)).count(key="k").sink(Collect())
    return f


def test_every_message_carries_the_one_shared_part_and_gives_its_executors_job_back():
    messages = JobMessages(1.0, 5.0, flow=flow(), executors=3, transport="tcp", mode="uppar", partitions=64,
                           epoch_bytes=1 << 20, options={"slots": 8}, checkpoint=None)
    shares = [{"a": np.arange(i + 1, dtype=np.int64)} for i in range(3)]
    sent = [messages.message(i, shares[i], f"10.0.0.{i}") for i in range(3)]
    assert all(m["shared"] is messages.shared for m in sent)  # built once, not once per executor
    assert len(messages.shared) < messages.shared_raw_bytes
    for i, message in enumerate(sent):
        job = job_of(message)
        assert (job.index, job.executors, job.transport, job.mode, job.partitions, job.host) == (
            i, 3, "tcp", "uppar", 64, f"10.0.0.{i}")
        assert job.options == {"slots": 8} and job.checkpoint is None and job.flow.name == "jobs"
        np.testing.assert_array_equal(job.inputs["a"], shares[i]["a"])


def test_one_jobs_message_round_trips():
    job = Job(flow(), 2, 4, {"a": np.zeros(3, SCHEMA.dtype)}, host="10.1.1.1", checkpoint={"keep": 2})
    back = job_of(job_message(job, 1.0, 5.0))
    assert (back.index, back.executors, back.host, back.checkpoint) == (2, 4, "10.1.1.1", {"keep": 2})


@pytest.mark.parametrize("part", ["shared", "own"])
def test_a_damaged_part_is_one_sentence(part):
    message = job_message(Job(flow(), 0, 1, {}), 1.0, 5.0)
    message[part] = message[part][: len(message[part]) // 2]
    with pytest.raises(ChannelClosed, match="^the coordinator's job message holds no job: "):
        job_of(message)
