"""tests/rdma/ runs only inside the soft-RoCE VM (``bash scripts/rdma-vm-run.sh``), which sets
SLASHRT_IN_RDMA_VM=1 after bringing up rxe0. A plain ``pytest`` on the host does not even
collect this directory. Inside the VM a missing or inactive device is a failure, never a skip.
"""

import os

import pytest

IN_RDMA_VM = os.environ.get("SLASHRT_IN_RDMA_VM") == "1"

if not IN_RDMA_VM:
    collect_ignore_glob = ["*"]

# Figures (bandwidths, latencies) that tests report; printed at the end of the run.
_REPORT: list[str] = []


@pytest.fixture
def rdma_report():
    """``rdma_report(line)`` adds a line to the summary printed after the tests."""
    return _REPORT.append


def pytest_report_header(config):
    if IN_RDMA_VM:
        return (f"rdma: SLASHRT_IN_RDMA_VM=1, device {os.environ.get('SLASHRT_RDMA_DEVICE', 'rxe0')}, "
                f"kernel {os.uname().release}")
    return None


def pytest_terminal_summary(terminalreporter):
    if _REPORT:
        terminalreporter.section("rdma figures (qemu TCG guest: compare ratios, not absolutes)")
        for line in _REPORT:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def rdma_device() -> str:
    """The rxe device's name, after checking that it is there and its port ACTIVE."""
    from . import _verbs

    names = _verbs.device_names()
    assert _verbs.DEVICE in names, f"RDMA device {_verbs.DEVICE} missing (devices: {names})"
    with _verbs.open_device() as ctx:
        assert _verbs.port_active(ctx), f"{_verbs.DEVICE} port {_verbs.PORT} is not ACTIVE"
    return _verbs.DEVICE


@pytest.fixture
def ctx(rdma_device):
    """An open verbs context on the rxe device, closed (with everything on it) afterwards."""
    from . import _verbs

    with _verbs.open_device(rdma_device) as context:
        yield context
