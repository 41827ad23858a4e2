"""A FileSource checkpoint resumed on another number of executors (rescaling): the files are
splits with offsets. A run on N executors over 7 .npy files, stopped with a savepoint while
files are partly read (a StopHandle asked after its second checkpoint; a paced filter keeps the
stream going), resumed on M (1 -> 3 -> 3, 2 -> 1 -> 1, 3 -> 2 over tcp, 2 -> 3 -> 1: each middle run
stopped again, so its checkpoint's per-file starts are made again on as many executors, or
rescaled once more; .npy files, Parquet in row groups smaller than the files, CSV) publishes exactly what
one uninterrupted run publishes (a transactional CSV directory; rings of 4 slots of 1 KiB, the
data ~700 times a ring); an executor of the rescaled run SIGKILLed in its first alignment is restarted and the output
is still exact; the same through `slashrt run --resume-from latest --executors 3`;
files changed among the checkpointed ones, or an array given for the files, are refused in one
sentence (and exit 2 on the CLI); files added after them are left for a next source, as on the
same count; `rescaled_starts` over hand-made cursors."""

import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

import slashrt
from slashrt import StopHandle
from slashrt.bench import chaos
from slashrt.bench.chaos import published
from slashrt.cli import main
from slashrt.connectors import FileSource
from slashrt.connectors.files import DONE
from slashrt.errors import SlashError
from slashrt.snapshot import SnapshotStore

from tests.connectors import _file_job as job
from tests.connectors.test_executors import RING, SCHEMA, records, write_files
from tests.snapshot._paced import Paced, until_fired
from tests.snapshot.test_cluster_stop import stop_after_manifest

JOB = str(Path(job.__file__))
# the stopped runs' tail: slow (~2 s a run if nothing stopped it), so the stop comes in the
# middle however loaded the machine is; it comes within milliseconds, so the pace costs little
PACE = dict(after=1_000, seconds=0.02)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[np.ndarray, dict]:
    """The input, and what one uninterrupted run over it publishes."""
    directory = tmp_path_factory.mktemp("ref")
    data = records()
    write_files(directory / "in", data)
    slashrt.run(job.flow(directory), {"events": job.source(directory)}, checkpoint_dir=directory / "chk", **RING)
    rows = published(directory / "out")
    assert len(rows) > 2000 and max(rows.values()) == 1
    return data, rows


def stopped(directory: Path, monkeypatch, executors: int, transport: str, resume: bool) -> dict:
    """Run on `executors`, stopped with a savepoint after its second checkpoint: the savepoint's
    positions per executor (asserted in the middle of some file)."""
    stop, tally = StopHandle(), directory / f"tally-{len(list(directory.glob('tally-*')))}"
    tally.mkdir()
    # stopped once this run's executors are in their slow tail, not merely after two checkpoints:
    # fast checkpoints (unaligned, or a quiet machine) can complete two before a resumed run
    # feeds a record, and a savepoint there has every reader at the start of its files
    stop_after_manifest(monkeypatch, stop, 2, when=lambda: _seen(tally) > PACE["after"])
    result = slashrt.run(job.flow(directory, Paced(**PACE, tally=tally)), {"events": job.source(directory)},
                         executors=executors, transport=transport, checkpoint=0.005, checkpoint_dir=directory / "chk", stop=stop,
                         resume_from="latest" if resume else None, **RING)
    monkeypatch.undo()
    assert result.savepoint is not None, result.checkpoints
    meta = SnapshotStore(directory / "chk", job="w").load(result.savepoint, executor=None).meta
    positions = meta["sources"]["w.events"]
    assert sorted(positions) == [str(i) for i in range(executors)]
    assert any(p["cursor"]["offset"] > 0 or p["skip"] > 0 for p in positions.values()), positions  # partly read
    return meta


def _seen(tally: Path) -> int:
    """Records this run's executors have seen (each keeps its count in `tally`)."""
    return sum(int(f.read_text() or 0) for f in tally.iterdir())


def write_as(directory: Path, data: np.ndarray, fmt: str) -> None:
    """`data` in the 7 files of `write_files`, as .npy, CSV or Parquet (row groups of 700)."""
    write_files(directory, data)
    if fmt == "npy":
        return
    for path in sorted(directory.glob("*.npy")):
        part = np.load(path)
        table = pa.table({name: part[name] for name in part.dtype.names})
        if fmt == "csv":
            pcsv.write_csv(table, path.with_suffix(".csv"))
        else:
            pq.write_table(table, path.with_suffix(".parquet"), row_group_size=700)
        path.unlink()


CHAINS = [
    pytest.param([1, 3, 3], "shm", "npy", id="1-3-3"),  # (then on as many: the rescaled readers made again, rewound)
    pytest.param([2, 1, 1], "shm", "npy", id="2-1-1"),
    pytest.param([3, 2], "tcp", "parquet", id="3-2-tcp-parquet"),  # (positions inside row groups)
    pytest.param([2, 3, 1], "shm", "csv", id="2-3-1-csv"),  # (positions as line counts)
]


@pytest.mark.parametrize("chain, transport, fmt", CHAINS)
def test_a_file_source_stopped_mid_file_resumes_exactly_on_other_executor_counts(tmp_path, monkeypatch, reference,
                                                                                   chain, transport, fmt):
    data, expected = reference
    write_as(tmp_path / "in", data, fmt)
    for k, executors in enumerate(chain[:-1]):
        meta = stopped(tmp_path, monkeypatch, executors, transport, resume=k > 0)
        # a rescaled run's checkpoint keeps every file's start per rescaling, for the next resume
        assert [s["executors"] for s in meta.get("reshared", [])] == [a for a, b in zip(chain[:k], chain[1:]) if a != b]
        for stage in meta.get("reshared", []):
            starts = stage["files"]["w.events"]["starts"]
            assert len(starts) == 7 and min(starts) >= -1
    result = slashrt.run(job.flow(tmp_path), {"events": job.source(tmp_path)}, executors=chain[-1], transport=transport,
                         checkpoint=0.005, checkpoint_dir=tmp_path / "chk", resume_from="latest", **RING)
    assert result.resumed_from is not None and sum(result.late_records.values()) == 0
    assert published(tmp_path / "out") == expected  # every record once: one run's output


def test_a_rescaled_run_with_a_killed_executor_restarts_and_commits_every_record_once(tmp_path, monkeypatch,
                                                                                       reference):
    data, expected = reference
    write_files(tmp_path / "in", data)
    stopped(tmp_path, monkeypatch, 2, "shm", resume=False)
    (tmp_path / "marks").mkdir()
    monkeypatch.setenv(chaos.KILLS_ENV, "align:1")  # an executor SIGKILLed in the first alignment on 3
    monkeypatch.setenv(chaos.MARKS_ENV, str(tmp_path / "marks"))
    # (until it fired the job cannot end: the rest of the stream aligns 1-2 times per executor)
    paced = job.flow(tmp_path, until_fired(tmp_path / "marks", "align:1"))
    result = slashrt.run(paced, {"events": job.source(tmp_path)}, executors=3,
                         checkpoint={"interval": 0.01, "keep": 3}, checkpoint_dir=tmp_path / "chk",
                         resume_from="latest", restart="fixed-delay:attempts=5,delay=0", **RING)
    assert len(list((tmp_path / "marks").iterdir())) == 1 and len(result.recoveries) == 1
    assert "killed by signal 9 (SIGKILL)" in result.recoveries[0]["cause"], result.recoveries
    assert published(tmp_path / "out") == expected


def test_the_command_line_resumes_a_file_source_on_another_count(tmp_path, monkeypatch, reference, capsys):
    data, expected = reference
    write_files(tmp_path / "in", data)
    stopped(tmp_path, monkeypatch, 2, "shm", resume=False)
    monkeypatch.setenv("SLASHRT_TEST_OUT", str(tmp_path))
    args = ["run", f"{JOB}:job", "--checkpoint-dir", str(tmp_path / "chk"), "--resume-from", "latest", "--slots", "4",
            "--slot-size", "1024"]
    assert main([*args, "--executors", "3"]) == 0, capsys.readouterr().err
    assert published(tmp_path / "out") == expected


def test_files_changed_among_the_checkpointed_ones_are_refused_and_added_ones_wait(tmp_path, monkeypatch, reference,
                                                                                     capsys):
    data, expected = reference
    write_files(tmp_path / "in", data)
    stopped(tmp_path, monkeypatch, 2, "shm", resume=False)
    with pytest.raises(SlashError, match=r"cannot resume on 1: its run read source 'w.events' from files \(a "
                                         r"FileSource\), and it is given an array now: give it the FileSource$"):
        slashrt.run(job.flow(tmp_path), {"events": data}, checkpoint_dir=tmp_path / "chk", resume_from="latest", **RING)
    # and the other way round: a checkpoint of an array resumed with files
    slashrt.run(job.flow(tmp_path / "arrays"), {"events": data[:3000]}, executors=2, checkpoint_dir=tmp_path / "achk",
                **RING)
    with pytest.raises(SlashError, match=r"cannot resume on 1: it holds no file position of source 'w.events' on each "
                                         r"of its executors: it was written by another dataflow or from another kind "
                                         r"of input; resume it with the dataflow and input that wrote it$"):
        # (into the arrays run's own output: another sink's published checkpoints are refused first)
        slashrt.run(job.flow(tmp_path / "arrays"), {"events": job.source(tmp_path)}, checkpoint_dir=tmp_path / "achk",
                    resume_from="latest", **RING)
    shutil.move(tmp_path / "in" / "part-6.npy", tmp_path / "part-6.npy")
    refused = (r"^FileSource '[^']+': the checkpoint was taken over 7 files, which are not the first 7 listed now \(6\): "
               r"files were removed, renamed or added among them; restore them to resume exactly$")
    with pytest.raises(SlashError, match=refused):
        slashrt.run(job.flow(tmp_path), {"events": job.source(tmp_path)}, executors=3, checkpoint_dir=tmp_path / "chk",
                    resume_from="latest", **RING)
    monkeypatch.setenv("SLASHRT_TEST_OUT", str(tmp_path))
    capsys.readouterr()  # (what the runs before logged: warnings on a loaded machine)
    code = main(["run", f"{JOB}:job", "--checkpoint-dir", str(tmp_path / "chk"), "--resume-from", "latest",
                 "--executors", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and re.search(refused[1:], err), err
    assert not list((tmp_path / "out").glob("*.inprogress"))  # nothing ran
    # restored, and a file sorting after them added: left for a next source (as on the same count)
    shutil.move(tmp_path / "part-6.npy", tmp_path / "in" / "part-6.npy")
    np.save(tmp_path / "in" / "part-7.npy", records(1000, len(data)))
    slashrt.run(job.flow(tmp_path), {"events": job.source(tmp_path)}, executors=1, checkpoint_dir=tmp_path / "chk",
                resume_from="latest", **RING)
    assert published(tmp_path / "out") == expected


def test_old_cursors_give_every_file_its_start_over_the_starts_the_old_readers_had(tmp_path):
    write_files(tmp_path / "in", records(700))  # 7 files
    source = FileSource(tmp_path / "in")
    cursor = {"files": 7, "listing": source._cursor()["listing"]}

    def at(file, offset, skip, executors):
        return {"cursor": {**cursor, "file": file, "offset": offset, "executors": executors}, "skip": skip}

    # old executor 0 of 2 (files 0 2 4 6) inside file 2 with 40 fed past it; executor 1 (1 3 5)
    # done with file 1, 30 records into file 3 (its next own file after the cursor's file 2)
    first = source.rescaled_starts([at(2, 7, 40, 2), at(2, 0, 30, 2)], 2, None)
    assert first["starts"] == [DONE, DONE, 47, 30, 0, 0, 0] and first["files"] == 7
    # then on 3 (files 0 3 6 | 1 4 | 2 5), over those starts: executor 0 finished file 3 and has
    # not begun 6; 1 is 5 records into file 4; 2 stands at the start of its file 2 (begun at 47) with 3 fed
    second = source.rescaled_starts([at(6, 0, 0, 3), at(4, 5, 0, 3), at(0, 0, 3, 3)], 3, first["starts"])
    assert second["starts"] == [DONE, DONE, 50, DONE, 5, 0, 0]
    readers = [source.restarted(second, j, 2) for j in range(2)]  # on 2: files 2 4 6 | 5
    read = [[(int(r["t"][0]), len(r)) for r, _ in reader._batches(SCHEMA, reader.position) if len(r)] for reader in readers]
    sizes = [len(np.load(f)) for f in source.files]
    assert read == [[(sum(sizes[:2]) + 50, sizes[2] - 50), (sum(sizes[:4]) + 5, sizes[4] - 5),
                     (sum(sizes[:6]), sizes[6])], [(sum(sizes[:5]), sizes[5])]]
    with pytest.raises(SlashError, match="positions index different listings"):
        source.rescaled_starts([at(2, 7, 40, 2), at(2, 0, 30, 3)], 2, None)
