"""slashrt's modules import each other without cycles, lazy imports counted (scripts/import_cycles.py)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_no_module_imports_a_layer_above_it_even_lazily():
    done = subprocess.run(
        [sys.executable, "scripts/import_cycles.py", "slashrt"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["module-level []", "all imports []"]


def test_a_cycle_is_found_and_named(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from pkg.high import g\n    return g\n")
    (pkg / "high.py").write_text("from pkg.low import f\n\ndef g():\n    return f\n")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts/import_cycles.py"), "pkg"], cwd=tmp_path, capture_output=True, text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "pkg.high" in done.stdout and "pkg.low" in done.stdout
