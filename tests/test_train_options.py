"""`specdraft train` and `python -m specdraft.train` (torchrun) take exactly RunConfig's settings plus
the launcher's options, with RunConfig's defaults: a setting cannot drift between the three."""

import dataclasses

import pytest
import typer

from specdraft.cli import app
from specdraft.errors import SpecdraftError
from specdraft.train import command
from specdraft.train.config import RunConfig, resolve_config

LAUNCHER = {"config", "nproc", "parallel", "online", "prepared", "engine", "tensor_parallel_size", "engine_args",
            "store_format"}


def train_options(cmd) -> dict:
    return {p.name: p for p in cmd.params if p.name != "help"}


@pytest.fixture(scope="module")
def commands():
    cli_train = typer.main.get_command(app).commands["train"]
    return cli_train, typer.main.get_command(command.module_app())   # what torchrun runs


def test_every_setting_is_one_option_with_its_default(commands):
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    for cmd in commands:
        options = train_options(cmd)
        assert set(options) - set(fields) == LAUNCHER == command.LAUNCHER
        assert set(fields) <= set(options)
        for name, f in fields.items():
            expected = [f.default] if options[name].multiple else f.default   # --store A --store B: a list
            assert options[name].default == expected, name
            assert options[name].help == f.metadata["help"], name
            assert options[name].opts[0] == "--" + name.replace("_", "-")
    cli_opts = {name: (p.opts, p.secondary_opts) for name, p in train_options(commands[0]).items()}
    assert cli_opts == {name: (p.opts, p.secondary_opts) for name, p in train_options(commands[1]).items()}


def test_documented_flags_still_parse(commands):
    flags = {o for p in commands[0].params for o in (*p.opts, *p.secondary_opts)}
    assert {"--ttt-steps", "--no-progress", "--norm-before-residual", "--no-norm-before-residual", "--remap",
            "--no-remap", "--overwrite", "--resume", "--train-on-prompts", "-m", "--config", "--nproc",
            "--parallel", "--online", "--prepared", "--engine", "--tensor-parallel-size", "--engine-args"} <= flags


def test_flags_and_yaml_are_checked_alike(tmp_path):
    (tmp_path / "run.yaml").write_text("loss: xx\n")
    with pytest.raises(SpecdraftError, match="--loss xx: use kl, ce, tv or jsd"):
        resolve_config(tmp_path / "run.yaml")
    with pytest.raises(SpecdraftError, match="--schedule step: use cosine, linear or constant"):
        resolve_config(schedule="step")
    with pytest.raises(SpecdraftError, match="--ttt-steps 8: must be 1..7"):
        resolve_config(ttt_steps=8)
    with pytest.raises(SpecdraftError, match="loss is 3"):
        RunConfig.from_dict({"loss": 3})
    # flags override the file; the file overrides the defaults
    (tmp_path / "run.yaml").write_text("epochs: 4\nlr: 3e-3\nrecipe: {samples: 6}\n")
    cfg = resolve_config(tmp_path / "run.yaml", lr=1e-3)
    assert (cfg.epochs, cfg.lr, cfg.ttt_steps) == (4, 1e-3, 3)


def test_module_entry_refuses_a_bad_flag_in_one_line(capsys, tmp_path):
    assert command.main(["--ttt-steps", "9", "--out", str(tmp_path / "r")]) == 2
    assert "--ttt-steps 9: must be 1..7" in capsys.readouterr().err
    assert command.main(["--no-such-flag"]) == 2
    assert command.main(["--help"]) == 0
