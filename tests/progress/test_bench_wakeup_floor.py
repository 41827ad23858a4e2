"""The wake-up floor benchmark measures every case between two real processes and prints JSON;
a bad round count is refused in one line."""

import json

import pytest

from slashrt.bench import wakeup_floor


def test_every_case_runs_and_reports_microseconds(capsys):
    assert wakeup_floor.main(["--rounds", "50", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["rounds"] == 50
    for case in ("eventfd_us", "eventfd_trio_us", "spin_us", "trio_unpark_us"):
        assert 0 < result[case]["p50"] <= result[case]["p99"]
    assert result["trio_checkpoint_us"] > 0


def test_a_round_count_below_one_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        wakeup_floor.main(["--rounds", "0"])
    assert exc.value.code == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err
