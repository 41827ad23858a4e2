"""Each executor's channel memory within one budget (`channel_budget`), whatever the executor count.

An executor holds the rings of its sources (`slots` x `slot_size` each) and, for every peer,
the progress bus's ring and one ring per exchange, at each end of the channel where the
transport keeps one there: tcp's sender stages its buffers in a ring of its own and verbs' sender
posts from registered slots, while shared memory has one ring per channel, counted at its
receiver. The sources' and the progress bus's rings are fixed; the exchanges' rings share what
is left of the budget, each as many slots as fit, at most `EXCHANGE_SLOTS` and at least
`MIN_EXCHANGE_SLOTS` (a receiver returns credits a quarter of its ring at a time: with fewer
slots the sender waits for each). So rings shrink as the cluster grows, and a budget that cannot
give every exchange ring its least is refused before anything starts.
"""

from __future__ import annotations

from slashrt.cluster._progress import PROGRESS_RING
from slashrt.errors import OptionError

__all__ = ["DEFAULT_CHANNEL_BUDGET", "EXCHANGE_SLOTS", "MIN_EXCHANGE_SLOTS", "exchange_slots", "ring_ends"]

DEFAULT_CHANNEL_BUDGET = 128 << 20
EXCHANGE_SLOTS = 32  # an exchange ring's slots when the budget has room (2 MiB of 64 KiB slots)
MIN_EXCHANGE_SLOTS = 4


def ring_ends(transport: str) -> int:
    """How many of a channel's two ends hold a ring of its size on `transport`."""
    return 1 if transport in ("shm", "inproc") else 2


def exchange_slots(budget: int, *, executors: int, exchanges: int, source_bytes: int, slot_size: int,
                   transport: str) -> int:
    """Slots of every exchange ring of an executor among `executors`, with `exchanges` exchanges
    and `source_bytes` of source rings, so that its channels hold at most `budget` bytes."""
    peers = executors - 1
    if budget < 1:
        raise OptionError(f"channel_budget must be a positive number of bytes, got {budget}")
    ends = ring_ends(transport)
    progress = peers * ends * PROGRESS_RING.ring_bytes
    room = budget - source_bytes - progress
    if not exchanges or not peers:
        slots = EXCHANGE_SLOTS
    else:
        slots = min(EXCHANGE_SLOTS, max(room, 0) // (peers * exchanges * ends * slot_size))
    if room < 0 or slots < MIN_EXCHANGE_SLOTS:
        least = source_bytes + progress + peers * exchanges * ends * MIN_EXCHANGE_SLOTS * slot_size
        raise OptionError(
            f"channel_budget={budget} bytes cannot hold an executor's rings on {executors} executors over {transport}: "
            f"they need at least {least} bytes ({source_bytes} for its sources' rings, {progress} for the progress "
            f"bus's, and {MIN_EXCHANGE_SLOTS} slots of {slot_size} bytes per ring of its {exchanges} exchange(s) to "
            f"each of {peers} peers): give a larger channel_budget, or a smaller slot_size or slots"
        )
    return int(slots)
