"""What an unaligned cluster checkpoint holds in flight (its channel-state parts), counted in
input records: a source's ring holds records, one each; between executors an SSB partial row
stands for the records folded into it (its `count`: a key that repeats within a fragment is one
row), an UpPar exchange's rows are records, one each."""

from slashrt.snapshot.channel_state import CHANNEL_KIND
from slashrt.ssb.graph_window import is_partial


def in_flight(checkpoint, sources=True) -> int:
    """Records in flight in the sources' rings (`sources`), or else between executors: on the
    peers' channels and in the exchanges' ship queues (a partial row counts the records folded into it)."""
    flying = 0
    for state in checkpoint.states.values():
        if state.meta.get("kind") == CHANNEL_KIND and (state.meta["source"] in checkpoint.meta["sources"]) == sources:
            records = state.arrays["records"]
            flying += int(records["count"].sum()) if is_partial(records) else len(records)
    return flying


# In mode "slash" partial rows cross only when a window's fragments are due or an epoch ends: a
# window over the whole stream has rows on their way mid-run with epochs this short, folded (a
# key repeated within an epoch is one row, of a count above one)
SHIPPING_EPOCHS = {"epoch_bytes": 1 << 16, "ssb_routing": "fragments"}
