"""The progress wire format: every message of a graph survives encode/decode, whatever the
frame size, and every malformed input is one MalformedBuffer naming what is wrong."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slashrt.errors import MalformedBuffer
from slashrt.progress.reachability import Location
from slashrt.progress.timestamp import MAX_EPOCH, MIN_EPOCH, Timestamp
from slashrt.progress.wire import HEADER_SIZE, SMALL_FRAME, ProgressCodec, row_size
from tests.progress._graphs import loop, nested_loops, pipeline

GRAPHS = {"pipeline": pipeline()[0], "loop": loop()[0], "nested": nested_loops()[0]}
FAST = settings(max_examples=60, derandomize=True, deadline=None)


def updates(graph):
    located = [loc for loc in graph.locations if loc in graph.depths]
    return st.sampled_from(located).flatmap(
        lambda loc: st.tuples(
            st.tuples(
                st.just(loc),
                st.builds(
                    Timestamp,
                    st.integers(MIN_EPOCH, MAX_EPOCH),
                    st.tuples(*[st.integers(0, 2**63 - 1)] * graph.depths[loc]),
                ),
            ),
            st.integers(-(2**63), 2**63 - 1).filter(bool),
        )
    )


def messages(max_size=80):
    return st.sampled_from(sorted(GRAPHS)).flatmap(
        lambda name: st.tuples(st.just(name), st.lists(updates(GRAPHS[name]), min_size=1, max_size=max_size))
    )


@FAST
@given(messages(), st.one_of(st.none(), st.integers(HEADER_SIZE + row_size(2), 2000)))
def test_decode_of_encode_is_the_message_whatever_the_frame_size(case, max_bytes):
    name, message = case
    codec = ProgressCodec(GRAPHS[name])
    frames = codec.encode(tuple(message), max_bytes)
    assert all(max_bytes is None or len(f) <= max_bytes for f in frames)
    assert codec.decode(b"".join(frames)) == tuple(message)
    # frames also decode one at a time, from a shared buffer, as the bus reads them
    joined, offset, got, more = b"".join(frames), 0, [], True
    while more:
        part, more, offset = codec.decode_frame(joined, offset)
        got += part
    assert tuple(got) == tuple(message) and offset == len(joined)


def test_a_message_outside_loops_costs_24_bytes_per_update():
    graph, n = pipeline()
    codec = ProgressCodec(graph)
    src = Location.output(n["source"])
    (frame,) = codec.encode((((src, Timestamp(1)), 1), ((src, Timestamp(0)), -1)))
    assert len(frame) == HEADER_SIZE + 2 * 24


def test_a_set_of_locations_is_enough_to_decode():
    graph, n = loop()
    codec = ProgressCodec(graph.locations)  # no depths known: any depth is taken
    body = Location.input(n["body"], 1)
    message = (((body, Timestamp(3, (1,))), 2),)
    assert codec.decode(codec.encode(message)[0]) == message


# --- malformed input --------------------------------------------------------------------------

GRAPH, NODES = loop()
CODEC = ProgressCodec(GRAPH)
BODY_IN = Location.input(NODES["body"], 1)
GOOD = (((BODY_IN, Timestamp(7, (2,))), 1), ((BODY_IN, Timestamp(6, (1,))), -1))
HEADER = struct.Struct("<HBBHH")
ROW = struct.Struct("<IHBBqqq")  # width 1


def frame(rows, *, magic=0x4750, version=1, flags=0, width=1, count=None):
    return HEADER.pack(magic, version, flags, width, len(rows) if count is None else count) + b"".join(
        ROW.pack(*r) for r in rows
    )


def good_row(**changes):
    row = dict(node=BODY_IN.node, port=BODY_IN.port, kind=0, depth=1, epoch=7, delta=1, counter=2)
    row.update(changes)
    return tuple(row.values())


BAD_ROWS = {
    "kind": (good_row(kind=2), "kind 2 is neither 0 (in) nor 1 (out)"),
    "depth": (good_row(depth=2), "depth 2 exceeds the frame's 1 counter columns"),
    "negative counter": (good_row(counter=-3), "negative"),
    "padding": (good_row(depth=0), "counter columns beyond depth 0 are not 0"),
    "too shallow": (good_row(depth=0, counter=0), "a timestamp with 0 loop counters at body.in1, which sits inside 1 loops"),
    "zero delta": (good_row(delta=0), "delta 0"),
    "unknown node": (good_row(node=99), "node 99 input port 1 is not a location of the graph"),
    "unknown port": (good_row(port=7), "input port 7 is not a location of the graph"),
    "wrong depth": (good_row(node=NODES["sink"], port=0), "at sink.in0, which sits inside 0 loops"),
}


@pytest.mark.parametrize("rows_before", [0, 1, SMALL_FRAME + 3], ids=["first", "second", "large frame"])
@pytest.mark.parametrize("what", sorted(BAD_ROWS))
def test_a_bad_row_is_named(what, rows_before):
    bad, words = BAD_ROWS[what]
    data = frame([good_row()] * rows_before + [bad])
    with pytest.raises(MalformedBuffer, match="update") as info:
        CODEC.decode(data)
    assert words in str(info.value) and f"update {rows_before}:" in str(info.value)


def test_padding_counters_must_be_zero():
    data = HEADER.pack(0x4750, 1, 0, 2, 1) + struct.pack("<IHBBqqqq", *good_row()[:6], 2, 5)
    with pytest.raises(MalformedBuffer, match="counter columns beyond depth 1 are not 0"):
        CODEC.decode(data)


@pytest.mark.parametrize(
    "data, words",
    [
        (b"", "truncated: 0 bytes, a frame header needs 8"),
        (frame([good_row()])[:5], "truncated: 5 bytes"),
        (frame([good_row()])[:-1], "announces 1 updates (40 bytes), 39 bytes arrived"),
        (frame([good_row()], count=3), "announces 3 updates"),
        (frame([good_row()], magic=0x1234), "not a progress message: magic 0x1234"),
        (frame([good_row()], version=2), "wire version 2; this slashrt reads version 1"),
        (frame([good_row()], flags=4), "unknown flags 0x04"),
        (frame([]), "holds no update"),
        (frame([good_row()], flags=1), "last frame says more frames follow"),
        (frame([good_row()]) + b"\0", "1 bytes after its last frame"),
    ],
    ids=["empty", "short header", "short row", "count too large", "magic", "version", "flags", "no rows", "no last frame", "trailing"],
)
def test_a_bad_frame_is_named(data, words):
    with pytest.raises(MalformedBuffer, match="progress message") as info:
        CODEC.decode(data)
    assert words in str(info.value)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 200), st.binary(min_size=1, max_size=8))
def test_any_corruption_is_a_malformed_buffer_or_a_valid_message(noise, at, patch):
    """Random bytes, or a good message with bytes overwritten: never another exception."""
    good = b"".join(CODEC.encode(GOOD))
    corrupt = bytearray(good)
    corrupt[at % len(good) : at % len(good) + len(patch)] = patch
    for data in (noise, bytes(corrupt), good[: at % len(good)]):
        try:
            message = CODEC.decode(data)
        except MalformedBuffer:
            continue
        assert all(GRAPH.depths[loc] == t.depth and delta for (loc, t), delta in message)


def test_encode_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match="empty progress message"):
        CODEC.encode(())
    with pytest.raises(ValueError, match="cannot hold one update"):
        CODEC.encode(GOOD, max_bytes=HEADER_SIZE + 10)
    with pytest.raises(ValueError, match="does not fit the wire format"):
        CODEC.encode((((BODY_IN, Timestamp(0, (1,))), 2**64),))
