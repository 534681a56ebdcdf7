"""`specdraft report RUN... --out report.html`: one self-contained page per set of runs.

No network: inline CSS, plots as base64 data URIs, every text HTML-escaped. Sections: the
validation table across runs, curves, then per run its config, journal, and the probe / plan /
bench JSON results found in the run folder (RUN/probe*.json, RUN/plan.json, RUN/bench.json).
"""

from __future__ import annotations

import base64
import html
import json
import tempfile
from pathlib import Path

from specdraft import journal, metrics
from specdraft.analysis import compare
from specdraft.errors import SpecdraftError
from specdraft.io import atomic_path

CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
pre{background:#f7f7f7;padding:.8em;overflow-x:auto;font-size:12px}img{max-width:100%}
.entry{border-left:4px solid #888;padding:.2em .8em;margin:.6em 0}.warning{border-color:#c33}
.decision{border-color:#36c}.result{border-color:#3a3}.probe{border-color:#a6c}.hypothesis{border-color:#c93}
.meta{color:#666;font-size:12px}"""

RESULT_FILES = ("probe*.json", "plan.json", "bench.json", "eval*.json")


def esc(text) -> str:
    return html.escape(str(text), quote=True)


def table_html(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def image_html(png: Path, alt: str) -> str:
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def journal_html(run: Path) -> str:
    entries = journal.read(run)
    if not entries:
        return "<p class=meta>no journal entries</p>"
    return "".join(f'<div class="entry {esc(e.kind)}"><div class=meta>{esc(e.time)} · {esc(e.kind)}'
                   f'{" · " + esc(e.source) if e.source else ""}</div><pre>{esc(e.text)}</pre></div>'
                   for e in entries)


def results_html(run: Path) -> str:
    parts = []
    for pattern in RESULT_FILES:
        for f in sorted(run.glob(pattern)):
            try:
                data = json.loads(f.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError):
                parts.append(f"<h3>{esc(f.name)}</h3><p class=meta>not valid JSON, skipped</p>")
                continue
            verdict = data.get("verdict") if isinstance(data, dict) else None
            best = data.get("best") if isinstance(data, dict) else None
            summary = f"<p><b>verdict:</b> {esc(verdict)}</p>" if verdict else ""
            if best:
                summary += (f"<p><b>best K:</b> {esc(best.get('k'))}, {esc(round(best.get('tokens_per_s', 0), 1))} "
                            f"tok/s</p>")
            parts.append(f"<h3>{esc(f.name)}</h3>{summary}<details><summary>JSON</summary>"
                         f"<pre>{esc(json.dumps(data, indent=2))}</pre></details>")
    return "".join(parts) or "<p class=meta>no probe, plan or bench results in this run folder</p>"


def config_html(run: Path) -> str:
    for name in ("config.yaml", "config.yml", "config.json"):
        if (run / name).exists():
            return f"<h3>{esc(name)}</h3><pre>{esc((run / name).read_text())}</pre>"
    return "<p class=meta>no config file</p>"


def build(runs: list[str | Path], out: str | Path) -> Path:
    """Write the report for `runs` (folders with metrics.jsonl; a folder without one still reports
    its journal and results) to `out`, atomically."""
    if not runs:
        raise SpecdraftError("report: pass at least one run folder")
    folders = [Path(r) for r in runs]
    for f in folders:
        if not f.is_dir():
            raise SpecdraftError(f"{f}: not a run folder")
    loaded = compare.unique_names([metrics.load_run(f) for f in folders if (f / "metrics.jsonl").exists()])
    body = [f"<h1>specdraft report: {esc(', '.join(f.name for f in folders))}</h1>"]
    if loaded:
        header, rows = compare.epoch_table(loaded)
        body.append("<h2>Validation per epoch</h2>" + table_html(header, rows))
        with tempfile.TemporaryDirectory() as tmp:
            png = compare.plot_curves(loaded, Path(tmp) / "curves.png")
            if png:
                body.append("<h2>Curves (x = tokens seen)</h2>" + image_html(png, "loss_k and cond_acc_k curves"))
    for f in folders:
        body.append(f"<h2>Run {esc(f.name)}</h2><p class=meta>{esc(f.resolve())}</p>{config_html(f)}"
                    f"<h3>Journal</h3>{journal_html(f)}<h3>Results</h3>{results_html(f)}")
    page = (f"<!DOCTYPE html><html><head><meta charset=utf-8><title>specdraft report</title>"
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n")

    out = Path(out)
    with atomic_path(out) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return out
