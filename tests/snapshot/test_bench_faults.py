"""`slashrt bench chaos --faults`: each store fault's trial runs a real job into a transactional
CSV directory, damages its newest checkpoint after the sink published it, resumes, and reports
refused or exact with no duplicates nor missing rows (one JSON object, a result per fault); an
unknown fault name gets one sentence listing the known ones."""

import json

from slashrt.bench import faults
from slashrt.cli import main


def test_the_store_faults_are_refused_or_exact(capsys):
    # (on one executor as well: tests/snapshot/test_published.py)
    assert main(["bench", "chaos", "--faults", "corrupt-newest,lose-newest", "--executors", "2",
                 "--events", "40000", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [r["fault"] for r in result["faults"]] == ["corrupt-newest", "lose-newest"] and result["correct"]
    for r in result["faults"]:
        assert r["refused"] or r["exact"]
        assert r["duplicates"] == 0 and r["missing"] == 0 and r["published_rows"] > 0
        if r["refused"]:
            assert r["cause"].startswith("sink 'faults.out' (CsvFile(") and f"checkpoint {r['damaged']}" in r["cause"]


def test_an_unknown_fault_is_named_with_the_known_ones(capsys):
    assert main(["bench", "chaos", "--faults", "corrupt-newest,nope", "--json"]) == 2
    assert capsys.readouterr().err.strip() == (
        "slashrt: error: unknown fault(s) nope: --faults takes a comma-separated list of " + ", ".join(faults.FAULTS))


def test_a_fault_is_one_line_in_the_registry():
    assert {"corrupt-newest", "lose-newest"} <= set(faults.FAULTS) and all(callable(t) for t in faults.FAULTS.values())
