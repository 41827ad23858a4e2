"""A module that notes, on import, the pid of the process importing it (in the file named by
$SLASHRT_TEST_IMPORTS): tests/cluster/test_zygote.py counts where a job's module was imported."""

import os

if os.environ.get("SLASHRT_TEST_IMPORTS"):
    with open(os.environ["SLASHRT_TEST_IMPORTS"], "a") as f:
        f.write(f"{os.getpid()}\n")


def keep(batch):
    return batch["ts"] >= 0
