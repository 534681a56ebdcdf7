"""Nothing lost, round 4 (issue 37): one test (or a few) per class of the round. Each runs the CLI
in-process and asserts exit 2 with one stderr line naming the file, the field and the fix, with
earlier outputs byte-identical (bad_workspace.check_refusal), or that the result is right."""

from __future__ import annotations

import json

from bad_workspace import run_cli, ws  # noqa: F401  (ws is a fixture)


# ----------------------------------------------------------------------------- 7. errors you can type

def test_error_text_is_never_read_as_markup(ws, monkeypatch, capsys):
    """A message holding `[/b]` printed whole (rich raised MarkupError), a folder run[lr=3e-3]
    named whole (rich ate `[lr=3e-3]` as a style tag)."""
    for name in ("run[lr=3e-3]", "x[/b]"):
        folder = ws["root"] / name
        folder.mkdir(parents=True, exist_ok=True)   # x[/b] is x[ / b]: the path still holds [/b]
        code, err, _ = run_cli(monkeypatch, capsys, ["compare", folder])
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and "Traceback" not in err, err
        assert len(lines) == 1 and f"{folder}: no metrics.jsonl" in lines[0], err


def test_old_flag_names_point_to_the_new_ones(ws, monkeypatch, capsys):
    code, err, _ = run_cli(monkeypatch, capsys, ["plan", "--accept", "0.5", "-k", "3"])
    assert code == 2 and "No such option: -k (Possible options: --max-k)" in err, err
    out = ws["root"] / "bench-old.json"
    code, err, _ = run_cli(monkeypatch, capsys, ["bench", "--json", out])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert f"--json {out}: --json takes no value" in lines[0] and f"--out {out}" in lines[0], err
    assert not out.exists()
