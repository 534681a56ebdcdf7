import subprocess
import sys

import pytest

from specdraft.errors import SpecdraftError
from specdraft.targets import check_aux_layers, default_aux_layers, info, load_target


def test_default_aux_layers():
    assert default_aux_layers(30) == [2, 15, 27]
    assert default_aux_layers(8) == [2, 4, 5]


def test_aux_layer_out_of_range():
    with pytest.raises(SpecdraftError, match="out of range"):
        check_aux_layers([2, 4, 8], 8)


def test_info_and_identity(tiny_target):
    d = info(str(tiny_target))
    assert d["num_layers"] == 8 and d["hidden_size"] == 64 and d["chat_template"]
    a = load_target(str(tiny_target))
    b = load_target(str(tiny_target), dtype="bfloat16")
    assert a.identity["fingerprint"] == b.identity["fingerprint"]


def test_cli_bad_model_exits_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "specdraft.cli", "info", "--model", str(tmp_path / "nope.gguf")],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "GGUF file not found" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
