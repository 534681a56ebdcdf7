"""report: one self-contained HTML page (no network references), images embedded."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest

from specdraft import journal
from specdraft.analysis import report
from specdraft.errors import SpecdraftError
from test_analysis import fake_run


class Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.attrs, self.images, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            self.attrs.append((tag, name, value or ""))
            if tag == "img" and name == "src":
                self.images.append(value)

    def handle_data(self, data):
        self.text.append(data)


def test_report_is_self_contained(tmp_path):
    scratch = fake_run(tmp_path / "scratch", 0.747)
    k2 = fake_run(tmp_path / "k2", 0.383)
    (k2 / "config.yaml").write_text("init_from: https://huggingface.co/AQ-MedAI/k2-eagle3\nlr: 1e-4\n")
    journal.add(k2, "hypothesis", "K2 weights are a good init <script>alert(1)</script>")
    journal.add(k2, "decision", "kill it: see http://example.com/notes")
    (k2 / "probe-vocab.json").write_text(json.dumps({"kind": "vocab", "verdict": "scrambled: remap required",
                                                    "positional_matches": {"count": 252, "of": 32000}}))
    (k2 / "plan.json").write_text(json.dumps({"best": {"k": 3, "tokens_per_s": 81.2}}))
    (k2 / "bench.json").write_text("{broken")
    out = report.build([k2, scratch], tmp_path / "report.html")
    page = out.read_text()
    refs = Refs()
    refs.feed(page)
    # no attribute may point anywhere (links, scripts, stylesheets, images): only data: URIs
    for tag, name, value in refs.attrs:
        if name in ("src", "href", "action", "srcset", "data"):
            assert value.startswith("data:image/png;base64,"), (tag, name, value[:40])
    assert not any(tag in ("script", "link", "iframe") for tag, _, _ in refs.attrs)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert len(refs.images) == 1 and len(refs.images[0]) > 5000
    text = "".join(refs.text)
    assert "https://huggingface.co/AQ-MedAI/k2-eagle3" in text       # URLs only as text
    assert "scrambled: remap required" in text and "chosen K (draft tokens per round)3" in text
    assert "not valid JSON" in text
    assert "k2 full_acc_0" in text and "scratch full_acc_0" in text
    assert "kill it" in text and "hypothesis" in text


def test_cli_report(tmp_path):
    from typer.testing import CliRunner

    from specdraft.cli import app

    run = fake_run(tmp_path / "run", 0.5)
    res = CliRunner().invoke(app, ["report", str(run), "--out", str(run / "report.html")])
    assert res.exit_code == 0, res.output
    assert (run / "report.html").read_text().startswith("<!DOCTYPE html>")
    (run / "report.html").unlink()
    res = CliRunner().invoke(app, ["report", str(run)])              # --out defaults to RUN/report.html
    assert res.exit_code == 0, res.output
    assert (run / "report.html").read_text().startswith("<!DOCTYPE html>")
    res = CliRunner().invoke(app, ["report", str(tmp_path / "missing"), "--out", str(tmp_path / "r.html")])
    assert res.exit_code != 0 and not (tmp_path / "r.html").exists()


def plan_result(best_k: int = 2) -> dict:
    """plan.json as `specdraft plan --run RUN` writes it (plan.run), with the floor plan measured."""
    options = [{"k": k, "tokens_per_cycle": tpc, "cycle_ms": ms, "tokens_per_s": tps, "speedup": sp,
                "draft_share": 0.1 * k, "verify_share": 1 - 0.1 * k}
               for k, tpc, ms, tps, sp in ((1, 1.48, 52.0, 28.5, 1.31), (2, 1.71, 55.0, 31.1, 1.43),
                                           (3, 1.80, 61.0, 29.5, 1.36))]
    return {"accept": {"cond_acc": [0.48, 0.47, 0.45], "source": "ws/runs/quick/eval.json",
                       "note": "positions past the measured ones repeat the last rate"},
            "verify_ms": [46.0, 47.5, 49.0, 51.5], "draft_ms": 2.25, "measured": {}, "draft_in_one_forward": False,
            "options": options, "best": next(o for o in options if o["k"] == best_k),
            "timing": {"floor": {"weight_mb": 538.0, "bandwidth_gbs": 12.8, "floor_ms": 42.0}},
            "warnings": ["verify(n) is not monotonic"]}


def test_report_shows_the_plan(tmp_path):
    """Issue 36: `report` showed plan.json as "best K" and a folded JSON: the chosen K, the predicted
    speedup, the verify costs and the floor line are what plan printed, and the report carries them."""
    run = fake_run(tmp_path / "run", 0.5)
    (run / "plan.json").write_text(json.dumps(plan_result()))
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "export.json").write_text(json.dumps({"run": str(run.resolve()), "layout": "speculators",
                                                                 "dtype": "bfloat16", "num_speculative_tokens": 3}))
    refs = Refs()
    refs.feed(report.build([run], tmp_path / "report.html").read_text())
    text = " ".join("".join(refs.text).split())
    assert "Plan: the draft length K" in text
    assert "chosen K (draft tokens per round)2" in text
    assert "predicted speedup over plain decoding1.43x (31.1 tok/s)" in text
    assert "predicted tokens per target forward1.71 at K=2" in text
    assert "verify 1..n tokens46.0 47.5 49.0 51.5 ms" in text
    assert "floor: 538 MB of weights / 12.8 GB/s" in text and "1.1 1.1 1.2 1.2x floor" in text
    assert "2 <- best" in text and "verify(n) is not monotonic" in text
    assert "the export serves K=3, plan chose K=2" in text and "-k 2" in text


def test_report_reads_the_recipe_workspace_plan(tmp_path):
    """A plan written beside the recipe's runs (WS/plan.json) belongs to WS/runs/NAME's report; a
    wrong type in it is one line naming the file and the field."""
    run = fake_run(tmp_path / "ws" / "runs" / "quick", 0.5)
    (tmp_path / "ws" / "plan.json").write_text(json.dumps(plan_result(best_k=3)))
    page = report.build([run], tmp_path / "report.html").read_text()
    assert "chosen K (draft tokens per round)</td><td>3</td>" in page and "1.36x (29.5 tok/s)" in page
    assert "the export serves" not in page                               # not exported: nothing to compare
    bad = plan_result()
    bad["verify_ms"] = ["46 ms"]
    (tmp_path / "ws" / "plan.json").write_text(json.dumps(bad))
    with pytest.raises(SpecdraftError, match=r"plan.json: field 'verify_ms.0' is \"46 ms\" \(input should be a valid number\)"):
        report.build([run], tmp_path / "report.html")
    assert "chosen K" in (tmp_path / "report.html").read_text()       # the report written before is kept
