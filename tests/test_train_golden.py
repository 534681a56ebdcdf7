"""A seeded run's metrics.jsonl, pinned: refactors of train/ (issue 15) must leave every record
as it was. tests/data/golden_metrics.jsonl was written by this test's run in the commit that added
it, before the refactor, with `SPECDRAFT_WRITE_GOLDEN=1`."""

import json
import math
import os
from pathlib import Path

from test_train import config, read_metrics, ws  # noqa: F401  (ws is a fixture)

from specdraft.train.loop import train

GOLDEN = Path(__file__).parent / "data" / "golden_metrics.jsonl"


def same(a, b, path="") -> None:
    """Equal structure; numbers equal to 1e-6 relative (bit-equal on one machine; other CPUs may
    round the last bits of a float32 sum differently)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, float) or isinstance(b, float):
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9), f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def test_seeded_run_metrics_match_the_golden_file(ws, tmp_path):
    out = tmp_path / "run"
    train(config(ws, out, epochs=2, val_every=3, save_every=4, ttt_steps=3, step_decay=0.8, aux_noise=0.1))
    records = read_metrics(out)
    if os.environ.get("SPECDRAFT_WRITE_GOLDEN") == "1":
        GOLDEN.write_text("".join(json.dumps(r) + "\n" for r in records))
    golden = [json.loads(line) for line in GOLDEN.read_text().splitlines()]
    assert len(records) == len(golden)
    for n, (got, want) in enumerate(zip(records, golden), 1):
        same(got, want, f"line {n}")
