"""Write docs/targets.md's support table from the tests' own results: the README's pipeline on a tiny
target of each architecture (tests/arch_pipeline.py). tests/test_architectures.py fails while the
committed table differs from what the tests give.

    .venv/bin/python scripts/targets_table.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("SPECDRAFT_KERNEL_PATH", "linear")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from arch_pipeline import BEGIN, END, pipeline_result, support_table  # noqa: E402
from specdraft.testing import TINY_ARCHS  # noqa: E402


def main() -> None:
    doc_path = ROOT / "docs/targets.md"
    doc = doc_path.read_text()
    table = support_table({arch: pipeline_result(arch) for arch in TINY_ARCHS})
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    doc_path.write_text(doc[:start] + "\n" + table + doc[end:])
    print(table)


if __name__ == "__main__":
    main()
