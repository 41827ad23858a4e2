"""`slashrt bench checkpoint` sizes its default run from the interval (several periodic
checkpoints, in bounded memory: one executor's long run is made chunk by chunk), and a run too
short to take periodic checkpoints says so instead of reporting an ABS/none that measures nothing."""

from slashrt.bench import checkpoint


def test_the_default_run_lasts_several_intervals():
    # (the 5 M events of old ended in 0.1 s, before the first 1 s checkpoint)
    assert checkpoint.default_events(1.0) == checkpoint.PERIODS * checkpoint.RATE > checkpoint.GENERATED_MAX
    assert checkpoint.default_events(2.0, executors=2) == 4 * checkpoint.default_events(1.0)
    assert checkpoint.default_events(0.01) == 5_000_000


def test_a_run_without_periodic_checkpoints_warns():
    got = checkpoint.bench(events=20_000, interval=30.0, repeat=1)
    assert got["correct"] and got["checkpoints_abs"] == 0
    assert "completed 0 periodic checkpoints (of one every 30 s" in got["warning"]


def test_a_long_run_on_one_executor_is_made_chunk_by_chunk():
    events = checkpoint.GENERATED_MAX + checkpoint.long_stream.CHUNK  # (not generated whole: bounded memory)
    inputs, _, _, _ = checkpoint._query("ysb", events, 1)
    (made,) = inputs.values()
    stream = made.make(0, 1)
    assert len(stream) == events // checkpoint.long_stream.CHUNK and len(stream[0]) == checkpoint.long_stream.CHUNK
