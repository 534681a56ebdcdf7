"""The report leads with the answer (issue 16 part 2), checked as a person sees it: headless
Chromium renders RUN/report.html and the page text holds τ, the speedup and "identical to greedy"
from the run's bench.json, the data size, the training time, the serve commands and stage timings.

The run folder is written by hand (the files train, eval, bench, export and a recipe leave), so
this takes seconds. Chromium is Debian's `chromium`; `make test` installs it when missing."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser

import pytest

from specdraft import journal
from specdraft.analysis import report

BENCH = {   # what `specdraft bench --out` writes (cli.py bench, infer/bench.py)
    "methods": {
        "greedy": {"tokens_per_s": 21.4, "accept_len": 1.0, "per_position_accept": [], "identical_to_greedy": True,
                   "prompts_identical": 8, "new_tokens": 1024, "seconds": 47.8, "target_forwards": 1024,
                   "profile": None, "speedup": 1.0},
        "ngram": {"tokens_per_s": 24.9, "accept_len": 1.31, "per_position_accept": [0.22, 0.09, 0.04, 0.02],
                  "identical_to_greedy": True, "prompts_identical": 8, "new_tokens": 1024, "seconds": 41.1,
                  "target_forwards": 781, "profile": {"draft_frac": 0.02}, "speedup": 1.1636},
        "eagle3": {"tokens_per_s": 40.1, "accept_len": 2.4375, "per_position_accept": [0.71, 0.48, 0.33, 0.21],
                   "identical_to_greedy": True, "prompts_identical": 8, "new_tokens": 1024, "seconds": 25.5,
                   "target_forwards": 420, "profile": {"draft_frac": 0.2}, "speedup": 1.8738},
    },
    "config": {"model": "HuggingFaceTB/SmolLM2-135M-Instruct", "drafter": "ws/runs/quick/best",
               "prompts": "builtin-holdout", "num_prompts": 8, "max_new_tokens": 128, "k": 4, "tree": None,
               "ngram": [1, 3], "device": "cpu", "dtype": "float32", "torch": "2.13.0",
               "transformers": "4.57.0", "python": "3.11.2", "threads": 2},
}
EVAL = {"drafter": "ws/runs/quick/best", "store": "ws/hidden", "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "split": "val (12 held-out samples of the run)", "steps": 3, "cond_acc": [0.702, 0.655, 0.611],
        "full_acc": [0.702, 0.46, 0.281], "accept_len": 2.443, "accept_len_by_k": [1.0, 1.702, 2.162, 2.443],
        "metrics": {}}
JOURNAL_URL = "https://example.com/" + "a-very-long-path-segment-" * 12


def png(width: int = 4, height: int = 3) -> bytes:
    """A small valid PNG (grey), standing in for bench.png."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"".join(b"\0" + b"\x80" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


@pytest.fixture
def run(tmp_path):
    """WS/runs/quick as a recipe leaves it, plus WS/stages.json and an export folder."""
    ws = tmp_path / "ws"
    run = ws / "runs" / "quick"
    (run / "best").mkdir(parents=True)
    (run / "config.yaml").write_text("model: HuggingFaceTB/SmolLM2-135M-Instruct\nstore: ws/hidden\nepochs: 2\n"
                                     + "".join(f"setting_{i}: {i}\n" for i in range(40)))
    lines = [{"split": "train", "epoch": e, "step": s, "tokens_seen": 1000 * s, "lr": 1e-4,
              "time": 1_700_000_000 + 60.0 * s, "metrics": {"loss_0": 3.0 - s * 0.1, "full_acc_0": 0.1 * s,
                                                            "cond_acc_0": 0.1 * s, "accept_len": 1 + 0.1 * s}}
             for e, s in ((0, 1), (0, 2), (1, 3), (1, 4))]
    lines.append({**lines[-1], "split": "val", "time": 1_700_000_000 + 60.0 * 4 + 30})   # 3.5 min in all
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (run / "best" / "inputs.json").write_text(json.dumps(
        {"store": "ws/hidden", "layer_ids": [2, 15, 27], "hidden_size": 576,
         "target": {"id": "HuggingFaceTB/SmolLM2-135M-Instruct", "fingerprint": "abc"},
         "num_samples": 1234, "num_tokens": 456789}))
    (run / "bench.json").write_text(json.dumps(BENCH))
    (run / "bench.png").write_bytes(png())
    (run / "eval.json").write_text(json.dumps(EVAL))
    journal.add(run, "decision", f"kill it: see {JOURNAL_URL}")
    export = ws / "export" / "speculators"
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    (export / "export.json").write_text(json.dumps({"run": str(run.resolve()), "layout": "speculators",
                                                    "dtype": "bfloat16", "num_speculative_tokens": 4}))
    (ws / "stages.json").write_text(json.dumps({
        "prepare": {"command": "specdraft prepare ...", "exit": 0, "seconds": 95.2},
        "train": {"command": "specdraft train ...", "exit": 0, "seconds": 251.0},
        "bench": {"command": "specdraft bench ...", "exit": 0, "seconds": 120.4}}))
    return run


class Text(HTMLParser):
    """The visible text: what is not inside <style> or <title>."""

    def __init__(self):
        super().__init__()
        self.parts, self.hidden = [], 0

    def handle_starttag(self, tag, attrs):
        self.hidden += tag in ("style", "title")

    def handle_endtag(self, tag):
        self.hidden -= tag in ("style", "title")

    def handle_data(self, data):
        if not self.hidden:
            self.parts.append(data)


def rendered_text(page) -> str:
    """The page's text after Chromium loaded and laid it out (--dump-dom), whitespace collapsed."""
    chromium = shutil.which("chromium")
    assert chromium, "chromium is not installed: `make test` installs it (apt-get install -y chromium)"
    dom = subprocess.run([chromium, "--headless", "--disable-gpu", "--no-sandbox", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    text = Text()
    text.feed(dom)
    return " ".join(" ".join(text.parts).split())


def test_report_in_chromium_leads_with_the_answer(run):
    from test_analysis_report import plan_result

    (run.parent.parent / "plan.json").write_text(json.dumps(plan_result()))   # the recipe workspace's plan
    out = report.build([run])                                # --out defaults to RUN/report.html
    assert out == run / "report.html"
    text = rendered_text(out)
    eagle = BENCH["methods"]["eagle3"]
    head = text[:text.index("Run quick")]                    # the headline comes before every section
    assert (f"τ (tokens per target forward, at most K+1) τ {eagle['accept_len']:.2f} at K=4 on 8 builtin hold-out "
            "prompts (bench eagle3 (bench.json), 1.87x transformers' greedy)") in head
    assert "Every τ measured (ceiling K+1) τ K prompts from 2.44 4 8 builtin hold-out prompts" in head
    assert f"speed in specdraft's loop {eagle['speedup']:.2f}x transformers' greedy this bench ran no plain" in head
    assert "served by vLLM unknown no bench_vllm.json" in head
    assert "identical to greedy yes 8/8 prompts" in head
    assert "training data 1,234 samples, 456,789 tokens" in head
    assert "training time 3.5 min (metrics.jsonl timestamps)" in head
    # bench and eval as tables, per-position acceptance, the export's serve commands, stage timings
    assert "eagle3 40.1 1.87x 2.44 0.71 0.48 0.33 0.21 yes" in text
    assert "1 0.702 0.702 1.70" in text and "τ 2.44 at K=3 on held-out store samples (simulated)" in text
    export = str(run.parent.parent / "export" / "speculators")
    assert f"vllm serve HuggingFaceTB/SmolLM2-135M-Instruct \\ --tensor-parallel-size 1 \\ --speculative-config" in text
    assert f'"model": "{export}", "num_speculative_tokens": 4' in text
    assert f"--speculative-draft-model-path {export}-sglang" in text
    assert "kill it: see https://example.com/" in text
    # the plan's result (issue 36): chosen K, predicted speedup, verify costs, the floor line, the K served
    assert ("chosen K (draft tokens per round) 2 predicted speedup over plain decoding 1.43x (31.1 tok/s) "
            "predicted tokens per target forward 1.71 at K=2") in text
    assert "verify 1..n tokens 46.0 47.5 49.0 51.5 ms weight-streaming floor floor: 538 MB" in text
    assert "the export serves K=4, plan chose K=2" in text
    assert "train 4.2 min specdraft train" in text and "prepare 1.6 min" in text
    page = out.read_text()
    assert page.count('src="data:image/png;base64,') == 2      # bench.png and the curves
    assert "<details><summary>config.yaml</summary>" in page and "white-space:pre-wrap" in page


def test_headline_falls_back_to_eval_and_recipe_timings(run):
    (run / "bench.json").unlink()
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "time"}) + "\n"
                                               for r in lines))   # no timestamps: the recipe's train stage
    text = rendered_text(report.build([run], run.parent / "other.html"))
    assert ("τ (tokens per target forward, at most K+1) τ 2.44 at K=3 on held-out store samples (eval, simulated "
            "(eval.json)); served at K=4, which no measurement here ran") in text
    assert "speed in specdraft's loop unknown" in text and "identical to greedy unknown" in text
    assert "training time 4.2 min (recipe's train stage)" in text
