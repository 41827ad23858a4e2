"""`slashrt bench chaos --faults disk-full` (`slashrt.bench.fault_disk`), small: the checkpoint
disk fills mid-run and is freed; checkpoints are declined meanwhile and the output is exact."""

import types

import pytest

from slashrt.bench.faults import FAULTS
from slashrt.testing._disk import can_mount


@pytest.mark.skipif(not can_mount(), reason="needs root to mount a tmpfs (a real full disk)")
def test_disk_full_trial_is_exact_with_checkpoints_declined():
    got = FAULTS["disk-full"](types.SimpleNamespace(events=200_000, executors=2, interval=0.05))
    assert got["fault"] == "disk-full" and not got["refused"], got
    assert got["exact"] and got["duplicates"] == 0 and got["missing"] == 0, got
    assert got["declined"] >= 1 and got["completed"] >= 2, got
    assert "could not be written to" in got["cause"] and "No space left on device" in got["cause"], got
