"""The shape of the code, checked: train/ reads top to bottom in short functions (issue 15)."""

import ast
from pathlib import Path

TRAIN = Path(__file__).parent.parent / "src" / "specdraft" / "train"
MAX_FUNCTION_BODY = 60      # lines
MAX_LOOP = 250              # lines of train/loop.py


def function_lengths(path: Path) -> dict[str, int]:
    """{qualified name: lines of its body (docstring included)} for every function in `path`."""
    lengths = {}

    def visit(node, prefix=""):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lengths[prefix + child.name] = child.end_lineno - child.body[0].lineno + 1
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")

    visit(ast.parse(path.read_text()))
    return lengths


def test_train_functions_are_short():
    long = {f"{path.name}:{name}": n for path in sorted(TRAIN.glob("*.py"))
            for name, n in function_lengths(path).items()
            if n > MAX_FUNCTION_BODY}
    assert not long, f"functions over {MAX_FUNCTION_BODY} lines in train/: {long}"
    loop_lines = len((TRAIN / "loop.py").read_text().splitlines())
    assert loop_lines < MAX_LOOP, f"train/loop.py has {loop_lines} lines (keep it under {MAX_LOOP})"


def test_lower_layers_never_import_higher_ones():
    """The import-linter contract in pyproject.toml (the layers docs/DESIGN.md draws) holds, counting
    imports inside functions too."""
    import subprocess
    import sys

    root = Path(__file__).parent.parent
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 kept, 0 broken" in result.stdout


def test_cli_is_wiring():
    """cli.py parses, calls the stage and prints (issue 28): the stages' logic lives in their modules,
    the flags' vocabulary in flags.py; 736 lines of it once held both, and aliases besides."""
    cli = Path(__file__).parent.parent / "src" / "specdraft" / "cli.py"
    lines = len(cli.read_text().splitlines())
    assert lines <= 400, f"src/specdraft/cli.py has {lines} lines (keep it to 400: wiring only)"
    assert "old_name" not in cli.read_text() and "renamed(" not in cli.read_text()
