"""Capture across nodes: `prepare/capture --part I/N` and `train --store A --store B` on the union."""

import json

import pytest
import torch

from specdraft import vocab as vocab_mod
from specdraft.data import store as st
from specdraft.data.prepared import parse_part, part_indices
from specdraft.data.store_parts import StoreParts
from specdraft.errors import SpecdraftError
from specdraft.targets import load_target
from specdraft.train.config import RunConfig
from specdraft.train.loop import train
from test_capture import LENGTHS, cli, make_prepared, run


pytestmark = pytest.mark.usefixtures("one_thread")   # conftest: tiny forwards, one thread


@pytest.fixture(scope="module")
def captured(tiny_target, tmp_path_factory):
    """The whole store and its two parts, each sample forwarded alone (batch_tokens=1: no padding,
    so a sample's hidden states do not depend on its neighbours), and a 48-token draft vocab."""
    root = tmp_path_factory.mktemp("parts")
    target = load_target(str(tiny_target))
    prepared = make_prepared(root / "data", target.identity)
    for name, part in (("whole", None), ("p1", (1, 2)), ("p2", (2, 2))):
        run(tiny_target, prepared, root / name, batch_tokens=1, part=part, layers=[1, 3, 5])
    store = st.HiddenStore(root / "whole")
    ids = torch.cat([store[i]["input_ids"] for i in range(len(store))])
    mask = torch.cat([store[i]["loss_mask"] for i in range(len(store))])
    counts = vocab_mod.count_tokens(ids.numpy(), mask.numpy(), target.vocab_size)
    d2t, t2d = vocab_mod.mapping_from_counts(counts, 48)
    vocab_mod.save(vocab_mod.Vocab(d2t, t2d, {"target_id": target.name, "fingerprint": target.identity["fingerprint"]}),
                   root / "vocab.safetensors")
    return {"root": root, "model": str(tiny_target), "prepared": prepared}


def test_part_is_a_deterministic_share_by_index():
    assert parse_part("2/3") == (2, 3) and parse_part(None) is None
    for bad in ("0/2", "3/2", "2", "a/b", "1/0"):
        with pytest.raises(SpecdraftError, match="must be I/N"):
            parse_part(bad)
    shares = [part_indices(10, (i, 3)) for i in (1, 2, 3)]
    assert shares == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


def test_parts_hold_their_share_and_read_back_as_the_whole(captured):
    root = captured["root"]
    whole = st.HiddenStore(root / "whole")
    p1, p2 = st.HiddenStore(root / "p1"), st.HiddenStore(root / "p2")
    assert p1.manifest["part"] == [1, 2] and len(p1) == 6 and len(p2) == 6
    union = StoreParts([root / "p2", root / "p1"])        # any order on the command line
    assert len(union) == len(LENGTHS) and union.sample_lengths == whole.sample_lengths
    for i in range(len(whole)):
        for key in ("input_ids", "loss_mask", "aux", "last"):
            assert torch.equal(union[i][key], whole[i][key]), (i, key)


def config(captured, out, store):
    root = captured["root"]
    return RunConfig(out=str(out), store=store, vocab=str(root / "vocab.safetensors"), model=captured["model"],
                     max_tokens=64, rows_per_batch=1, epochs=1, lr=2e-3, warmup_steps=2, log_every=1,
                     val_fraction=0.25, progress=False, precision="fp32", seed=3)


def test_two_part_run_gives_the_metrics_of_the_one_store_run(captured, tmp_path):
    root = captured["root"]
    one = train(config(captured, tmp_path / "one", str(root / "whole")))
    two = train(config(captured, tmp_path / "two", [str(root / "p1"), str(root / "p2")]))
    assert one["val"] and one["val"] == two["val"] and one["tokens_seen"] == two["tokens_seen"]
    assert metrics(tmp_path / "one") == metrics(tmp_path / "two")
    # eval reads the union as train did (`eval --store A --store B`): the same held-out samples, the same τ
    from specdraft.analysis.evaluate import evaluate

    parts = [root / "p1", root / "p2"]
    of_one = evaluate(tmp_path / "one", root / "whole", model=captured["model"], steps=2)
    of_two = evaluate(tmp_path / "two", parts, model=captured["model"], steps=2)
    assert "held-out samples of the run" in of_two["split"] and of_two["samples"] == of_one["samples"] > 0
    assert of_two["accept_len_by_k"] == of_one["accept_len_by_k"] and of_two["store"] == f"{parts[0]} + {parts[1]}"
    with pytest.raises(SpecdraftError, match=f"pass --store {parts[0]} --store {parts[1]} [(]the run's own"):
        evaluate(tmp_path / "two", parts[0], model=captured["model"], steps=2)


def metrics(run) -> list[dict]:
    """metrics.jsonl without its clock readings."""
    timing = ("time", "elapsed_s", "tok_per_s", "step_s")
    return [{k: v for k, v in json.loads(line).items() if k not in timing}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_mismatched_parts_are_refused_naming_part_and_field(captured, tiny_target, tmp_path, monkeypatch, capsys):
    root = captured["root"]
    run(tiny_target, captured["prepared"], tmp_path / "p2-layers", batch_tokens=1, part=(2, 2), layers=[1, 2, 5])
    with pytest.raises(SpecdraftError, match=r"p2-layers/manifest.json: --store part 2 of 2 has layer_ids \[1, 2, 5\]"):
        StoreParts([root / "p1", tmp_path / "p2-layers"])
    run(tiny_target, captured["prepared"], tmp_path / "p2-fp8", batch_tokens=1, part=(2, 2), layers=[1, 3, 5],
        store_format="fp8")
    code, err = cli(monkeypatch, capsys, "train", "--store", root / "p1", "--store", tmp_path / "p2-fp8",
                    "--vocab", root / "vocab.safetensors", "--model", tiny_target, "--out", tmp_path / "run")
    assert code == 2 and "part 2 of 2 has store_format \"fp8\"" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(SpecdraftError, match="the same part as"):
        StoreParts([root / "p1", root / "p1"])
    code, err = cli(monkeypatch, capsys, "capture", "--model", tiny_target, "--prepared", captured["prepared"],
                    "--out", tmp_path / "bad", "--part", "3/2")
    assert code == 2 and "--part 3/2: must be I/N" in err


def test_config_file_takes_a_list_of_stores(tmp_path):
    from specdraft.train.config import resolve_config

    (tmp_path / "run.yaml").write_text("store: [ws/hidden-1, ws/hidden-2]\n")
    assert resolve_config(tmp_path / "run.yaml").stores == ["ws/hidden-1", "ws/hidden-2"]
    assert resolve_config(None, store="ws/hidden").stores == ["ws/hidden"]
    (tmp_path / "bad.yaml").write_text("store: [1, 2]\n")
    with pytest.raises(SpecdraftError, match="store is .* expected a string or a list of strings"):
        resolve_config(tmp_path / "bad.yaml")
