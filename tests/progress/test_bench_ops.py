"""The progress-module benchmark runs every case, each checking its own result, and prints JSON."""

import json

from slashrt.bench import progress_ops


def test_every_case_runs_and_reports_microseconds(capsys):
    assert progress_ops.main(["--repeat", "8", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["repeat"] == 8
    assert set(result["us_per_op"]) == set(progress_ops.CASES)
    assert all(us > 0 for us in result["us_per_op"].values())
