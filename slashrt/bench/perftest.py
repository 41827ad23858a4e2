"""`ib_write_bw` (perftest) on the device a verbs channel uses: the RDMA yardstick.

Runs the server and the client on this machine (loopback on one device, as soft-RoCE needs)
and returns the client's average bandwidth. Used by `slashrt bench ro --transport verbs` and
by the VM tests, so the channel and perftest are measured in the same run.
"""

from __future__ import annotations

import re
import subprocess
import time

__all__ = ["ib_write_bw", "tcp_listening"]


def tcp_listening(port: int) -> bool:
    """Is something listening on this TCP port (read from /proc, no connection attempt)?"""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for row in f:
                    fields = row.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        return True
        except FileNotFoundError:
            continue
    return False


ATTEMPTS = 3


def ib_write_bw(device: str, gid_index: int, address: str, *, size: int = 65536, iters: int = 300, port: int = 18515) -> dict:
    """Run ib_write_bw between a server and a client on `device`; return {"avg_mb_per_s",
    "peak_mb_per_s"} (MB = 10^6 bytes). Raises RuntimeError with perftest's output on failure.

    perftest times its transfers with the CPU's cycle counter scaled by the clock rate it reads
    from /proc/cpuinfo; in an emulated guest (qemu TCG) that reading now and then goes wrong and
    perftest prints an average of 0.00 for a transfer that completed. Such a run is repeated, up
    to ATTEMPTS runs in all, rather than reported as a bandwidth of zero."""
    for _ in range(ATTEMPTS):
        result, output = _run_once(device, gid_index, address, size, iters, port)
        if result["avg_mb_per_s"] > 0:
            return result
    raise RuntimeError(f"ib_write_bw reported an average of 0 MB/s in {ATTEMPTS} runs; the last printed:\n{output}")


def _run_once(device: str, gid_index: int, address: str, size: int, iters: int, port: int) -> tuple[dict, str]:
    args = ["ib_write_bw", "-d", device, "-x", str(gid_index), "-s", str(size), "-n", str(iters), "-F", "-p", str(port)]
    server = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not tcp_listening(port):
            if server.poll() is not None:
                raise RuntimeError(f"ib_write_bw server exited:\n{server.communicate()[0]}")
            if time.monotonic() > deadline:
                raise RuntimeError("ib_write_bw server not listening after 30 s")
            time.sleep(0.1)
        client = subprocess.run(args + [address], capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
        server_out, _ = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    if client.returncode != 0 or server.returncode != 0:
        raise RuntimeError(f"ib_write_bw failed:\nclient:\n{client.stdout}{client.stderr}\nserver:\n{server_out}")
    rows = re.findall(rf"^\s*{size}\s+{iters}\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", client.stdout, re.M)
    if not rows:
        raise RuntimeError(f"no bandwidth line in ib_write_bw's output:\n{client.stdout}")
    peak, avg, _mpps = map(float, rows[0])
    return {"avg_mb_per_s": avg, "peak_mb_per_s": peak}, client.stdout
