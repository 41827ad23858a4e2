"""Exchange: a stream leaving this executor through a channel, to be a source elsewhere.

`ChannelSink(sender, schema)` is a sink that sends every batch, watermark and the end of the
stream into a channel, so the executor on the other end (another process or host, any
transport) receives a proper stream: its source sees the same records, the same watermarks
and END_OF_STREAM. It is the building block for splitting a dataflow across executors.
"""

from __future__ import annotations

import numpy as np
import structlog
import trio

from slashrt._batch import Batch
from slashrt._buffer import Control
from slashrt._logging import level_name
from slashrt._schema import Schema
from slashrt.ops._node import Node
from slashrt.progress import Frontier
from slashrt.progress.frontier import END_TIME
from slashrt.transport import Sender

__all__ = ["ChannelSink", "FrontierGate", "Inbound", "END_TIME"]

log = structlog.get_logger("slashrt.progress")


class ChannelSink:
    default_name = "exchange"

    def __init__(self, sender: Sender, schema: Schema):
        if sender.spec.record_size not in (None, schema.record_size):
            raise ValueError(
                f"channel carries {sender.spec.record_size}-byte records, the schema {schema.record_size}-byte ones"
            )
        self.sender = sender
        self.schema = schema
        self.dtype = schema.dtype  # SinkNode packs batches into this layout

    def open(self) -> None:
        pass

    def write(self, records: np.ndarray) -> None:
        raise TypeError("ChannelSink sends asynchronously: use it as a dataflow sink")

    async def awrite(self, records: np.ndarray) -> None:
        await self.sender.send_records(records)

    async def awatermark(self, watermark: int) -> None:
        await self.sender.send_control(Control.WATERMARK, watermark)

    async def aend(self) -> None:
        await self.sender.aclose()

    def close(self) -> None:
        pass


class FrontierGate:
    """Where the streams of several executors meet one operator: it forwards the minimum of
    their watermarks (a `Frontier`), and the end of the stream once every one has ended.

    `target` is a node (a window's merged state, or a window fed by repartitioned records).
    Forwarding is serialised: two compute lanes may advance the gate, a window fires once."""

    def __init__(self, target: Node, frontier: Frontier):
        self.target = target
        self.frontier = frontier
        self._lock = trio.Lock()
        self._debug = level_name() == "debug"  # where is it stuck: a line per move at debug level

    async def advance(self, source: int, watermark: int) -> None:
        async with self._lock:
            if not self.frontier.advance(source, watermark):
                return
            low = self.frontier.low
            if self._debug:
                entries = self.frontier.entries
                log.debug("gate frontier moved", step=self.target.step_id, low=low, watermarks=list(entries),
                          lowest=[j for j, t in enumerate(entries) if t == low])
            if low == END_TIME:
                await self.target.on_end()
            else:
                await self.target.on_watermark(low)


class Inbound(Node):
    """The root of a pipeline fed by another executor's channel: batches go to `on_batch`,
    the channel's watermarks and end of stream to the gate as source `source`."""

    def __init__(self, step_id: str, source: int, on_batch, gate: FrontierGate):
        super().__init__(f"{step_id}.from{source}")
        self.source = source
        self.on_batch = on_batch
        self.gate = gate

    async def push(self, batch: Batch) -> None:
        await self.on_batch(self.source, batch)

    async def on_watermark(self, watermark: int) -> None:
        await self.gate.advance(self.source, watermark)

    async def on_end(self) -> None:
        await self.gate.advance(self.source, END_TIME)
