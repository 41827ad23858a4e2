"""YSB across two executors in two processes: over verbs the same result as over shm."""

from slashrt.bench.ysb_split import run_split


def test_ysb_two_processes_same_result_over_verbs_and_shm(rdma_report):
    over = {t: run_split(t, events=100_000, campaigns=20, slot_size=8192, slots=8) for t in ("verbs", "shm")}
    assert over["verbs"]["correct"] and over["shm"]["correct"]
    assert over["verbs"]["digest"] == over["shm"]["digest"] and over["verbs"]["result_rows"] == over["shm"]["result_rows"]
    rdma_report(f"ysb split over verbs: {over['verbs']['records_per_s']:.0f} records/s; over shm: {over['shm']['records_per_s']:.0f}")
