"""The public surface is deliberate: adding or removing a name must change this test too."""

import slashrt
import slashrt.connectors
import slashrt.sinks
import slashrt.testing
import slashrt.transport


def test_top_level_surface():
    assert sorted(slashrt.__all__) == sorted(
        [
            "Batch", "ChannelClosed", "ChannelFailed", "ConnectedStreams", "Context", "DataflowError", "Dataflow",
            "LatencyHistogram", "Loop", "MalformedBuffer", "Operator", "OperatorError", "Paced", "RunResult", "Schema", "SchemaError",
            "SlashError", "Sliding", "State", "StopHandle", "Stream", "Timestamp", "Tumbling", "WindowedStream", "configure_logging",
            "run", "run_async", "sinks",
        ]
    )
    for name in slashrt.__all__:
        assert getattr(slashrt, name) is not None


def test_every_exported_name_exists():
    for module in (slashrt, slashrt.connectors, slashrt.sinks, slashrt.testing, slashrt.transport):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name} is exported but missing"


def test_errors_share_one_base():
    for name in ("ChannelClosed", "MalformedBuffer", "OperatorError", "SchemaError", "DataflowError", "ChannelFailed"):
        assert issubclass(getattr(slashrt, name), slashrt.SlashError)
