"""specdraft's public Python API: the entry point of each stage, for users' scripts and benchmarks/ to import.

Everything else in the package is internal and may move between releases; these names stay (tests/test_layout.py
checks that benchmarks/ takes each of them from here). Each is the function the CLI's stage calls.
"""

from specdraft.data.capture import capture_samples                        # capture: a target's hidden states
from specdraft.data.prepare import prepare                                # prepare: conversations -> training rows
from specdraft.data.prepared import load_prepared, save_prepared
from specdraft.data.store import HiddenStore
from specdraft.errors import SpecdraftError                               # every refusal, as one line
from specdraft.formats.checkpoints import export, import_checkpoint, load_drafter, save_drafter
from specdraft.infer.auto import plain_rows                                # plain decoding's R on this machine
from specdraft.infer.methods import load_drafter_for
from specdraft.infer.ngram import NgramProposer
from specdraft.infer.prompts import prompt_ids, read_prompts
from specdraft.infer.sampling import Sampling
from specdraft.infer.speculative import generate                          # speculative decoding, one prompt
from specdraft.machine import cpu_label
from specdraft.metrics import load_run                                    # a run's metrics.jsonl
from specdraft.targets import load_target, load_tokenizer                 # the target (hub id, folder, .gguf, default)
from specdraft.train.config import RunConfig, resolve_config
from specdraft.train.loop import train

__all__ = ["HiddenStore", "NgramProposer", "RunConfig", "Sampling", "SpecdraftError", "capture_samples", "cpu_label",
           "export", "generate", "import_checkpoint", "load_drafter", "load_drafter_for", "load_prepared", "load_run",
           "load_target", "load_tokenizer", "plain_rows", "prepare", "prompt_ids", "read_prompts", "resolve_config", "save_drafter",
           "save_prepared", "train"]
