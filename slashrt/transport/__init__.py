"""Channels: one ring protocol (`_channel`), one module per medium.

This package imports nothing from slashrt.ops or slashrt.ssb: operators and state sit above it.
"""

from slashrt.transport._channel import Buffer, DataRun, NoCredit, Receiver, RingSpec, Sender
from slashrt.transport.inproc import open_inproc_channel

__all__ = ["Buffer", "DataRun", "NoCredit", "Receiver", "RingSpec", "Sender", "open_inproc_channel"]
