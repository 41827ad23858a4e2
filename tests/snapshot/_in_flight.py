"""What an unaligned cluster checkpoint holds in flight (its channel-state parts), counted in
input records: a source's ring holds records, one each; between executors an SSB delta row
stands for the records folded into it (its `count`: a key that repeats within an epoch's
fragment is one row), an UpPar exchange's rows are records, one each."""

from slashrt.snapshot.channel_state import CHANNEL_KIND


def in_flight(checkpoint, sources=True) -> int:
    """Records in flight in the sources' rings (`sources`), or else between executors: on the
    peers' channels and in the SSB shippers' queues (a delta row counts the records folded into it)."""
    flying = 0
    for state in checkpoint.states.values():
        if state.meta.get("kind") == CHANNEL_KIND and (state.meta["source"] in checkpoint.meta["sources"]) == sources:
            records = state.arrays["records"]
            flying += int(records["count"].sum()) if "epoch" in records.dtype.names else len(records)
    return flying
