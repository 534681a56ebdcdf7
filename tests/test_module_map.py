"""docs/DESIGN.md's module map is generated from the code (scripts/module_map.py) and kept current."""

import runpy
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "scripts" / "module_map.py"


def test_the_design_docs_module_map_is_current():
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_module_map_names_every_module():
    script = runpy.run_path(str(SCRIPT))
    text = script["module_map"]()
    package = ROOT / "src" / "specdraft"
    files = [p for p in package.rglob("*.py") if "__pycache__" not in p.parts]
    assert len(files) > 50
    missing = [p.relative_to(package).as_posix() for p in files if f"`{p.relative_to(package).as_posix()}`" not in text]
    assert not missing, f"modules missing from scripts/module_map.py's map: {missing}"
