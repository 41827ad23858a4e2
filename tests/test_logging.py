"""slashrt's log events: stderr, warnings and up by default, even without the CLI; a level set
by argument, environment or --log-level reaches spawned executors; an application's own
structlog configuration is left alone."""

import json
import os
import subprocess
import sys

import pytest

import slashrt
from slashrt.cli import main

FLOW = """
import slashrt
from slashrt.bench import ysb
from slashrt.ops.sinks import Collect
{setup}
records = ysb.generate(2000, 10)
slashrt.run(ysb.dataflow(ysb.campaign_map(10), Collect()), {{"events": records}})
slashrt.run(ysb.dataflow(ysb.campaign_map(10), Collect()), {{"events": records}}, executors=2)
print("done")
"""


def run_flow(setup: str = "", env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", FLOW.format(setup=setup)], capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL, env={k: v for k, v in dict(os.environ, **(env or {})).items() if v is not None},
    )


def test_library_use_prints_nothing_by_default():
    proc = run_flow(env={"SLASHRT_LOG_LEVEL": None})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "done\n" and proc.stderr == ""


def test_environment_level_logs_to_stderr_in_every_process():
    proc = run_flow(env={"SLASHRT_LOG_LEVEL": "info"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "done\n"
    assert "run finished" in proc.stderr and "cluster run finished" in proc.stderr
    assert "executor ready" in proc.stderr  # logged by the spawned agents


def test_configure_logging_reaches_spawned_agents():
    proc = run_flow('slashrt.configure_logging("info")', env={"SLASHRT_LOG_LEVEL": None})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "done\n" and "executor ready" in proc.stderr and "debug" not in proc.stderr


def test_an_applications_structlog_configuration_is_left_alone():
    setup = """
import structlog
events = []
def keep(logger, method, event_dict):
    events.append(event_dict["event"])
    raise structlog.DropEvent
structlog.configure(processors=[keep])
"""
    code = setup + "\nimport slashrt\n" + FLOW.format(setup="").replace('print("done")', 'print(sorted(set(events)))')
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert "run finished" in proc.stdout and "kernels selected" in proc.stdout  # the app's pipeline saw them


def test_configure_logging_refuses_unknown_levels():
    with pytest.raises(slashrt.SlashError, match="log level"):
        slashrt.configure_logging("loud")


def test_cli_logs_go_to_stderr(capsys):
    assert main(["bench", "ysb", "--events", "20000", "--campaigns", "10", "--repeat", "1", "--json",
                 "--log-level", "debug"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["correct"] is True  # stdout is just the JSON object
    assert "kernels selected" in captured.err and "run finished" in captured.err


def test_cli_is_quiet_by_default(capsys, monkeypatch):
    monkeypatch.delenv("SLASHRT_LOG_LEVEL", raising=False)
    assert main(["bench", "ysb", "--events", "20000", "--campaigns", "10", "--repeat", "1", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["correct"] is True and captured.err == ""


def test_a_peers_loss_is_an_echo_in_a_clusters_executor_but_bad_bytes_stay_errors(monkeypatch):
    from slashrt import _logging
    from slashrt.errors import ChannelClosed, MalformedBuffer

    monkeypatch.setitem(_logging._state, "peer_loss", None)
    lost = ChannelClosed("peer 127.0.0.1:1 closed the connection before END_OF_STREAM")
    try:
        try:
            raise MalformedBuffer("buffer 0 with footer flag 255")
        except MalformedBuffer as exc:
            raise ChannelClosed("channel failed earlier") from exc
    except ChannelClosed as exc:
        bad = exc
    assert (_logging.fault_level(lost), _logging.fault_level(None, "warning"), _logging.fault_level(bad)) == (
        "error", "warning", "error")
    _logging.peer_losses_are_echoes()
    assert (_logging.fault_level(lost), _logging.fault_level(None, "warning"), _logging.fault_level(bad)) == (
        "debug", "debug", "error")
