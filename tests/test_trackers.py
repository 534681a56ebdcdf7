"""`train --report-to`: a tiny run logs to tensorboard, trackio and wandb (offline, in tmp folders)
and each tracker holds the values metrics.jsonl holds; a missing tracker is one line before training."""

import json
import sqlite3
import struct
import sys

import pytest

from specdraft.errors import SpecdraftError
from specdraft.train import command
from specdraft.train.config import RunConfig, resolve_config
from specdraft.train.loop import train
from test_train import config, read_metrics, ws  # noqa: F401  (ws: the tiny workspace fixture)


def wandb_history(path) -> list[dict]:
    """History rows of an offline run's .wandb file (leveldb-log framing: 32 KiB blocks of records,
    each with a 7-byte header: crc, length, type FULL=1/FIRST=2/MIDDLE=3/LAST=4)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, chunks, rows = path.read_bytes(), 7, [], []     # 7: the ':W&B' file header
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:                              # a block's tail too short for a header
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunks.append(data[pos + 7:pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            if record.WhichOneof("record_type") == "history":
                items = record.history.item
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return rows


def test_report_to_each_tracker_holds_the_metrics(ws, tmp_path, monkeypatch):  # noqa: F811
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    import trackio.sqlite_storage

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    (tmp_path / "wandb").mkdir()
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    monkeypatch.setattr(trackio.sqlite_storage, "TRACKIO_DIR", tmp_path / "trackio")   # read at import
    run = tmp_path / "run"
    train(config(ws, run, epochs=1, report_to="tensorboard,trackio,wandb"))
    records = read_metrics(run)
    val = [r for r in records if r["split"] == "val"][-1]
    train_rec = [r for r in records if r["split"] == "train"][-1]
    step, loss = val["step"], val["metrics"]["loss"]

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    tb = {e.step: e.value for e in events.Scalars("val/loss")}
    assert tb[step] == pytest.approx(loss, rel=1e-6)             # event files hold float32
    assert {e.step: e.value for e in events.Scalars("grad_norm")}[train_rec["step"]] == \
        pytest.approx(train_rec["grad_norm"], rel=1e-6)

    db = sqlite3.connect(tmp_path / "trackio" / "specdraft.db")
    rows = [(s, json.loads(m)) for s, m in db.execute("SELECT step, metrics FROM metrics WHERE run_name = 'run'")]
    assert [m["val/loss"] for s, m in rows if s == step and "val/loss" in m] == [loss]
    assert json.loads(db.execute("SELECT config FROM configs WHERE run_name = 'run'").fetchone()[0])["report_to"] \
        == "tensorboard,trackio,wandb"

    (wandb_file,) = (tmp_path / "wandb").glob("wandb/offline-run-*/run-*.wandb")
    history = wandb_history(wandb_file)
    assert [h["val/loss"] for h in history if h.get("_step") == step and "val/loss" in h] == [loss]
    assert any(h.get("lr") == train_rec["lr"] for h in history)


def test_report_to_names_are_checked():
    assert RunConfig(report_to="none").check().report_to == "none"
    with pytest.raises(SpecdraftError, match="unknown tracker mlflow"):
        RunConfig(report_to="wandb,mlflow").check()


def test_old_tensorboard_setting_still_resumes(tmp_path):
    """A config.yaml saved before --report-to has `tensorboard: true|false`."""
    (tmp_path / "config.yaml").write_text("tensorboard: true\n")
    assert resolve_config(tmp_path / "config.yaml").report_to == "tensorboard"
    (tmp_path / "config.yaml").write_text("tensorboard: false\n")
    assert resolve_config(tmp_path / "config.yaml").report_to == "none"


def test_missing_tracker_is_one_line_before_training(ws, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setitem(sys.modules, "wandb", None)              # `import wandb` now raises ImportError
    line = "--report-to wandb: wandb is not installed; pip install wandb"
    with pytest.raises(SpecdraftError) as e:
        train(config(ws, tmp_path / "run", report_to="wandb"))
    assert str(e.value) == line
    assert not (tmp_path / "run").exists()
    # the command: exit 2 and that one line, before reading any input
    assert command.main(["--report-to", "tensorboard,wandb", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {line}"
