"""The transport benchmark over verbs, end to end through the CLI, inside the VM: a producer
process feeds an executor through the registry's verbs backend, the counts per key must match
the reference (one run: under the VM's emulation each takes tens of seconds)."""

import json
import subprocess
import sys


def test_bench_ro_over_verbs_reports_ib_write_bw_from_the_same_run(rdma_report):
    proc = subprocess.run(
        [sys.executable, "-m", "slashrt", "bench", "ro", "--transport", "verbs", "--events", "300000",
         "--keys", "1000", "--slots", "16", "--repeat", "1", "--json"],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for field in ("transport", "buffer_size", "gbytes_per_s", "records_per_s", "latency_us_p50", "latency_us_p99",
                  "correct", "ib_write_bw_gbytes_per_s", "fraction_of_ib_write_bw"):
        assert field in result, field
    assert result["correct"] is True and result["transport"] == "verbs"
    assert result["ib_write_bw_gbytes_per_s"] > 0
    rdma_report(f"slashrt bench ro --transport verbs: {json.dumps(result)}")
