"""An SSB window's epochs: when one ends, and how it routes its records (`ssb_routing`).

Every executor folds the records reaching a keyed window into its own fragments and ships
them to their keys' owners at each epoch's end (`slashrt.ssb.graph_window`). An epoch ends
every `epoch_bytes` of the window's input (`DEFAULT_EPOCH_BYTES`, as in the paper).

Where most records of an epoch carry keys new to it (a large key space), folding them into
fragments first saves nothing: every record would be inserted twice, once into the fragment
and once, shipped, into its owner's state. The window then routes records as they arrive
(*direct* routing). Under `routing="auto"` (the default) an epoch whose delta held at least
`DIRECT_AT` rows per input record switches the next epochs to direct routing, and direct
routing returns to fragments once fewer than `COMBINE_BELOW` of the own records it routed in
an epoch were keys new to their slice (`routes_directly`; an epoch of fewer than
`JUDGED_FROM` records keeps the routing; a folding epoch ends early once `SAMPLE_RECORDS`
records showed that keys do not repeat: `keys_unrepeated`). The CRDT join makes results
independent of the routing. `EpochStats` is what one executor's window did in one epoch
(`RunResult.epochs`).
"""

from __future__ import annotations

import attrs

from slashrt.errors import DataflowError

__all__ = ["DEFAULT_EPOCH_BYTES", "ROUTINGS", "JUDGED_FROM", "SAMPLE_RECORDS", "EpochStats", "check_routing",
           "keys_unrepeated", "routes_directly"]

DEFAULT_EPOCH_BYTES = 64 << 20  # as in the paper
ROUTINGS = ("auto", "fragments", "direct")
DIRECT_AT = 0.5  # auto: delta rows per input record from which the next epoch routes directly
COMBINE_BELOW = 0.25  # auto: share of new keys among direct own records below which fragments return
JUDGED_FROM = 256  # auto: an epoch of fewer input records keeps the routing (too few to tell whether keys repeat)
# auto: a folding epoch this long whose fragments hold DIRECT_AT entries per record ends
SAMPLE_RECORDS = 1 << 16


def check_routing(routing: str) -> str:
    if routing not in ROUTINGS:
        raise DataflowError(f"unknown SSB routing {routing!r}; choose one of {', '.join(ROUTINGS)}")
    return routing


def routes_directly(direct: bool, rows: int, records: int, own_records: int, own_new: int) -> bool:
    """`routing="auto"`: does the next epoch route records as they arrive, after an epoch of
    `records` input records that shipped `rows` partial rows (`direct`: routed them), of which
    `own_records` were of keys this executor owns, `own_new` of them new to their slice there?
    Fragments turn direct once an epoch's delta held at least `DIRECT_AT` rows per record;
    direct routing returns to fragments once fewer than `COMBINE_BELOW` of its own records
    were new keys. An epoch of fewer than `JUDGED_FROM` records (one a window's end cut short)
    changes nothing: 90 records of 50 keys would read as mostly new keys."""
    if records < JUDGED_FROM:
        return direct
    if direct:
        return not (own_records and own_new < COMBINE_BELOW * own_records)
    return rows >= DIRECT_AT * records


def keys_unrepeated(routing: str, direct: bool, records: int, entries) -> bool:
    """`routing="auto"`: does a folding epoch end now, at `records` input records whose
    fragments hold `entries()` (slice, key) entries (asked only past the sample)? Once it read
    `SAMPLE_RECORDS` of which at least `DIRECT_AT` per record were new entries, folding more
    saves nothing (the keys do not repeat): the epoch ends, and `routes_directly` turns the
    next one direct, instead of folding a whole window (a million records of distinct keys)
    first."""
    return routing == "auto" and not direct and records >= SAMPLE_RECORDS and entries() >= DIRECT_AT * records



@attrs.define
class EpochStats:
    """What one executor's operator did in one epoch."""

    epoch: int
    input_bytes: int  # bytes of the operator's input folded in this epoch
    keys_touched: int  # (slice, key) pairs changed in this epoch: the delta's rows (direct: rows routed)
    shipped_rows: int  # of them, rows sent to other leaders
    shipped_bytes: int
    watermark: int
    records: int = 0  # input records of this epoch
    direct: bool = False  # routed as they arrived, not folded into fragments first
    queued_peak: int = 0  # the most bytes of rows queued for the peers at once during the epoch
