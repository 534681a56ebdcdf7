"""The shape of the code, checked: train/ reads top to bottom in short functions (issue 15); no
function in src/ over 60 lines, no import cycle, RUN's file names spelled in run_layout.py only
(issue 39). Each check is also run on a planted violation, so that it can fail."""

import ast
from pathlib import Path

SRC = Path(__file__).parent.parent / "src"
TRAIN = SRC / "specdraft" / "train"
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


# ----------------------------------------------------------------------------- issue 39

def long_functions(package: Path) -> dict[str, int]:
    """{"sub/file.py:function": body lines} of every function in `package` over MAX_FUNCTION_BODY."""
    return {f"{path.relative_to(package).as_posix()}:{name}": n for path in sorted(package.rglob("*.py"))
            for name, n in function_lengths(path).items() if n > MAX_FUNCTION_BODY}


def test_no_function_in_src_is_over_60_lines():
    long = long_functions(SRC / "specdraft")
    assert not long, f"functions over {MAX_FUNCTION_BODY} lines in src/specdraft: {long}"


def test_the_length_check_finds_a_planted_long_function(tmp_path):
    lines = [f"x{i} = {i}" for i in range(MAX_FUNCTION_BODY)]
    fits = "def fits():\n" + "".join(f"    {line}\n" for line in lines)
    too_long = "class C:\n    def too_long(self):\n" + "".join(f"        {line}\n" for line in lines) + "        return x0\n"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "planted.py").write_text(fits + "\n\n" + too_long)
    assert long_functions(tmp_path) == {"sub/planted.py:C.too_long": MAX_FUNCTION_BODY + 1}


def import_graph(src: Path) -> dict[str, set[str]]:
    """{module: the specdraft modules it imports} for every module under `src` (a folder holding
    packages), imports inside functions included; `from P import m` is an edge to the module P.m."""
    def name_of(path: Path) -> str:
        parts = path.relative_to(src).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    paths = {name_of(p): p for p in sorted(src.rglob("*.py"))}

    def module(name: str) -> str | None:     # the module a dotted name lives in
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {module(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                found |= {module(f"{base}.{a.name}") for a in node.names}
        graph[name] = found - {None, name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle ([a, b, ..., a]) in `graph`, else None (depth-first, modules in name order)."""
    done, path = set(), []

    def visit(name):
        path.append(name)
        for other in sorted(graph.get(name, ())):
            if other in path:
                return path[path.index(other):] + [other]
            if other not in done:
                cycle = visit(other)
                if cycle:
                    return cycle
        path.pop()
        done.add(name)
        return None

    for name in sorted(graph):
        cycle = None if name in done else visit(name)
        if cycle:
            return cycle
    return None


def test_no_import_cycle_among_specdraft_modules():
    graph = import_graph(SRC)
    assert {"specdraft.kernels", "specdraft.targets"} <= graph["specdraft.infer.speculative"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_planted_cycle(tmp_path):
    """kernels <-> speculative as it was (issue 39): one import at the top, the other in a function."""
    pkg = tmp_path / "specdraft" / "infer"
    pkg.mkdir(parents=True)
    (tmp_path / "specdraft" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "kernels.py").write_text("def describe(model):\n    from specdraft.infer.speculative import target_linears\n")
    (pkg / "speculative.py").write_text("from specdraft.infer import kernels\n\ndef target_linears(m):\n    pass\n")
    (pkg / "auto.py").write_text("from .speculative import target_linears\n")
    graph = import_graph(tmp_path)
    assert graph["specdraft.infer.auto"] == {"specdraft.infer.speculative"}
    cycle = find_cycle(graph)          # found from auto: speculative -> kernels -> speculative
    assert cycle == ["specdraft.infer.speculative", "specdraft.infer.kernels", "specdraft.infer.speculative"]
    (pkg / "kernels.py").write_text("def describe(model):\n    pass\n")
    assert find_cycle(import_graph(tmp_path)) is None


def run_file_names() -> set[str]:
    """The names run_layout.py gives RUN's files and folders (its string constants). The trackers'
    folders (tensorboard/, wandb/) are the tracker libraries' names, not ours."""
    from specdraft import run_layout

    return {value for name, value in vars(run_layout).items() if name.isupper() and isinstance(value, str)}


def spelled_run_files(path: Path, names: set[str]) -> list[str]:
    """'line: "text"' for each string literal in `path` that spells one of RUN's names: a file name
    (metrics.jsonl, bench.json, ...) or checkpoints anywhere, the start of a path ("checkpoints/..."),
    and a plain word (best) where it joins a path (RUN / "best"). Docstrings and prose are not literals
    that start with the name."""
    tree = ast.parse(path.read_text())
    joined = {id(node.right) for node in ast.walk(tree) if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            head = node.value.split("/")[0]
            if head in names and ("." in head or head == "checkpoints" or "/" in node.value or id(node) in joined):
                found.append((node.lineno, node.col_offset, f"{node.lineno}: {node.value!r}"))
    return [text for _, _, text in sorted(found)]


def test_run_file_names_are_spelled_in_run_layout_only():
    names = run_file_names()
    assert {"metrics.jsonl", "config.yaml", "bench.json", "eval.json", "journal.md", "best", "checkpoints"} <= names
    spelled = {str(path.relative_to(SRC)): found for path in sorted((SRC / "specdraft").rglob("*.py"))
               if path.name != "run_layout.py" and (found := spelled_run_files(path, names))}
    assert not spelled, f"RUN's file names spelled outside run_layout.py (use its names): {spelled}"


def test_the_run_file_check_finds_planted_names(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("from pathlib import Path\n"
                       "log = Path('RUN') / 'metrics.jsonl'\n"
                       "best = Path('RUN') / 'best'\n"
                       "first = 'checkpoints/epoch-1'\n"
                       "result = {'best': 1}\n"
                       "def f():\n    'Read RUN/eval.json and RUN/best.'\n    return f'{log}/bench.json'\n")
    assert spelled_run_files(planted, run_file_names()) == ["2: 'metrics.jsonl'", "3: 'best'", "4: 'checkpoints/epoch-1'"]


def internal_imports_of_public_names(folder: Path, public: dict[str, str]) -> list[str]:
    """'file:line name (from module)' for every import under `folder` that takes a name of the public API (name ->
    the module it comes from) from its internal module instead of specdraft.api."""
    found = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specdraft"):
                found += [f"{path.name}:{node.lineno} {a.name} (from {node.module})" for a in node.names
                          if public.get(a.name) == node.module]
    return found


def public_api() -> dict[str, str]:
    import specdraft.api as api

    return {name: getattr(api, name).__module__ for name in api.__all__}


def test_benchmarks_take_the_public_names_from_specdraft_api():
    """Issue 58: benchmarks/ imported ~100 internal names, so every refactor carried them. The stages' entry points
    live in specdraft.api (one import for users' scripts too); benchmarks take those from there, and reach inside
    only for what a measurement probes (the runner, the kernels, a drafter's module)."""
    public = public_api()
    assert {"load_target", "generate", "train", "export", "prepare", "capture_samples"} <= set(public)
    assert internal_imports_of_public_names(SRC.parent / "benchmarks", public) == []


def test_the_public_name_check_finds_a_planted_internal_import(tmp_path):
    (tmp_path / "bench.py").write_text("from specdraft.targets import load_target, resolve\n"
                                       "from specdraft.api import generate\n")
    assert internal_imports_of_public_names(tmp_path, public_api()) == ["bench.py:1 load_target (from specdraft.targets)"]
