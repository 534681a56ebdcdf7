"""report: one self-contained HTML page (no network references), images embedded."""

from __future__ import annotations

import json
from html.parser import HTMLParser

from specdraft import journal
from specdraft.analysis import report
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
    assert "scrambled: remap required" in text and "best K:" in text and "not valid JSON" in text
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
