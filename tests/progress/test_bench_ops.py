"""The progress-module benchmark runs every case, each checking its own result, and prints JSON."""

import json

from slashrt.bench import progress_ops


def test_every_case_runs_and_reports_microseconds(capsys):
    assert progress_ops.main(["--repeat", "8", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["repeat"] == 8
    assert set(result["us_per_op"]) == set(progress_ops.CASES)
    assert all(us > 0 for us in result["us_per_op"].values())


def test_paced_notification_input_is_the_full_speed_stream_cut_so_each_chunk_closes_its_epoch():
    """`bench progress --epoch-gap-us`: the same records, one chunk per epoch and the gap between
    chunks; every chunk but the last ends with the next epoch's first record, so an epoch's
    capability is released within its own chunk (the figure measures what it did at full speed)."""
    import time

    import numpy as np

    from slashrt.bench import progress

    whole = progress._epochs(5, 4)(1, 2)
    started = time.monotonic()
    chunks = list(progress._paced_epochs(5, 4, gap_us=20_000)(1, 2))
    assert time.monotonic() - started >= 5 * 0.02  # a gap before each of the 5 chunks
    assert np.array_equal(np.concatenate(chunks), whole)
    assert [c["t"].tolist() for c in chunks] == [[0, 0, 0, 0, 1], [1, 1, 1, 2], [2, 2, 2, 3], [3, 3, 3, 4], [4, 4, 4]]
