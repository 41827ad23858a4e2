"""The `slashrt` command honours every option on every path it claims, or refuses it in one
line with exit code 2; bad files, addresses and environments get one clear line too."""

import argparse
import contextlib
import csv
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from slashrt.bench import cc, ysb
from slashrt.cli import _parser, main

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"
SECRET = "00112233445566778899aabbccddeeff"


def run_cli(*args: str, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "slashrt", *args], capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL, env=dict(os.environ, **(env or {})),
    )


def one_error_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


def read_csv_rows(path) -> np.ndarray:
    with open(path) as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["window_start_ms", "campaign_id", "count"]
    return np.array([[int(v) for v in row] for row in rows[1:]], dtype=np.int64).reshape(-1, 3)


# --- bench ysb --input/--ads/--output on any number of executors ---------------------------


@pytest.mark.parametrize("executors", [1, 2, 3])
def test_ysb_input_ads_output_on_n_executors_match_numpy(tmp_path, capsys, executors):
    records = ysb.generate(30_000, 10, seed=9)
    ads = (np.arange(100, dtype=np.int64) * 7) % 4  # 100 ads onto 4 campaigns
    np.save(tmp_path / "e.npy", records)
    np.save(tmp_path / "ads.npy", ads)
    out = tmp_path / "counts.csv"
    argv = ["bench", "ysb", "--input", str(tmp_path / "e.npy"), "--ads", str(tmp_path / "ads.npy"),
            "--output", str(out), "--repeat", "1", "--json"]
    if executors > 1:
        argv += ["--executors", str(executors)]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["correct"] is True and result["events"] == 30_000 and result["executors"] == executors
    expected = ysb.reference(records, ads)
    got = read_csv_rows(out)
    assert np.array_equal(got[:, 0], expected["window_start_ms"])
    assert np.array_equal(got[:, 1], expected["campaign_id"])
    assert np.array_equal(got[:, 2], expected["count"])


def test_ysb_disorder_ms_is_honoured_on_executors(capsys):
    assert main(["bench", "ysb", "--events", "20000", "--campaigns", "10", "--disorder-ms", "50",
                 "--executors", "2", "--repeat", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["correct"] is True and result["disorder_ms"] == 50


def test_a_cluster_option_without_executors_runs_on_a_cluster(capsys):
    assert main(["bench", "ysb", "--events", "20000", "--campaigns", "10", "--transport", "tcp", "--repeat", "1",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["correct"] is True and result["transport"] == "tcp" and result["executors"] == 1


@pytest.mark.parametrize(
    "args,refused",
    [
        (["bench", "ysb", "--input", "{e}", "--events", "5"], "--events"),
        (["bench", "ysb", "--input", "{e}", "--zipf", "1"], "--zipf"),
        (["bench", "ysb", "--input", "{e}", "--ads", "{a}", "--campaigns", "3"], "--campaigns"),
        (["bench", "ro", "--transport", "shm", "--zipf", "1"], "--zipf"),
        (["bench", "ro", "--transport", "shm", "--window-ms", "5"], "--window-ms"),
        (["bench", "ro", "--transport", "shm", "--slot-size", "4096"], "--slot-size"),
        (["bench", "ro", "--buffer-size", "4096"], "--buffer-size"),
        (["bench", "ro", "--executors", "2", "--buffer-size", "4096"], "--buffer-size"),
        (["bench", "ro", "--floating", "8"], "--floating"),
        (["bench", "ro", "--executors", "2", "--floating", "8"], "--floating"),
        (["bench", "ro", "--transport", "inproc", "--floating", "8"], "--floating"),
        (["bench", "ysb", "--ads", "{a}", "--campaigns", "20"], "--ads"),
    ],
)
def test_options_a_path_would_ignore_are_refused(tmp_path, capsys, args, refused):
    np.save(tmp_path / "e.npy", ysb.generate(100, 1))
    np.save(tmp_path / "a.npy", np.zeros(10, np.int64))
    argv = [a.format(e=tmp_path / "e.npy", a=tmp_path / "a.npy") for a in args]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert refused in one_error_line(captured.err) and captured.out == ""


def test_bench_cc_refuses_a_transport_on_one_executor_in_one_line(capsys):
    assert main(["bench", "cc", "--edges", "1000", "--transport", "tcp", "--json"]) == 2
    captured = capsys.readouterr()
    line = one_error_line(captured.err)
    assert "--transport does not apply with --executors 1" in line and captured.out == ""


@pytest.mark.parametrize(
    "args,message",
    [(["--edges", "0"], "'0' must be positive"), (["--epochs", "x"], "'x' is not a whole number"),
     (["--graph", "ring"], "invalid choice: 'ring'"), (["--seed", "-3"], "'-3' must be positive"),
     (["--repeat", "0"], "'0' must be positive")],
)
def test_bench_cc_bad_arguments_exit_2(capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "cc", *args])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def table_rows(text: str) -> dict[str, str]:
    """A benchmark's table without --json: one `key  value` line per result field."""
    return dict(line.split(None, 1) for line in text.splitlines())


def _components(edges: int, graph: str, seed: int) -> int:
    data = cc.generate(edges, 1, graph=graph, nodes=edges, seed=seed)
    return int(np.count_nonzero(cc.scipy_labels(data["src"], data["dst"], edges) == np.arange(edges)))


def test_bench_cc_graph_and_seed_are_honoured_on_several_executors(capsys):
    assert main(["bench", "cc", "--edges", "3000", "--epochs", "2", "--executors", "2", "--graph", "powerlaw",
                 "--seed", "5", "--repeat", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["correct"] is True and out["example"] == "cc_partitioned" and out["executors"] == 2
    assert out["graph"] == "powerlaw" and out["seed"] == 5
    # the components of seed 5's power-law graph: the default seed or graph would give others
    assert out["components"] == _components(3000, "powerlaw", 5)
    assert out["components"] != _components(3000, "powerlaw", 0)
    assert out["components"] != _components(3000, "uniform", 5)


@pytest.mark.parametrize("executors", [[], ["--executors", "2"]], ids=["one", "two"])
def test_bench_cc_without_json_prints_a_table(capsys, executors):
    assert main(["bench", "cc", "--edges", "2000", "--repeat", "1", *executors]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert rows["correct"] == "True" and rows["edges"] == "2,000" and rows["executors"] == ("2" if executors else "1")
    assert rows["components"] == f"{_components(2000, 'uniform', 0):,}"
    assert ("example" in rows) == bool(executors)  # several executors: the partitioned example


def test_bench_report_zipf_list_is_checked(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "report", "--zipf", "0.5,abc"])
    assert exc.value.code == 2 and "'abc' is not a number" in capsys.readouterr().err


# --- bad --input files --------------------------------------------------------------------


def _bad_input(tmp_path, kind: str) -> Path:
    path = tmp_path / f"{kind}.npy"
    if kind == "empty_array":
        np.save(path, ysb.generate(0, 1))
    elif kind == "zero_bytes":
        path.write_bytes(b"")
    elif kind == "npz":
        path = tmp_path / "records.npz"
        np.savez(path, ysb.generate(10, 1))
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    return path


@pytest.mark.parametrize("kind", ["empty_array", "zero_bytes", "npz", "fifo", "directory", "missing"])
@pytest.mark.parametrize("executors", [None, "2"])
def test_bad_input_files_get_one_line_and_exit_2(tmp_path, capsys, kind, executors):
    path = _bad_input(tmp_path, kind)
    argv = ["bench", "ysb", "--input", str(path), "--json"] + (["--executors", executors] if executors else [])
    assert main(argv) == 2  # (a FIFO would block forever in np.load)
    captured = capsys.readouterr()
    assert path.name in one_error_line(captured.err) and captured.out == ""


def test_bad_ads_file_gets_one_line(tmp_path, capsys):
    (tmp_path / "ads.npy").write_bytes(b"")
    assert main(["bench", "ysb", "--events", "100", "--ads", str(tmp_path / "ads.npy")]) == 2
    assert "ads.npy" in one_error_line(capsys.readouterr().err)


def test_twenty_days_of_input_is_a_correct_result(tmp_path, capsys):
    from slashrt._kernels import NATIVE

    records = ysb.generate(3000, 1000, seed=4)
    records["event_time"] = np.linspace(0, 20 * 86_400_000, len(records)).astype(np.int64)
    np.save(tmp_path / "days.npy", records)
    assert main(["bench", "ysb", "--input", str(tmp_path / "days.npy"), "--repeat", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["correct"] is True
    if NATIVE:  # the C yardstick's dense grid cannot span 20 days x 1000 campaigns: skipped, said why
        assert "c_loop_records_per_s" not in result and "grid" in result["c_loop_skipped"]


@pytest.mark.parametrize("executors", [1, 2])
def test_negative_event_times_give_a_correct_result(tmp_path, capsys, executors):
    records = ysb.generate(5000, 10, seed=2)
    records["event_time"] -= 2**40
    np.save(tmp_path / "neg.npy", records)
    assert main(["bench", "ysb", "--input", str(tmp_path / "neg.npy"), "--campaigns", "10", "--repeat", "1",
                 "--executors", str(executors), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["correct"] is True


# --- slot sizes, transports, optional dependencies, log levels ------------------------------


@pytest.mark.parametrize("slot_size", ["10", "100"])
@pytest.mark.parametrize("executors", [None, "2"])
def test_too_small_slot_size_is_one_line(capsys, slot_size, executors):
    argv = ["bench", "ysb", "--events", "1000", "--slot-size", slot_size] + (["--executors", executors] if executors else [])
    assert main(argv) == 2
    assert f"slot_size={slot_size}" in one_error_line(capsys.readouterr().err)


def _verbs_usable() -> bool:
    try:
        from slashrt.transport.verbs import discover_device

        discover_device()
    except Exception:
        return False
    return True


@pytest.mark.skipif(_verbs_usable(), reason="this machine has a usable RDMA device")
@pytest.mark.parametrize("args", [["demo"], ["bench", "ysb", "--executors", "2"], ["bench", "ro", "--transport", "verbs"]])
def test_verbs_without_a_device_is_one_line(args):
    proc = run_cli(*args, *([] if "verbs" in args else ["--transport", "verbs"]), "--events", "1000")
    assert proc.returncode == 2
    line = one_error_line(proc.stderr)
    assert line.startswith("slashrt: error: --transport verbs:") and "secret" not in line


BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == {module!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Block())
from slashrt.cli import main
sys.exit(main({argv!r}))
"""


@pytest.mark.parametrize(
    "module,argv,extra",
    [
        ("pyspark", ["spark-demo"], "slashrt[spark]"),
        ("pandas", ["spark-demo"], "slashrt[spark]"),
        ("matplotlib", ["bench", "report", "--events", "1000"], "slashrt[bench]"),
        ("scipy", ["bench", "cc", "--edges", "1000"], "slashrt[bench]"),
        ("networkx", ["bench", "cc", "--edges", "1000"], "slashrt[bench]"),
        ("polars", ["bench", "peers", "--events", "1000"], "slashrt[bench]"),
    ],
)
def test_a_missing_optional_dependency_names_its_extra(module, argv, extra):
    proc = subprocess.run([sys.executable, "-c", BLOCK.format(module=module, argv=argv)], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    line = one_error_line(proc.stderr)
    assert module in line and extra in line


def test_a_bad_log_level_environment_is_one_line():
    proc = run_cli("bench", "ysb", "--events", "100", env={"SLASHRT_LOG_LEVEL": "loud"})
    assert proc.returncode == 2 and "SLASHRT_LOG_LEVEL" in one_error_line(proc.stderr)


# --- executor --listen ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "address,message",
    [("127.0.0.1:99999", "not in 0..65535"), ("nowhere", "HOST:PORT"), ("[::1:7000", "HOST:PORT")],
)
def test_executor_listen_address_is_checked(address, message):
    proc = run_cli("executor", "--listen", address, env={"SLASHRT_SECRET": SECRET})
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_executor_address_in_use_is_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_cli("executor", "--listen", f"127.0.0.1:{port}", env={"SLASHRT_SECRET": SECRET})
    assert proc.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in one_error_line(proc.stderr)


def _ipv6_loopback() -> bool:
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        return True
    return False


@pytest.mark.parametrize("address,host", [(":0", "0.0.0.0"), ("[::1]:0", "::1")])
def test_executor_listens_on_every_interface_or_a_bracketed_ipv6_host(address, host):
    if host == "::1" and not _ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    proc = subprocess.Popen([sys.executable, "-m", "slashrt", "executor", "--listen", address],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            env=dict(os.environ, SLASHRT_SECRET=SECRET))
    try:
        words = proc.stdout.readline().split()
    finally:
        proc.kill()
        proc.communicate()
    assert words[:3] == ["slashrt-agent", "listening", host] and int(words[3]) > 0


# --- help and the guide ----------------------------------------------------------------------


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "ysb", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("--events EVENTS (default: 10000000)", "(default: 65536)", "(default: 1000)",
                  "(default: $SLASHRT_LOG_LEVEL, else warning)"):
        assert shown in text


def test_executor_usage_help_and_guide_agree(capsys):
    with pytest.raises(SystemExit):
        main(["executor", "--help"])
    text = capsys.readouterr().out
    usage = " ".join(text.split("\n\n")[0].split())
    assert "[--listen HOST:PORT]" in usage and "[--once]" in usage
    assert "--listen HOST:PORT" in text and "(default: 127.0.0.1:0)" in " ".join(text.split())
    guide = GUIDE.read_text()
    assert "slashrt executor [--listen HOST:PORT] [--once]" in guide


def test_guide_and_cli_agree_on_what_demo_runs():
    choices = next(a for a in _parser()._actions if a.dest == "command")
    demo_help = next(a.help for a in choices._choices_actions if a.dest == "demo")
    demo = choices.choices["demo"]
    executors = next(a.default for a in demo._actions if a.dest == "executors")
    assert f"a local cluster of {executors} executor processes" in demo_help
    guide = GUIDE.read_text()
    install_demo = re.search(r"^slashrt demo +# (.*)$", guide, re.M).group(1)
    assert f"a local cluster of {executors} executor processes" in install_demo
    assert "one local executor" not in guide



def _commands(parser, prefix=()):
    """Every command of `parser`, as its words ("bench", "cc"), with its parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*prefix, name))
            return
    yield prefix, parser


def test_the_guides_command_list_names_every_command_and_its_options():
    """The list under "## The command line": each command heads an entry (or is one of
    `a|b|...` in a shared one) whose lines name every option it takes (--log-level: below)."""
    guide = GUIDE.read_text()
    block = guide.split("## The command line\n\n```\n", 1)[1].split("```", 1)[0]
    entries = []  # (command words, or several commands' last words, text)
    for line in block.splitlines():
        if line.startswith("slashrt "):
            entries.append([line])
        else:
            entries[-1].append(line)
    for words, parser in _commands(_parser()):
        text = " ".join(
            " ".join(lines) for lines in entries
            if (head := lines[0].split()[1:len(words) + 1])[:-1] == list(words[:-1]) and words[-1] in head[-1].split("|")
        )
        assert text, f"slashrt {' '.join(words)} is missing from the guide's command list"
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:
                continue  # internal (an agent started by its parent)
            for flag in action.option_strings:
                if flag.startswith("--") and flag not in ("--help", "--log-level"):
                    assert re.search(rf"{flag}\b", text), f"slashrt {' '.join(words)} {flag}: not in the guide's list"

# --- one progress tracker on every path: --progress is gone ------------------------------------


@pytest.mark.parametrize("query", ["ysb", "nexmark"])
@pytest.mark.parametrize("mode", ["slash", "uppar"])
def test_every_cluster_path_checks_itself(capsys, query, mode):
    argv = ["bench", query, "--events", "20000", "--executors", "2", "--mode", mode, "--repeat", "1", "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["correct"] is True and result["mode"] == mode and result["executors"] == 2


@pytest.mark.parametrize("args", [["--progress", "watermark"], ["--executors", "2", "--progress=lamport"]])
def test_the_removed_progress_option_is_one_line_and_exit_2(args):
    done = run_cli("bench", "ysb", *args)
    assert done.returncode == 2 and done.stdout == ""
    assert one_error_line(done.stderr) == ("slashrt: error: --progress was removed: every dataflow runs on pointstamp "
                                           "progress (one tracker over its graph); leave it out")


@pytest.mark.parametrize(("executors", "transport", "gap"), [("2", "shm", "0"), ("3", "tcp", "0"), ("2", "tcp", "500"), ("3", "shm", "500")])
def test_bench_progress_measures_and_checks_itself(capsys, executors, transport, gap):
    argv = ["bench", "progress", "--executors", executors, "--transport", transport, "--epochs", "6",
            "--events", "30000", "--epoch-gap-us", gap, "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["correct"] is True and out["executors"] == int(executors) and out["transport"] == transport
    assert out["epoch_gap_us"] == float(gap)
    for key in ("notify_latency_us_p50", "notify_latency_us_p99", "loop_round_trip_us_p50"):
        assert out[key] > 0, key
    assert 0 < out["progress_bytes_per_data_byte"] < 0.01 and out["progress_messages_per_epoch"] > 0


def test_bench_progress_without_json_prints_a_table(capsys):
    assert main(["bench", "progress", "--epochs", "6", "--events", "30000"]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert rows["correct"] == "True" and rows["executors"] == "2" and rows["transport"] == "shm"
    assert rows["epochs"] == "6" and rows["ysb_events"] == "30,000"
    for key in ("notify_latency_us_p50", "notify_latency_us_p99", "loop_round_trip_us_p50"):
        assert float(rows[key].replace(",", "")) > 0, key


@pytest.mark.parametrize(
    "bench,args,message",
    [("progress", ["--executors", "1"], "--executors 1: `bench progress` measures progress between executors"),
     ("progress", ["--transport", "pigeon"], "invalid choice: 'pigeon'"),
     ("progress", ["--epochs", "0"], "'0' must be positive"), ("progress", ["--epoch-gap-us", "-5"], "'-5' must be >= 0"),
     ("union", ["--executors", "1"], "--executors 1: `bench union` measures what executors ship each other"),
     ("union", ["--mode", "gossip"], "invalid choice: 'gossip'"), ("union", ["--events", "0"], "'0' must be positive"),
     ("union", ["--transport", "pigeon"], "invalid choice: 'pigeon'")],
)
def test_bench_progress_and_union_bad_arguments_exit_2(capsys, bench, args, message):
    try:
        code = main(["bench", bench, *args, "--json"])
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    assert code == 2 and message in captured.err and captured.out == ""


@pytest.mark.parametrize(("executors", "transport", "mode"), [("2", "shm", "both"), ("3", "tcp", "slash"), ("2", "tcp", "uppar")])
def test_bench_union_measures_what_a_window_behind_a_union_ships_and_checks_itself(capsys, executors, transport, mode):
    argv = ["bench", "union", "--executors", executors, "--transport", transport, "--mode", mode, "--events", "60000",
            "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["correct"] is True and out["executors"] == int(executors) and out["transport"] == transport
    runs = {r["mode"]: r for r in out["runs"]}
    assert list(runs) == (["slash", "uppar"] if mode == "both" else [mode])
    for r in runs.values():
        assert r["records_per_s"] > 0 and r["record_bytes"] == 2 * 60000 * int(executors) * 78
    if "uppar" in runs:  # every record another executor owns
        assert runs["uppar"]["bytes_shipped"] > runs["uppar"]["record_bytes"] // 10 // int(executors)
    if "slash" in runs:  # a partial row per campaign and window
        assert 0 < runs["slash"]["bytes_shipped"] and runs["slash"]["shipments"] > 0
    if mode == "both":
        assert out["bytes_ratio"] < 0.1 and out["speed_ratio"] > 0

