"""NEXMark bids: the record layout of NEXMark's Bid stream as fixed-size slashrt records.

A bid is (auction, bidder, price, channel, date_time); NEXMark's `url` and `extra` strings are
left out, and the channel is a short fixed-width name. Generators live beside their users:
`slashrt.spark.generators.nexmark_bids` makes them on Spark.
"""

from __future__ import annotations

from slashrt._schema import Schema

__all__ = ["BID_SCHEMA", "CHANNELS"]

BID_SCHEMA = Schema(
    [
        ("auction", "<i8"),
        ("bidder", "<i8"),
        ("price", "<i8"),
        ("channel", "S8"),
        ("date_time", "<i8"),
    ]
)
assert BID_SCHEMA.record_size == 40
CHANNELS = (b"Google", b"Facebook", b"Baidu", b"Apple")
