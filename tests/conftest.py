import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# Keep tests off the user's cache and off any network. Every suite run starts from an empty
# SPECDRAFT_CACHE and HF_HOME of its own, so the default target's GGUF -> safetensors conversion
# (which needs `accelerate`) runs once per run, as on a machine that never ran specdraft: a warm
# ~/.cache can no longer hide a missing install step (issue 22). Subprocesses inherit both.
_SUITE_CACHE = Path(tempfile.mkdtemp(prefix="specdraft-test-cache-"))
os.environ["SPECDRAFT_CACHE"] = str(_SUITE_CACHE / "specdraft")
# Each fresh suite cache would time F.linear against mm for every tiny model's Linear shapes (0.7-12 s
# a shape, bf16 the slowest on a CPU without it): the suite runs F.linear everywhere instead, and
# tests/test_kernels.py times the real paths with the variable removed.
os.environ["SPECDRAFT_KERNEL_PATH"] = "linear"
# vLLM's CPU backend reserves gpu_memory_utilization (0.3) of RAM as KV cache, and creating those ~7 GiB
# took 50 s of a 77 s engine start on the AVX2 EPYC (0.7 s for 1 GiB); the suite's tiny targets and short
# SmolLM2 samples need far less, so every engine the suite starts (in-process, CLI stages, `vllm serve`)
# gets 2 GiB.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ["HF_HOME"] = str(_SUITE_CACHE / "hf")
atexit.register(shutil.rmtree, _SUITE_CACHE, ignore_errors=True)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

# Tiny models run fastest on one thread, and tests that start CLI subprocesses in parallel would
# otherwise oversubscribe the 2 cores many times over.
torch.set_num_threads(int(os.environ.get("SPECDRAFT_TEST_THREADS", "1")))


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    """A tiny random Llama (8 layers, H=64) + byte-level ChatML tokenizer as an HF folder."""
    from specdraft.testing import save_tiny_target

    return save_tiny_target(tmp_path_factory.mktemp("tiny") / "target")


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M (`load_target("default")`, fp32), loaded once for every test that only
    reads it (generate, no_grad forwards, a teacher head copied from it); a test that changes the
    model loads its own. The suite's first load still converts the GGUF on the run's empty cache."""
    from specdraft.targets import load_target

    return load_target("default")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny forwards: on a shared 2-core machine extra threads only spin (a module opts in with
    `pytestmark = pytest.mark.usefixtures("one_thread")`)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
