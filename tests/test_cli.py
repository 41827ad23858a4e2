"""The `slashrt` command: benchmarks verify themselves, bad input gives clear errors."""

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from slashrt.bench import ysb
from slashrt.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "slashrt", *args], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
    )


def test_bench_ysb_json_is_one_correct_object():
    proc = run_cli("bench", "ysb", "--events", "300000", "--campaigns", "50", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # stdout is exactly one JSON object
    for field in ("query", "events", "executors", "transport", "seconds", "records_per_s", "correct"):
        assert field in result
    assert result["query"] == "ysb" and result["events"] == 300_000 and result["correct"] is True
    assert result["records_per_s"] > 0
    # the CPU the executor used, and throughput per CPU second (what a loaded machine moves least)
    assert result["cpu_s"] > 0 and result["records_per_cpu_s"] == pytest.approx(300_000 / result["cpu_s"], rel=1e-3)
    from slashrt._kernels import NATIVE

    # the C loop yardstick exists only with the native extension (SLASHRT_NATIVE=0: none)
    assert ("c_loop_agrees" in result) == NATIVE and result.get("c_loop_agrees", True) is True


@pytest.mark.parametrize("query,extra", [("ro", ["--keys", "1000000"]), ("cm", ["--jobs", "500"])])
def test_bench_ro_and_cm_verify_themselves(query, extra, capsys):
    assert main(["bench", query, "--events", "200000", *extra, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["query"] == query and result["correct"] is True and result["events"] == 200_000


def test_ysb_input_and_output_files(tmp_path, capsys):
    records = ysb.generate(50_000, 20, seed=3)
    # a filler declared as bytes instead of void is accepted: same names, sizes and offsets
    as_bytes = records.view(
        np.dtype([(n, "S40" if n == "filler" else records.dtype.fields[n][0]) for n in records.dtype.names])
    )
    src, out = tmp_path / "events.npy", tmp_path / "counts.csv"
    np.save(src, as_bytes)
    assert main(["bench", "ysb", "--input", str(src), "--campaigns", "20", "--output", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["events"] == 50_000
    with out.open() as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["window_start_ms", "campaign_id", "count"]
    expected = ysb.reference(records, ysb.campaign_map(20))
    got = np.array([[int(v) for v in row] for row in rows[1:]])
    assert np.array_equal(got[:, 0], expected["window_start_ms"])
    assert np.array_equal(got[:, 1], expected["campaign_id"])
    assert np.array_equal(got[:, 2], expected["count"])


def test_ysb_ads_mapping_file(tmp_path, capsys):
    records = ysb.generate(20_000, 10, seed=5)
    ads = (np.arange(100, dtype=np.int64) * 7) % 3  # 100 ads onto 3 campaigns
    np.save(tmp_path / "e.npy", records)
    np.save(tmp_path / "ads.npy", ads)
    assert main(["bench", "ysb", "--input", str(tmp_path / "e.npy"), "--ads", str(tmp_path / "ads.npy"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["correct"] is True and result["campaigns"] == 3


def test_ysb_input_with_wrong_record_size_names_the_file(tmp_path):
    bad = np.zeros(10, dtype=[("event_time", "<i8"), ("ad_id", "<i8")])
    path = tmp_path / "bad.npy"
    np.save(path, bad)
    proc = run_cli("bench", "ysb", "--input", str(path), "--json")
    assert proc.returncode == 2
    assert "bad.npy" in proc.stderr and "missing field 'user_id'" in proc.stderr
    assert proc.stdout == ""


def test_ysb_input_with_wrong_field_type_names_field(tmp_path, capsys):
    records = ysb.generate(100, 10)
    dt = np.dtype([(n, "<f8" if n == "ad_id" else records.dtype.fields[n][0]) for n in records.dtype.names])
    path = tmp_path / "floats.npy"
    np.save(path, np.zeros(100, dt))
    assert main(["bench", "ysb", "--input", str(path)]) == 2
    err = capsys.readouterr().err
    assert "floats.npy" in err and "ad_id" in err


def test_ysb_input_big_endian_is_read_as_every_run_input(tmp_path, capsys):
    records = ysb.generate(5_000, 10, seed=2)
    big = records.astype([(n, records.dtype.fields[n][0].newbyteorder(">")) for n in records.dtype.names])
    np.save(tmp_path / "big.npy", big)
    assert main(["bench", "ysb", "--input", str(tmp_path / "big.npy"), "--campaigns", "10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["correct"] is True
    assert np.array_equal(ysb.load_input(tmp_path / "big.npy"), records)


def test_ysb_input_not_npy(tmp_path, capsys):
    path = tmp_path / "junk.npy"
    path.write_bytes(b"not a numpy file")
    assert main(["bench", "ysb", "--input", str(path)]) == 2
    assert "junk.npy" in capsys.readouterr().err


def test_ysb_ad_ids_outside_mapping(tmp_path, capsys):
    records = ysb.generate(1000, 10)
    np.save(tmp_path / "e.npy", records)
    np.save(tmp_path / "ads.npy", np.zeros(5, np.int64))  # covers ad ids 0..4 only
    assert main(["bench", "ysb", "--input", str(tmp_path / "e.npy"), "--ads", str(tmp_path / "ads.npy")]) == 2
    assert "ad_id" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args,message",
    [
        (["bench", "ysb", "--events", "-5"], "must be positive"),
        (["bench", "ysb", "--events", "many"], "not a whole number"),
        (["bench", "ysb", "--zipf", "-1"], "must be >= 0"),
        (["bench", "nosuch"], "invalid choice"),
        ([], "required"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_demo_prints_result_and_throughput():
    proc = run_cli("demo", "--events", "200000")
    assert proc.returncode == 0, proc.stderr
    assert "local cluster of 2 executor processes over shm" in proc.stdout
    assert "matches the numpy reference" in proc.stdout
    assert "million records/s" in proc.stdout


@pytest.mark.parametrize(
    "query,extra",
    [
        ("ysb", ["--campaigns", "50", "--mode", "uppar"]),
        ("ro", ["--keys", "10000", "--zipf", "1.2"]),
        ("cm", ["--jobs", "200", "--epoch-bytes", "65536"]),
        ("nexmark", ["--query", "7", "--partitions", "8"]),
    ],
)
def test_bench_on_two_executors_verifies_itself(query, extra, capsys):
    assert main(["bench", query, "--executors", "2", "--events", "100000", "--repeat", "1", *extra, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["query"] == query and result["correct"] is True
    assert result["executors"] == 2 and result["events"] == 200_000 and result["events_per_executor"] == 100_000
    assert result["cpu_s"] > 0 and result["records_per_cpu_s"] == pytest.approx(200_000 / result["cpu_s"], rel=1e-3)
    if result["mode"] == "slash":
        assert result["epochs"] > 0 and "state_bytes_shipped_per_epoch" in result


def test_bench_report_writes_plots_and_ratios(tmp_path, capsys):
    out = tmp_path / "img"
    assert main(["bench", "report", "--events", "20000", "--zipf", "1.0", "--repeat", "1", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["correct"] is True and summary["runs"] == 4 * 3 + 2 * 2 + 3 * 3
    for key in ("ysb_scaling_2x", "ro_slash_over_uppar", "nexmark_scaling_2x", "ysb_slash_by_zipf"):
        assert key in summary
    assert (out / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "skew.png").stat().st_size > 1000 and (out / "ro_keys.png").stat().st_size > 1000
    assert len(json.loads((out / "report.json").read_text())) == summary["runs"]


def test_executor_with_a_bad_listen_address_exits_2():
    proc = run_cli("executor", "--listen", "nowhere")
    assert proc.returncode == 2 and "HOST:PORT" in proc.stderr


@pytest.mark.parametrize("transport", ["inproc", "shm"])
def test_bench_ro_over_a_transport_repeats_and_checks_every_run(transport):
    proc = run_cli(
        "bench", "ro", "--transport", transport, "--buffer-size", "65536", "--events", "300000", "--keys", "1000",
        "--slots", "16", "--repeat", "2", "--json",
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["transport"] == transport and result["repeat"] == 2 and result["correct"] is True
    assert result["events"] == 300_000 and result["gbytes_per_s"] > 0 and result["memcpy_gbytes_per_s"] > 0
    # the JSON rounds to 3 decimals
    assert 0 <= result["fraction_of_memcpy"] == pytest.approx(result["gbytes_per_s"] / result["memcpy_gbytes_per_s"], abs=2e-3)
    assert result["latency_us_p50"] > 0


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_bench_ro_over_a_channel_of_a_slot_pool_borrows_and_is_exact(transport):
    proc = run_cli(
        "bench", "ro", "--transport", transport, "--buffer-size", "4096", "--events", "300000", "--keys", "1000",
        "--slots", "4", "--floating", "12", "--repeat", "1", "--json",
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # 4.8 MB through 4 exclusive slots of 4 KiB and 12 borrowed
    assert result["correct"] is True and result["slots"] == 4 and result["floating"] == 12 and result["gbytes_per_s"] > 0
    assert 0 < result["floating_peak"] <= 12


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        found += (new := [int(p) for p in subprocess.run(["pgrep", "-P", str(todo.pop())], capture_output=True,
                                                          text=True).stdout.split()])
        todo += new
    return found


@pytest.mark.parametrize("moment", ["spawning", "running"])
def test_ctrl_c_ends_with_one_line_and_exit_130_leaving_no_executor(moment):
    import os
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "slashrt", "demo", "--events", "400000000"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    children = []
    try:
        assert proc.stdout.readline().startswith("slashrt demo:")  # imported, about to start the cluster
        if moment == "running":
            deadline = time.monotonic() + 60
            while len(children) < 3 and time.monotonic() < deadline:
                time.sleep(0.2)
                children = _descendants(proc.pid)  # the zygote and the two agents it forked
            assert len(children) == 3, "the executors did not start"
            time.sleep(1)  # let them get to work
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130
        assert err == "slashrt: interrupted\n"
        for pid in children:  # reaped by the coordinator, not only killed
            assert not os.path.exists(f"/proc/{pid}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_liveness_options_reach_the_cluster_and_bad_ones_exit_2(capsys):
    assert main(["bench", "ysb", "--executors", "2", "--events", "1000", "--heartbeat-interval", "5",
                 "--heartbeat-timeout", "5"]) == 2
    assert "heartbeat_timeout (5 s) must be longer than heartbeat_interval (5 s)" in capsys.readouterr().err
    assert main(["demo", "--events", "1000", "--heartbeat-timeout", "0"]) == 2
    assert "heartbeat_timeout must be a positive number" in capsys.readouterr().err
