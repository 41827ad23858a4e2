"""This machine's memory bandwidth as numpy sees it: the best of 8 passes over a 200 MB array,
reading (a sum) and copying (np.copyto), in GB/s of the source's bytes. Run two at once
(`python scripts/memory_bandwidth.py & python scripts/memory_bandwidth.py; wait`) to see
whether two processes streaming memory slow each other (docs/benchmarks.md, issue 22)."""

import time

import numpy as np


def main() -> None:
    a = np.ones(200_000_000, np.uint8)
    b = np.empty_like(a)
    np.copyto(b, a)  # (every page touched before timing)
    read = copy = float("inf")
    for _ in range(8):
        t = time.perf_counter()
        a.view(np.uint64).sum()
        read = min(read, time.perf_counter() - t)
        t = time.perf_counter()
        np.copyto(b, a)
        copy = min(copy, time.perf_counter() - t)
    print(f"read {a.nbytes / read / 1e9:.1f} GB/s  copy {a.nbytes / copy / 1e9:.1f} GB/s (source bytes)")


if __name__ == "__main__":
    main()
