"""In-flight channel state of an unaligned checkpoint (Flink's FLIP-76 idea, on one executor, and
on each executor of a cluster for its sources' rings and its peers' channels:
`AgentCheckpointing._overtake_sources`, `_overtake_peers`).

An aligned barrier travels in band behind every buffer already in its ring, so under
backpressure (a slow step after the source, full rings) checkpoint n waits for the ring's whole
backlog to be computed. An unaligned checkpoint overtakes that backlog: it is taken at once,
between two batches, and what each source had posted that the executor had not computed yet
(the buffers in front of barrier n: polled and waiting, or still in the ring's slots) is copied
out as that source's channel state, a part of n beside the operators' states:

    source ──[ w3 r5 r4 | r3 r2 r1 ]──► executor (state: everything before r1)
              posted after   in flight: copied as channel state (records and watermarks,
              the snapshot   in order); the source's position is after r3 (or at barrier n,
                             if the source had sent it: then only what is in front of it)

Recovery restores the operators, then each source posts its channel state into its ring first
(`replay`, the same records and watermarks in the same order), then feeds on from its position:
the executor consumes exactly the stream it would have. Ring contents are copied as whole
arrays (one copy per run of buffers), never record by record.

A channel from a peer executor is cut at its barrier n, which must be in the receiver's ring
(`reaches`): what is in front of it is the receiver's channel state, computed first on a resume
(`replay_into`: the peer cannot post it again). An exchange queues rows to ship before the
ring; barrier n overtakes them too, and they are the sender's channel state
(`slashrt.ops.route.ExchangeNode.overtake`), shipped again first on a resume. On another
executor count, what was in flight between executors goes to its keys' new owners
(`slashrt.snapshot.rescale.graph_in_flight`).
"""

from __future__ import annotations

import re

import numpy as np

from slashrt._batch import Batch
from slashrt._buffer import Control
from slashrt.snapshot.operators import check, tagged
from slashrt.snapshot.state_format import State
from slashrt.transport import DataRun

__all__ = [
    "CHANNEL_KIND", "EXCHANGE_CHANNEL", "capture", "part_name", "reaches", "replay", "replay_into",
    "restored", "to_state",
]

CHANNEL_KIND, CHANNEL_VERSION = "channel_state", 1
SUFFIX = ".channel"  # of a channel-state part's step name
DATA, WATERMARK = 0, 1


def part_name(source: str) -> str:
    """The part holding source `source`'s channel state."""
    return f"{source}{SUFFIX}"


def capture(items, receiver, dtype: np.dtype, n: int) -> tuple[list, bool]:
    """The in-flight segments of one input, from `items` (the executor's unconsumed buffers of
    it, oldest first: `Executor.unconsumed`) up to barrier n: [(DATA, records copy) |
    (WATERMARK, value)], and whether barrier n was among them (the source sent it: its position
    is the one it recorded then). Older barriers are dropped; the end of the stream ends it (the
    restored source sends its end again)."""
    segments: list = []
    for item in items:
        if item is None:  # the channel failed after the buffers before this marker
            break
        if isinstance(item, DataRun):
            records = receiver.run_records(item, dtype).reshape(-1).copy()
        elif not item.is_control:
            records = item.records(dtype).copy()
        else:
            ctype, value, _ = item.control()
            if ctype is Control.BARRIER and value >= n:
                return segments, True
            if ctype is Control.WATERMARK:
                segments.append((WATERMARK, value))
            elif ctype is Control.END_OF_STREAM:
                break
            continue
        segments.append((DATA, records))
    return segments, False


def reaches(items, n: int) -> bool:
    """Whether barrier n (or a newer one) is among `items` (as `capture` would find it), without
    copying anything: a peer's channel is overtaken only once its barrier is in the ring."""
    for item in items:
        if item is None:
            return False
        if isinstance(item, DataRun) or not item.is_control:
            continue
        ctype, value, _ = item.control()
        if ctype is Control.BARRIER and value >= n:
            return True
        if ctype is Control.END_OF_STREAM:
            return False
    return False


def to_state(source: str, n: int, segments: list, dtype: np.dtype) -> State:
    """Channel state as a part: the records of every data segment in one array, each segment's
    kind and value (its record count, or the watermark)."""
    data = [records for kind, records in segments if kind == DATA]
    kinds = np.array([kind for kind, _ in segments], np.int8)
    values = np.array([len(v) if kind == DATA else v for kind, v in segments], np.int64)
    records = np.concatenate(data) if data else np.empty(0, dtype)
    return tagged(CHANNEL_KIND, CHANNEL_VERSION, {"records": records, "kinds": kinds, "values": values},
                  source=source, checkpoint=n, segments=len(segments))


def restored(state: State, step_id: str) -> tuple[str, list]:
    """(source, segments) of a channel-state part."""
    meta = check(state, step_id, CHANNEL_KIND, CHANNEL_VERSION)
    records, segments, at = state.arrays["records"], [], 0
    for kind, value in zip(state.arrays["kinds"].tolist(), state.arrays["values"].tolist()):
        if kind == DATA:
            segments.append((DATA, records[at:at + value]))
            at += value
        else:
            segments.append((WATERMARK, value))
    return meta["source"], segments


async def replay_into(pipeline, segments: list) -> None:
    """Compute a restored channel state of a channel from a peer executor (which cannot post
    it again) through its pipeline, before anything new arrives on that channel."""
    for kind, value in segments:
        if kind == DATA:
            await pipeline.push(Batch(value))
        else:
            await pipeline.on_watermark(value)


async def replay(sender, segments: list) -> None:
    """Post a restored channel state into the source's channel, before anything new."""
    for kind, value in segments:
        if kind == DATA:
            await sender.send_records(value)
        else:
            await sender.send_control(Control.WATERMARK, value)


# a peer channel's part: <window>[.route].from<i> (the receiver's ring) or .to<j> (the sender's queue)
EXCHANGE_CHANNEL = re.compile(r"^(?P<window>.+?)(?P<route>\.route)?\.(?P<way>from|to)(?P<peer>\d+)$")
