"""The README's pipeline, walked as written but scaled down (issue 28): its `specdraft` lines are
read from README.md, pointed at the tiny target with a few samples, and run as CLI subprocesses in
a fresh folder. The report they leave must show the eval τ and the training data the model card
names: a README path that leaves either out gives a weaker report than the demo's."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from specdraft import run_layout

ROOT = Path(__file__).parent.parent
SCALE = {"--limit": "8", "--size": "64", "--epochs": "1"}    # the README's values, scaled down
EXTRA = {"prepare": ["--max-new-tokens", "12", "--batch-size", "8"],
         "capture": ["--store-dtype", "float32", "--batch-tokens", "256"],
         "train": ["--max-tokens", "128", "--precision", "fp32", "--val-fraction", "0.25", "--warmup-steps", "1"],
         "bench": ["--limit", "1", "--max-new-tokens", "8", "--rounds", "1", "-k", "2"]}
SKIP = {"info", "generate", "doctor"}   # they print (doctor: its own tests, tests/test_doctor.py)


def readme_commands() -> list[list[str]]:
    """The `specdraft ...` lines of the README's pipeline block, comments cut."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("## The pipeline"):]
    block = block[block.index("```bash") + 7:block.index("```", block.index("```bash") + 7)]
    return [shlex.split(line.split("  #")[0]) for line in block.splitlines() if line.startswith("specdraft ")]


def scaled(argv: list[str], target: Path) -> list[str]:
    out = []
    for i, word in enumerate(argv):
        before = argv[i - 1] if i else ""
        out.append(str(target) if before in ("--model", "-m") else SCALE.get(before, word))
    if out[1] == "bench":
        out[out.index("--methods") + 1] = "greedy,eagle3"
        out = [w for j, w in enumerate(out) if not (w == "--limit" or j and out[j - 1] == "--limit")]
    return out[1:] + EXTRA.get(out[1], [])


TAU_VALUE = re.compile(r"τ\s*[=:]?\s*[-+]?\d")                 # a τ followed by a number
TAU_FORMAT = re.compile(r"τ \d+\.\d+ at K=\d+ on \S")              # metrics.tau_text's one format


def scan_tau(texts: list[str]) -> None:
    """Every τ printed with a number reads "τ 1.23 at K=3 on <prompts>" (metrics.tau_text)."""
    bare = [text[max(m.start() - 40, 0):m.start() + 60] for text in texts for m in TAU_VALUE.finditer(text)
            if not TAU_FORMAT.match(text, m.start())]
    assert not bare, bare


def html_text(page: str) -> str:
    from html.parser import HTMLParser

    parts = []
    parser = HTMLParser()
    parser.handle_data = parts.append
    parser.feed(page)
    return " | ".join(parts)


def test_scan_tau_finds_a_tau_without_its_k():
    scan_tau(["eval: τ 1.815 at K=3 on 26 held-out store samples", "τ loss 0.47", "τ (K)", "τ by K  K=1:1.43"])
    for bare in ("doctor: τ 1.47 < 2.0", "val τ 1.7120", "τ=1.47", "τ 1.86 on held-out store samples"):
        try:
            scan_tau([bare])
        except AssertionError:
            continue
        raise AssertionError(f"scan_tau let {bare!r} through")


def folder_state(folder: Path) -> dict[str, tuple[int, int]]:
    """{path under `folder`: (size, mtime_ns)} of every file in it ({} before it exists)."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file()} if folder.is_dir() else {}


def changed_names(before: dict, after: dict) -> set[str]:
    """The top-level names under which a file was created, changed or removed between two folder_states."""
    return {path.split(os.sep)[0] for path in set(before) | set(after) if before.get(path) != after.get(path)}


def test_the_owner_check_finds_a_file_written_by_another_command(tmp_path):
    (tmp_path / "eval.json").write_text("{}")
    before = folder_state(tmp_path)
    (tmp_path / "bench.json").write_text("{}")
    (tmp_path / "journal.md").write_text("note")
    written = changed_names(before, folder_state(tmp_path))
    assert written == {"bench.json", "journal.md"}
    assert [n for n in written if not run_layout.may_write("eval", n)] == ["bench.json"]
    assert all(run_layout.may_write("bench", n) for n in written | {"bench.png", ".specdraft.lock"})


def test_readme_pipeline_report_has_eval_tau_and_the_cards_data_line(tiny_target, tmp_path):
    commands = readme_commands()
    assert [c[1] for c in commands][:6] == ["info", "prepare", "capture", "vocab", "train", "eval"], commands
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "SPECDRAFT_LOG_EVERY_S": "0"}
    stderr, printed = {}, []
    run_dir = tmp_path / "ws" / "runs" / "a"
    for argv in commands:
        if argv[1] in SKIP:
            continue
        args = scaled(argv, tiny_target)
        before = folder_state(run_dir)
        run = subprocess.run([sys.executable, "-m", "specdraft.cli", *args], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, (args, run.stderr[-3000:])
        written = changed_names(before, folder_state(run_dir))     # issue 58: RUN written by its owners only
        assert not [n for n in written if not run_layout.may_write(args[0], n)], (args[0], written)
        assert "Traceback" not in run.stderr, run.stderr
        assert not [line for line in run.stderr.splitlines() if line.startswith("error")], run.stderr
        stderr[args[0]] = run.stderr
        printed.append(run.stdout + run.stderr)
    # data-quality notes where they are found: 2 held-out samples (a quarter of 8) make a noisy τ
    assert "warning: τ from 2 sample(s) is noisy" in stderr["eval"], stderr["eval"]
    eval_result = json.loads((run_dir / "eval.json").read_text())
    card = (tmp_path / "ws" / "export" / "vllm" / "README.md").read_text()
    data_line = next(line for line in card.splitlines() if line.startswith("| training data |"))
    samples = re.search(r"\| training data \| (\d+) samples, (\d+) tokens", data_line)
    assert samples, data_line
    assert "unknown" not in next(line for line in card.splitlines() if "target fingerprint" in line)
    tau_line = next(line for line in card.splitlines() if line.startswith("| τ at K="))
    assert "(eval," in tau_line, tau_line
    assert f"vllm serve {(tmp_path / 'ws' / 'export' / 'vllm').resolve()}\n" in card   # speculators' short form
    report = (run_dir / "report.html").read_text()
    shown = (f"<b>τ {eval_result['accept_len']:.2f} at K={eval_result['k']} on {eval_result['samples']} held-out "
             "store samples</b>")                                # τ with its K and its samples (issue 36)
    assert shown in report, "the eval τ is missing from the report"
    assert f"{int(samples.group(1)):,} samples, {int(samples.group(2)):,} tokens" in report
    # issue 36: no τ the pipeline shows a person (console, journal, card, report) without its K and prompts
    scan_tau(printed + [(run_dir / "journal.md").read_text(), card, html_text(report)])
    # --split all measures on the samples the drafter trained on too, and says so
    every = subprocess.run([sys.executable, "-m", "specdraft.cli", "eval", "--model", str(tiny_target), "--drafter",
                            "ws/runs/a", "--store", "ws/hidden", "--split", "all"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
    assert every.returncode == 0 and "warning: --split all includes the samples the drafter trained on" in every.stderr


def test_readme_first_screen_names_the_recipe_the_doctor_and_benchs_time():
    """Issue 36: the first screen explained the test internals but not how to train a drafter for
    your own model; `doctor` was never mentioned; the bench line gave no time expectation; SGLang was
    presented as an equal target for the quick recipe's drafter, which export refused: the Serve
    section says which SGLang release serves it (EAGLE-3.1's options) and what SGLang still lacks."""
    text = (ROOT / "README.md").read_text()
    first_screen = "\n".join(text.splitlines()[:15])
    assert "specdraft recipe MODEL" in first_screen
    commands = [argv[1] for argv in readme_commands()]
    assert "doctor" in commands and commands.index("doctor") > commands.index("bench")
    bench = next(line for line in text.splitlines() if line.startswith("specdraft bench"))
    assert "min on 2 CPU cores" in bench
    serve = text[text.index("## Serve it"):]
    assert "fc_norm" in serve[:800] and "sgl-project/sglang#24663" in serve[:800]
    assert "norm_before_residual" in serve[:800] and "--no-norm-before-residual" in serve[:800]


def test_docs_examples_print_tau_in_the_one_format():
    """Issue 36 item 3: docs/analysis.md showed the doctor's output as "τ 1.86 on held-out store
    samples (4 draft positions)" and "τ 1.47 < 2.0": every example block in the README and docs/
    shows τ the way metrics.tau_text prints it."""
    blocks = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        parts = path.read_text().split("```")
        blocks += [f"{path.name}: {block}" for block in parts[1::2]]
    assert len(blocks) > 10
    scan_tau(blocks)
