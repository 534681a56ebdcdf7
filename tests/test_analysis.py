"""journal, compare, baseline watch: hand-written metrics.jsonl files, no training needed."""

from __future__ import annotations

import json
import math
import threading
from datetime import datetime, timezone

import pytest

from specdraft import metrics
from specdraft import journal, watch
from specdraft.analysis import compare
from specdraft.errors import SpecdraftError

TOKENS_PER_EPOCH = 100_000


def fake_run(folder, final_acc: float, speed: float = 3.0, epochs: int = 3, train_per_epoch: int = 20,
             noise: float = 0.0, nested: bool = False, seed: int = 0):
    """Write a metrics.jsonl whose acc climbs to `final_acc` (saturating in tokens), plus val points."""
    import random

    rnd = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    lines = []

    def metrics_at(tokens):
        frac = 1 - math.exp(-speed * tokens / (epochs * TOKENS_PER_EPOCH))
        acc0 = final_acc * frac
        return {"loss_0": 6.0 - 4.5 * (acc0 / 0.8), "full_acc_0": acc0, "cond_acc_0": acc0,
                "loss_1": 7.0 - 4.0 * (acc0 / 0.8), "full_acc_1": acc0 * 0.6, "cond_acc_1": 0.6,
                "accept_len": 1 + acc0 + acc0 * 0.6}

    step = 0
    for epoch in range(epochs):
        for i in range(1, train_per_epoch + 1):
            step += 1
            tokens = epoch * TOKENS_PER_EPOCH + i * TOKENS_PER_EPOCH // train_per_epoch
            m = metrics_at(tokens)
            m = {k: v + rnd.gauss(0, noise) if "acc" in k else v for k, v in m.items()}
            rec = {"split": "train", "epoch": epoch, "step": step, "tokens_seen": tokens, "lr": 1e-4}
            rec.update({"metrics": m} if nested else m)
            lines.append(rec)
        tokens = (epoch + 1) * TOKENS_PER_EPOCH
        rec = {"split": "val", "epoch": epoch, "step": step, "tokens_seen": tokens, "lr": 1e-4}
        rec.update(metrics_at(tokens))
        lines.append(rec)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return folder


# ----------------------------------------------------------------------------- journal

def test_journal_add_read_append_only(tmp_path):
    run = tmp_path / "run"
    t0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    journal.add(run, "hypothesis", "K2 weights are a good init for K2.5", now=t0)
    first = (run / "journal.md").read_text()
    journal.add(run, "result", "plateau at 38% vs 74.7% from scratch\n## not a header")
    journal.record(run, "warning", "behind baseline", source="watch")
    assert journal.record(None, "warning", "ignored", source="watch") is None
    text = (run / "journal.md").read_text()
    assert text.startswith(first)                      # earlier entries untouched
    assert "## 2025-01-02 03:04:05 UTC · hypothesis" in text
    entries = journal.read(run)
    assert [e.kind for e in entries] == ["hypothesis", "result", "warning"]
    assert entries[1].text == "plateau at 38% vs 74.7% from scratch\n## not a header"
    assert entries[2].source == "watch" and entries[0].source == ""
    assert not list(run.glob(".*.tmp"))


def test_journal_rejects_bad_input(tmp_path):
    with pytest.raises(SpecdraftError, match="--kind"):
        journal.add(tmp_path / "r", "musing", "x")
    with pytest.raises(SpecdraftError, match="empty"):
        journal.add(tmp_path / "r", "result", "  ")
    with pytest.raises(SpecdraftError, match="parent"):
        journal.add(tmp_path / "no" / "such" / "run", "result", "x")
    assert journal.read(tmp_path / "nothing") == []


def test_journal_concurrent_writers_lose_nothing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    threads = [threading.Thread(target=lambda i=i: journal.add(run, "result", f"entry {i}")) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(e.text for e in journal.read(run)) == sorted(f"entry {i}" for i in range(16))


def test_cli_journal_add(tmp_path):
    from typer.testing import CliRunner

    from specdraft.cli import app

    res = CliRunner().invoke(app, ["journal", "add", str(tmp_path / "r"), "--kind", "decision",
                                   "kill the K2 fine-tune"])
    assert res.exit_code == 0, res.output
    assert journal.read(tmp_path / "r")[0].text == "kill the K2 fine-tune"
    res = CliRunner().invoke(app, ["journal", "add", str(tmp_path / "r"), "--kind", "idea", "x"])
    assert res.exit_code != 0


# ----------------------------------------------------------------------------- compare

def test_compare_table_markdown_and_curves(tmp_path):
    scratch = fake_run(tmp_path / "scratch", 0.747)
    k2 = fake_run(tmp_path / "k2-finetune", 0.383, nested=True)
    res = compare.compare([k2, scratch], out=tmp_path / "cmp")
    assert res["header"][0] == "epoch" and "k2-finetune full_acc_0" in res["header"]
    assert [row[0] for row in res["rows"]] == ["1", "2", "3"]   # as checkpoints/epoch-N count (metrics.jsonl: 0..2)
    last = dict(zip(res["header"], res["rows"][-1]))
    want_k2 = 0.383 * (1 - math.exp(-3.0))
    assert last["k2-finetune full_acc_0"] == f"{100 * want_k2:.1f}%"
    assert last["scratch full_acc_0"] == f"{100 * 0.747 * (1 - math.exp(-3.0)):.1f}%"
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| epoch | k2-finetune full_acc_0" in md
    png = (tmp_path / "cmp" / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_compare_says_when_tau_is_at_other_k_and_which_settings_differ(tmp_path):
    """Issue 36: compare put a TTT-2 run's τ (2 positions) beside a TTT-3 run's with no note and no
    config diff."""
    a, b = fake_run(tmp_path / "a", 0.7), fake_run(tmp_path / "b", 0.6)
    (a / "config.yaml").write_text("ttt_steps: 2\nlr: 0.001\nout: a\n")
    (b / "config.yaml").write_text("ttt_steps: 3\nlr: 0.001\nout: b\n")
    res = compare.compare([a, b], out=tmp_path / "cmp")
    assert any("τ at different K (a: K=2, b: K=3)" in n for n in res["notes"]), res["notes"]
    assert "settings that differ: ttt_steps a=2 vs b=3" in res["notes"][1] and "lr" not in res["notes"][1]
    assert "τ at different K" in (tmp_path / "cmp" / "compare.md").read_text()
    (b / "config.yaml").write_text("ttt_steps: 2\nlr: 0.001\n")
    assert compare.compare([a, b])["notes"] == []


def test_curve_ticks_do_not_run_together(tmp_path):
    """The curves' x labels printed 75000100000125000...: short labels, at most a few per axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    assert [compare.tokens_label(x) for x in (0, 950, 75000, 125000, 1_250_000)] == ["0", "950", "75k", "125k",
                                                                                   "1.25M"]
    captured = {}
    real_close = plt.close
    plt.close = lambda fig: captured.setdefault("fig", fig)
    try:
        compare.plot_curves([metrics.load_run(fake_run(tmp_path / "a", 0.7))], tmp_path / "c.png")
    finally:
        plt.close = real_close
    ax = captured["fig"].axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert labels and len(labels) <= 6 and all(len(t) <= 5 for t in labels), labels
    real_close(captured["fig"])


def test_compare_missing_metrics_and_damaged_lines(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"split": "val", "epoch": 0, "tokens_seen": 5, "full_acc_0": 0.5}\n'
                                       '{"split": "val", "epo')            # live run, half-written line
    res = compare.compare([run])
    assert res["rows"] == [["1", "50.0%", "-", "-", "-"]]
    (run / "metrics.jsonl").write_text('not json\n{"split": "val"}\n')
    with pytest.raises(SpecdraftError, match="metrics.jsonl:1"):
        metrics.load_run(run)
    with pytest.raises(SpecdraftError, match="no metrics.jsonl"):
        metrics.load_run(tmp_path / "missing")


def test_compare_same_names_get_parent_prefix(tmp_path):
    a = fake_run(tmp_path / "a" / "run", 0.5)
    b = fake_run(tmp_path / "b" / "run", 0.6)
    assert compare.compare([a, b])["runs"] == ["a/run", "b/run"]


def test_cli_compare(tmp_path):
    from typer.testing import CliRunner

    from specdraft.cli import app

    a, b = fake_run(tmp_path / "k2", 0.383), fake_run(tmp_path / "scratch", 0.747)
    res = CliRunner().invoke(app, ["compare", str(a), str(b), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "k2" in res.output and (tmp_path / "o" / "curves.png").exists()


# ----------------------------------------------------------------------------- watch

def test_watch_triggers_on_crippled_run_val(tmp_path):
    base = metrics.load_run(fake_run(tmp_path / "scratch", 0.747, epochs=5))
    crippled = metrics.load_run(fake_run(tmp_path / "k2", 0.383, epochs=5))
    verdict, points = watch.replay(crippled, base, watch.WatchConfig(margin=0.05, min_points=2))
    assert verdict is not None
    # fires at the 2nd validation point (epoch 1), with the numbers at matching tokens
    assert [p.tokens_seen for p in verdict.evidence] == [TOKENS_PER_EPOCH, 2 * TOKENS_PER_EPOCH]
    ev = verdict.evidence[-1]
    assert ev.baseline == pytest.approx(base.val_by_epoch()[1]["full_acc_0"])
    assert ev.run == pytest.approx(crippled.val_by_epoch()[1]["full_acc_0"])
    assert "behind baseline" in verdict.message and "200,000 tokens" in verdict.message


def test_watch_quiet_on_healthy_run(tmp_path):
    base = metrics.load_run(fake_run(tmp_path / "scratch", 0.747, epochs=5))
    healthy = metrics.load_run(fake_run(tmp_path / "healthy", 0.76, epochs=5, noise=0.05, seed=1))
    for split in ("val", "train"):
        verdict, points = watch.replay(healthy, base, watch.WatchConfig(split=split, loss_margin=0.1))
        assert verdict is None and points


def test_watch_train_ema_ignores_one_bad_batch_and_interpolates(tmp_path):
    base = metrics.load_run(fake_run(tmp_path / "scratch", 0.747, train_per_epoch=10))
    cfg = watch.WatchConfig(split="train", margin=0.05, min_points=5, ema=0.9)
    # halfway between two baseline train points: interpolated, not the nearest point
    xs, ys = metrics.curve(base, "train", "full_acc_0", smooth=0.9)
    w = watch.BaselineWatch(base, cfg)
    w.update({"split": "train", "tokens_seen": (xs[3] + xs[4]) / 2, "full_acc_0": 0.5})
    assert w.points[-1].baseline == pytest.approx((ys[3] + ys[4]) / 2)
    # the baseline's own records with one terrible batch: the EMA dips, recovers, no verdict
    w = watch.BaselineWatch(base, cfg)
    train = base.split("train")
    for i, rec in enumerate(train):
        assert w.update(dict(rec, full_acc_0=0.0) if i == len(train) // 2 else rec) is None
    assert any(p.behind for p in w.points) and w.verdict is None
    # the same batch judged raw (no smoothing) and with no window would have fired
    raw = watch.BaselineWatch(base, watch.WatchConfig(split="train", ema=0.0, min_points=1))
    assert any(raw.update(dict(rec, full_acc_0=0.0) if i == len(train) // 2 else rec)
               for i, rec in enumerate(train))


def test_watch_warmup_window_and_fires_once(tmp_path):
    base = metrics.load_run(fake_run(tmp_path / "scratch", 0.747, train_per_epoch=10, epochs=4))
    crippled = metrics.load_run(fake_run(tmp_path / "k2", 0.3, train_per_epoch=10, epochs=4))
    cfg = watch.WatchConfig(split="train", warmup_tokens=150_000, window_tokens=50_000, min_points=2)
    w = watch.BaselineWatch(base, cfg)
    fired = [(r["tokens_seen"], v) for r in crippled.records if (v := w.update(r))]
    assert len(fired) == 1
    tokens, verdict = fired[0]
    assert verdict.evidence[0].tokens_seen >= 150_000
    assert verdict.evidence[-1].tokens_seen - verdict.evidence[0].tokens_seen >= 50_000
    # beyond the baseline's last point there is nothing to compare with: no extrapolation
    assert w.update({"split": "train", "tokens_seen": 10**9, "full_acc_0": 0.0}) is None


def test_watch_loss_criterion_and_bad_baseline(tmp_path):
    base = metrics.load_run(fake_run(tmp_path / "scratch", 0.747))
    w = watch.BaselineWatch(base, watch.WatchConfig(margin=1.0, loss_margin=0.1, min_points=1))
    rec = dict(base.val_by_epoch()[1])
    rec["loss_0"] *= 1.5
    v = w.update(rec)
    assert v is not None and "loss_0" in v.message
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text('{"split": "train", "tokens_seen": 1, "full_acc_0": 0.1}\n')
    with pytest.raises(SpecdraftError, match="no val records"):
        watch.BaselineWatch.from_run(empty)


def test_watch_check_journals_the_verdict_once(tmp_path):
    base = metrics.load_run(fake_run(tmp_path / "scratch", 0.747, epochs=4))
    crippled = metrics.load_run(fake_run(tmp_path / "k2", 0.383, epochs=4))
    run = tmp_path / "live"
    run.mkdir()
    w = watch.BaselineWatch.from_run(tmp_path / "scratch")
    fired = [w.check(rec, run) for rec in crippled.records]
    assert fired.count(True) == 1
    [entry] = journal.read(run)
    assert entry.kind == "warning" and entry.source == "watch" and "behind baseline" in entry.text


# ----------------------------------------------------------------------------- NaN is never "not behind" (issue 25)

def poison(folder, split: str, nth: int, metric: str = "full_acc_0", value: float = float("nan")) -> int:
    """Set `metric` of the nth record of `split` in folder/metrics.jsonl to NaN (or inf); its line number."""
    path = folder / "metrics.jsonl"
    lines = path.read_text().splitlines()
    seen = 0
    for n, line in enumerate(lines):
        rec = json.loads(line)
        if rec["split"] == split:
            if seen == nth:
                rec[metric] = value
                lines[n] = json.dumps(rec)   # json writes NaN / Infinity, as training's json.dumps would
                path.write_text("\n".join(lines) + "\n")
                return n + 1
            seen += 1
    raise AssertionError("no such record")


@pytest.mark.parametrize("split,value,word", [("val", float("nan"), "NaN"), ("train", float("inf"), "inf")])
def test_watch_reports_a_nan_run_as_no_number_with_its_record(tmp_path, split, value, word):
    """A comparison with NaN is never "behind": a diverged run used to pass the watch (and compare
    called it "not behind baseline"). Now the first NaN/inf fires a "no number" verdict naming the
    file and line."""
    base = metrics.load_run(fake_run(tmp_path / "scratch", 0.747, epochs=4))
    healthy = fake_run(tmp_path / "diverged", 0.76, epochs=4)
    line = poison(healthy, split, 2, value=value)
    verdict, _ = watch.replay(metrics.load_run(healthy), base, watch.WatchConfig(split=split))
    assert verdict is not None and verdict.kind == "no number", verdict
    assert f"{split} full_acc_0 is {word}" in verdict.message
    assert f"{healthy / 'metrics.jsonl'}:{line}" in verdict.message
    if split == "val":   # compare's watch reads val points
        res = compare.compare([healthy], baseline=tmp_path / "scratch")
        assert res["watch"]["diverged"].startswith("no number:"), res["watch"]


def test_watch_live_check_journals_a_nan_record(tmp_path):
    fake_run(tmp_path / "scratch", 0.747, epochs=4)
    w = watch.BaselineWatch.from_run(tmp_path / "scratch")
    run = tmp_path / "live"
    run.mkdir()
    assert w.check({"split": "val", "step": 7, "tokens_seen": 150_000, "metrics": {"full_acc_0": float("nan")}}, run)
    [entry] = journal.read(run)
    assert entry.kind == "warning" and "val full_acc_0 is NaN" in entry.text and "step 7" in entry.text
    assert str(run / "metrics.jsonl") in entry.text


def test_nan_baseline_is_refused_by_the_watch_and_gives_compare_no_verdict(tmp_path):
    """Interpolating a baseline across a NaN point made every run "not behind" there."""
    base = fake_run(tmp_path / "scratch", 0.747, epochs=4)
    line = poison(base, "val", 1)
    crippled = fake_run(tmp_path / "k2", 0.383, epochs=4)
    with pytest.raises(SpecdraftError, match=rf"metrics.jsonl:{line}: baseline val full_acc_0 is NaN"):
        watch.BaselineWatch.from_run(base)
    res = compare.compare([crippled], baseline=base)
    assert res["watch"]["k2"].startswith("no verdict:") and f"metrics.jsonl:{line}" in res["watch"]["k2"]
    # the epoch table shows the NaN as NaN, not "nan%"
    assert compare.compare([base])["rows"][1][1] == "NaN"


def test_compare_shows_the_bench_the_verdict_reads(tmp_path):
    """Issue 56: compare showed validation accuracy only; the report's headline and verdict read the natural bench
    (τ with K and prompts, x plain decoding) and vLLM's: compare shows that same measurement per run."""
    a, b = fake_run(tmp_path / "a", 0.7), fake_run(tmp_path / "b", 0.6)
    (a / "config.yaml").write_text("ttt_steps: 2\n")
    (a / "bench_natural.json").write_text(json.dumps({
        "config": {"k": 2, "prompts": "natural", "num_prompts": 6},
        "methods": {"plain": {"tokens_per_s": 10.0}, "eagle3": {"accept_len": 1.36, "tokens_per_s": 10.4,
                                                                "speedup_over_plain": 1.04, "speedup": 1.5}}}))
    res = compare.compare([a, b], out=tmp_path / "cmp")
    assert list(res["measured"]) == ["a"]                               # b was never benched: no line
    assert res["measured"]["a"].startswith("τ 1.36 at K=2 on 6 natural prompts") and \
        "1.04x plain decoding in specdraft's loop" in res["measured"]["a"]
    assert "## Measured decoding" in (tmp_path / "cmp" / "compare.md").read_text()
    from specdraft.analysis import doctor                                # the doctor leads with the same line
    result = {"run": str(a), "checkpoint": str(a), "tau_held_out": 1.5, "steps": 2, "samples": 4, "causes": [],
              "checked": [], "skipped": [], "measured": res["measured"]["a"]}
    assert doctor.format_result(result).splitlines()[1] == f"measured: {res['measured']['a']}"
