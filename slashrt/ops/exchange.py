"""Exchange: a stream leaving this executor through a channel, to be a source elsewhere.

`ChannelSink(sender, schema)` is a sink that sends every batch, watermark and the end of the
stream into a channel, so the executor on the other end (another process or host, any
transport) receives a proper stream: its source sees the same records, the same watermarks
and END_OF_STREAM. It is the building block for splitting a dataflow across executors.
"""

from __future__ import annotations

import numpy as np

from slashrt._buffer import Control
from slashrt._schema import Schema
from slashrt.transport import Sender

__all__ = ["ChannelSink"]


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
