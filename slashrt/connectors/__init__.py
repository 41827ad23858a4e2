"""Connectors: sources and sinks that talk to systems outside slashrt (a broker, files).

A connector source is an input object with an async ``feed(sender, spec, *, watermark_every,
resume=None, barriers=None)`` method: `slashrt.run` gives it an in-process channel for its
source (`spec`, a SourceSpec) and runs it beside the executor; it fills the channel
(`slashrt.ops.sources.ChannelFeeder`) and closes it at its end. One that sets ``rewinds = True``
takes part in checkpointed runs: its feeder records its position at each of the checkpoints'
`barriers`, and `resume` (that position, from the restored checkpoint) rewinds it
(`slashrt.ops.reads.feed_reads`). A connector sink is a sink object (open / write / close, see
`slashrt.sinks`), with a two-phase commit per checkpoint where it offers exactly-once.
On several executors the cluster coordinator asks a source for one reader per executor,
`for_executor(index, executors)`, each reading the part a stable rule over the number of
executors gives it (a FileSource's files, a RedisStream's entries) and recording its own
position; a source without that method is refused on several executors. A checkpoint of either
also resumes on another number of executors (`slashrt.snapshot.rescale`): a FileSource's files
are splits with offsets (`rescaled_starts`, `restarted`), and a RedisStream makes its new
readers from the old executors' recorded positions (`rescaled(positions, executors)`); any other
connector is refused there.

- `RedisStream`, `RedisStreamSink`: Redis Streams, records packed a batch an entry;
  `write_stream`, `end_stream`, `read_stream` put an array into a stream and read it back.
  They need the Python package redis (the extra ``slashrt[redis]``).
- `FileSource`: a directory, a file or a glob of Parquet, CSV or .npy files, read in order of
  their names, with a `FilePosition` to rewind to.
"""

from slashrt.connectors.files import FilePosition, FileSource
from slashrt.connectors.redis_sink import RedisStreamSink
from slashrt.connectors.redis_streams import RedisStream, end_stream, read_stream, write_stream
from slashrt.errors import ConnectorError

__all__ = [
    "ConnectorError",
    "FilePosition",
    "FileSource",
    "RedisStream",
    "RedisStreamSink",
    "end_stream",
    "read_stream",
    "write_stream",
]
