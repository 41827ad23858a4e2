"""Each executor's channel memory within one budget (`channel_budget`), whatever the executor count.

An executor holds the rings of its sources (`slots` x `slot_size` each) and, for every peer,
the progress bus's ring and its exchanges' slots, at each end of a channel where the transport
keeps slots there: tcp's sender stages its buffers in a ring of its own and verbs' sender posts
from registered slots, while shared memory has its slots at the receiver only. The sources' and
the progress bus's rings are fixed; the exchanges share what is left of the budget.

An exchange's channels into one executor share a slot pool (`transport._pool`,
Flink's exclusive and floating buffers): each channel holds `exclusive` slots (its sender's
staging ring has as many), and `floating` slots per exchange are lent to the channels with a
backlog, at most `max_lent` to one, so that a busy channel still gets `EXCHANGE_SLOTS` when
the others idle. The exclusive slots are half of what a static ring would get from the budget
(at least `MIN_EXCHANGE_SLOTS`: a receiver returns credits a quarter of its slots at a time,
and with fewer the sender waits for each), the floating ones the rest, never more than every
channel could borrow. So the memory per executor stays within the budget as the cluster grows,
and a budget that cannot give every channel its least is refused before anything starts.
"""

from __future__ import annotations

import attrs

from slashrt.cluster._progress import PROGRESS_RING
from slashrt.errors import OptionError

__all__ = ["DEFAULT_CHANNEL_BUDGET", "EXCHANGE_SLOTS", "MIN_EXCHANGE_SLOTS", "POOLED_TRANSPORTS", "ExchangeSlots",
           "exchange_slots", "ring_ends"]

DEFAULT_CHANNEL_BUDGET = 128 << 20
EXCHANGE_SLOTS = 32  # the most slots an exchange channel holds (2 MiB of 64 KiB slots)
MIN_EXCHANGE_SLOTS = 4
POOLED_TRANSPORTS = ("shm", "tcp", "verbs")  # whose exchange channels share a slot pool at their receiver


@attrs.frozen
class ExchangeSlots:
    """The slots of an executor's exchange channels: `exclusive` per channel (a ring's, or a
    pooled channel's own), and per exchange `floating` more that its channels borrow, at most
    `max_lent` each (0: rings)."""

    exclusive: int
    floating: int = 0
    max_lent: int = 0

    def bytes(self, *, peers: int, exchanges: int, ends: int, slot_size: int) -> int:
        """What they hold at one executor of `peers` peers."""
        return exchanges * slot_size * (peers * self.exclusive * ends + self.floating)


def ring_ends(transport: str) -> int:
    """How many of a channel's two ends hold a ring of its size on `transport`."""
    return 1 if transport in ("shm", "inproc") else 2


def exchange_slots(budget: int, *, executors: int, exchanges: int, source_bytes: int, slot_size: int,
                   transport: str) -> ExchangeSlots:
    """The slots of every exchange channel of an executor among `executors`, with `exchanges`
    exchanges and `source_bytes` of source rings, so that its channels hold at most `budget` bytes."""
    peers = executors - 1
    if budget < 1:
        raise OptionError(f"channel_budget must be a positive number of bytes, got {budget}")
    ends = ring_ends(transport)
    progress = peers * ends * PROGRESS_RING.ring_bytes
    room = budget - source_bytes - progress
    if not exchanges or not peers:
        share = EXCHANGE_SLOTS
    else:
        share = min(EXCHANGE_SLOTS, max(room, 0) // (peers * exchanges * ends * slot_size))
    if room < 0 or share < MIN_EXCHANGE_SLOTS:
        least = source_bytes + progress + peers * exchanges * ends * MIN_EXCHANGE_SLOTS * slot_size
        raise OptionError(
            f"channel_budget={budget} bytes cannot hold an executor's rings on {executors} executors over {transport}: "
            f"they need at least {least} bytes ({source_bytes} for its sources' rings, {progress} for the progress "
            f"bus's, and {MIN_EXCHANGE_SLOTS} slots of {slot_size} bytes per channel of its {exchanges} exchange(s) "
            f"from each of {peers} peers): give a larger channel_budget, or a smaller slot_size or slots"
        )
    if transport not in POOLED_TRANSPORTS or not exchanges or not peers:
        return ExchangeSlots(int(share))
    exclusive = max(MIN_EXCHANGE_SLOTS, share // 2)
    floating = min(room // (exchanges * slot_size) - peers * exclusive * ends, peers * (EXCHANGE_SLOTS - exclusive))
    return ExchangeSlots(int(exclusive), int(floating), int(min(floating, EXCHANGE_SLOTS - exclusive)))
