"""Nothing lost, round 4 (issue 37): the items its first pass left open (docs/reliability.md):
resume mismatches of options outside RunConfig, `store convert` and `export --out` after a kill,
every suggested command parses, partly overlapping stores. Each test failed before its fix."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import typer

from bad_workspace import run_cli, ws  # noqa: F401  (ws is a fixture)

SRC = Path(__file__).resolve().parents[1] / "src" / "specdraft"


# ----------------------------------------------------------------------------- 7. every suggested command parses

HOLE = "\0"
# where a suggested command ends inside a message
COMMAND_END = re.compile(r"`|;|\(|\)|,\s|\n|<| or | then | and |\.\s|\.$|\"|'|: ")


def _text(node) -> str | None:
    """A string literal's text; an f-string's with each {expression} as a hole (F: a run of flags)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else
                       HOLE + ("F" if "flags" in ast.unparse(v.value) else "V") + HOLE for v in node.values)
    return None


def suggested_commands(commands: set[str]) -> list[tuple[str, str]]:
    """(where, command) for every `specdraft SUB ...` in a string or f-string of the sources."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        inner = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
        for node in ast.walk(tree):
            text = None if id(node) in inner else _text(node)
            for m in re.finditer(r"\bspecdraft ([a-z]+)\b", text or ""):
                if m.group(1) in commands:
                    rest = text[m.start():]
                    end = COMMAND_END.search(rest, m.end() - m.start())
                    found.append((f"{path.relative_to(SRC)}:{node.lineno}", (rest[:end.start()] if end else rest).strip()))
    return found


def words(command: str) -> list[str]:
    """The command's arguments after `specdraft`: an f-string hole is a value (1) or, for a run of
    flags, nothing; a placeholder in capitals (RUN, N, K, WS/hidden...) is a value as it stands."""
    command = command.replace(f"{HOLE}F{HOLE}", " ").replace(f"{HOLE}V{HOLE}", "1")
    command = command.replace("[", "").replace("]", "").replace("...", "")
    out = [("1" if re.fullmatch(r"[A-Z_]+", word) else word)    # N, K as numbers parse; RUN as a path too
           for word in shlex.split(command)[1:]]
    return out[:-1] if out and out[-1].startswith("-") else out   # `capture --store-format`: naming a flag


def parse_error(cmd, name: str, args: list[str]) -> str | None:
    """What the parser (typer's click) says of `args`, None when it takes them. Only the parse: no
    command runs. A required option or argument that a fragment leaves out (`capture --resume`
    means the same command again with --resume) is filled with a value, so that what the fragment
    does say is still checked whole (click reports a missing option before an extra argument)."""
    args = list(args)
    for _ in range(len(cmd.params) + 1):
        try:
            cmd.make_context(name, list(args))
            return None
        except Exception as e:    # typer vendors click: its exception classes are named, not imported
            param = getattr(e, "param", None)
            if type(e).__name__ == "MissingParameter" and param is not None:
                args += ["1"] if param.param_type_name == "argument" else [param.opts[0], "1"]
                continue
            return e.format_message() if hasattr(e, "format_message") else str(e)
    return f"still missing parameters after filling them: {args}"


def test_every_command_the_tool_suggests_parses():
    """Each `specdraft ...` in an error, a note or a next-step line names a command, options it has
    and values they take (required options a fragment leaves out are fine: `capture --resume`
    means the same command again with --resume)."""
    from specdraft import cli

    root = typer.main.get_command(cli.app)
    found = suggested_commands(set(root.commands))
    assert len(found) > 50, found          # the sources' suggestions were found at all
    bad = []
    for where, command in found:
        args = words(command)
        cmd, name = root, "specdraft"
        while hasattr(cmd, "commands") and args and args[0] in cmd.commands:   # store convert, vocab build
            cmd, name = cmd.commands[args[0]], f"{name} {args[0]}"
            args = args[1:]
        error = parse_error(cmd, name, args)
        if error:
            bad.append(f"{where}: {command.replace(HOLE, '')!r}: {error}")
    assert not bad, "\n".join(bad)


def test_the_checker_finds_a_command_that_does_not_parse():
    """The check above can fail: an old flag name, an unknown command's option and a value of the
    wrong type are each caught."""
    from specdraft import cli

    root = typer.main.get_command(cli.app)
    for command in ("specdraft plan -k 3", "specdraft export RUN --json FILE", "specdraft eval --drafter RUN -k many"):
        args = words(command)
        assert parse_error(root.commands[args[0]], args[0], args[1:]), command
