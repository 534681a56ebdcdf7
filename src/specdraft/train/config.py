"""RunConfig: every training setting, its default, help text and allowed values, in one place.
`specdraft train`, `python -m specdraft.train` (torchrun) and `--config run.yaml` are all
generated from it (train/command.py). A run is this config (saved as RUN/config.yaml) plus the
recipe in train/loop.py."""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from specdraft import run_layout
from specdraft.errors import SpecdraftError
from specdraft.families import DEFAULT as DEFAULT_FAMILY
from specdraft import trackers
from specdraft.io import atomic_path, read_text
from specdraft.watch import WatchConfig


INT_MAX = 2**31 - 1   # the bound of an integer setting that names no other: counts of steps, rows, tokens


MAX_TTT_STEPS = 7    # draft steps a run unrolls (and eval/probe measure); the TTT mask grows with each


def setting(default, help: str, *, low=None, high=None, short: str | None = None):
    """A RunConfig field with its help text, its bounds (`low <= value <= high`, checked by
    RunConfig.check) and an optional short flag: what the command line shows and checks."""
    return dataclasses.field(default=default, metadata={"help": help, "low": low, "high": high, "short": short})


@dataclass
class RunConfig:
    # inputs and output
    out: str = setting("", "Where this command writes. Here: the run folder (config.yaml, metrics.jsonl, "
                       "checkpoints/); required.")
    store: str | list[str] = setting("", "Hidden-state store (WS/hidden, from `specdraft capture`). Here: required "
                                     "but with --online; several (--store A --store B, or a YAML list) train on "
                                     "their union, e.g. the parts of `capture --part`.")
    vocab: str = setting("", "Draft vocab from `specdraft vocab build`. Here: required.")
    model: str = setting("default", "The target: hub id, local folder, .gguf file, or 'default' "
                         "(SmolLM2-135M-Instruct). Here: its head, embeddings and checks.", short="-m")
    trust_remote_code: bool = setting(False, "Allow the model's own Python code (only for models you trust).")
    from_pretrained: str | None = setting(None, "Start from this drafter folder instead of from scratch.")
    remap: bool = setting(True, "Remap a --from-pretrained lm_head to --vocab when the mappings differ (else refuse).")
    resume: bool = setting(False, "Continue where an interrupted run stopped. Here: the latest checkpoint in --out, exactly (with the run's config.yaml; "
                           "flags that change its training settings are refused, --epochs and logging may change).")
    overwrite: bool = setting(False, "--out already holds a run: delete its files (metrics, checkpoints, best/, "
                              "journal) and start over (never saved as true).")
    # drafter
    family: str = setting(DEFAULT_FAMILY, "Drafter family, by its speculators model type (`specdraft info` lists the "
                          "registered ones).")
    norm_before_residual: bool = setting(False, "Drafter layout: norm the hidden state before the residual.")
    fc_norm: bool = setting(False, "EAGLE-3.1: an RMSNorm on each aux layer's state before fc (vLLM serves it).")
    norm_output: bool = setting(False, "EAGLE-3.1: feed the final-normed hidden state back to the next draft step.")
    draft_layers: int = setting(1, "Decoder layers of a family that stacks them; a family with one refuses "
                                "more.", low=1, high=64)
    draft_heads: int = setting(0, "Drafter shape: attention heads of its decoder layer (0 = from the target, as "
                               "`specdraft info` prints under drafter_shape; its hidden size is always the target's).",
                               low=0, high=4096)
    draft_kv_heads: int = setting(0, "Drafter shape: key/value heads (0 = from the target; must divide the heads).",
                                  low=0, high=4096)
    draft_head_dim: int = setting(0, "Drafter shape: width of each head (0 = from the target; an MLA target's "
                                  "v_head_dim, e.g. 128 for Kimi-K2.5).", low=0, high=4096)
    draft_intermediate: int = setting(0, "Drafter shape: MLP width (0 = from the target; an MoE target's dense "
                                      "layers' width; public Kimi-K2.5 drafters use 12288).", low=0, high=2**20)
    init_layer: Literal["fresh", "target"] = setting("fresh", "Decoder layer's start: fresh (random) or target "
                                                     "(copied from the target's last layer, zeros on the "
                                                     "embedding half of q/k/v).")
    # objective
    ttt_steps: int = setting(3, "Unrolled draft steps per position.", low=1, high=MAX_TTT_STEPS)
    step_decay: float = setting(1.0, "Loss weight of TTT step k is step_decay**k.", low=0)
    loss: Literal["kl", "ce", "tv", "jsd"] = setting("kl", "kl (teacher over the draft vocab), ce (teacher argmax), "
                                                     "tv (total variation: 1 - acceptance chance) or jsd.")
    ttt_inputs: Literal["data", "draft"] = setting("data", "Token fed at TTT step k>0: the data's (teacher forcing) "
                                                   "or the drafter's own previous prediction.")
    aux_noise: float = setting(0.0, "Uniform noise U(-a, a) on the aux states while training.", low=0)
    train_on_prompts: bool = setting(False, "Train on every position (the teacher is the target there too), "
                                     "not only the loss mask; validation keeps the mask.")
    sliding_window: int = setting(0, "Drafter attention over the last N context positions (0 = full: the whole "
                                  "context). Exported as the speculators layer config's sliding_window.", low=0)
    attention: Literal["sdpa", "flex"] = setting("sdpa", "sdpa (explicit TTT mask, runs anywhere) or flex "
                                                 "(compiled flex_attention, CUDA only).")
    # data
    max_tokens: int = setting(2048, "Tokens per packed row.", low=1)
    rows_per_batch: int = setting(1, "Packed rows per optimizer step (per rank).", low=1)
    val_fraction: float = setting(0.05, "Samples held out for validation (by sample, seeded), in [0, 1).")
    seed: int = setting(0, "Seed of what this command draws at random. Here: the split, the shuffle and the "
                        "initial weights.", low=0, high=2**32 - 1)
    # optimisation
    epochs: int = setting(2, "Passes over the training samples.", low=1, high=100_000)
    lr: float = setting(1e-4, "Peak learning rate (> 0). 1e-4 suits long runs and adapting a trained drafter; "
                        "the recipes train a few hundred samples from scratch at 3e-3 (docs/recipes.md).")
    min_lr_ratio: float = setting(0.1, "Final lr = lr * min_lr_ratio, in [0, 1].")
    schedule: Literal["cosine", "linear", "constant"] = setting("cosine", "Learning-rate decay after warm-up.")
    warmup_steps: int = setting(20, "Linear warm-up steps.", low=0)
    weight_decay: float = setting(0.01, "AdamW weight decay.", low=0)
    beta1: float = setting(0.9, "AdamW beta1, in [0, 1).")
    beta2: float = setting(0.95, "AdamW beta2, in [0, 1).")
    grad_clip: float = setting(1.0, "Max grad norm (0 = off).", low=0)
    precision: Literal["auto", "bf16", "fp32"] = setting("auto", "Autocast: auto (bf16 where the hardware has it), "
                                                         "bf16 or fp32.")
    # logging and checkpoints
    log_every: int = setting(10, "Steps per metrics.jsonl train line.", low=1)
    val_every: int = setting(0, "Also validate every N steps (0 = each epoch only).", low=0)
    save_every: int = setting(0, "Also checkpoint every N steps (0 = each epoch only).", low=0)
    keep_step_checkpoints: int = setting(2, "Step-N checkpoints kept (epoch ones are all kept).", low=0)
    stop_after: int = setting(0, "Stop this invocation after N steps (0 = run to the end).", low=0)
    report_to: str = setting("none", "Also log the metrics to trackers: none, or a comma list of tensorboard "
                             "(RUN/tensorboard), trackio, wandb (each needs its package: pip install wandb).")
    progress: bool = setting(True, "Show a progress bar.")
    # baseline watch (watch.py): compare with a baseline run at equal tokens_seen
    baseline: str | None = setting(None, "A run to beat: its folder or metrics.jsonl. Here: e.g. from scratch; warn "
                                      "in RUN/journal.md when this run stays behind it at equal tokens_seen.")
    stop_if_behind: bool = setting(False, "With --baseline: stop with a checkpoint once the run is behind.")
    watch_split: Literal["val", "train"] = setting("val", "Baseline watch on val points or the smoothed train "
                                                   "curve (train).")
    watch_metric: str = setting("full_acc_0", "Metric the watch compares (higher is better).")
    watch_margin: float = setting(0.05, "Behind when run < baseline - margin.", low=0)
    watch_warmup_tokens: int = setting(0, "No watch verdict before this many tokens.", low=0, high=10**15)
    watch_min_points: int = setting(2, "Consecutive behind points before the watch fires.", low=1)

    def check(self) -> "RunConfig":
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value, low, high = getattr(self, f.name), f.metadata["low"], f.metadata["high"]
            if high is None and low is not None and isinstance(value, int) and not isinstance(value, bool):
                high = INT_MAX   # a count of 2**70 overflows the first tensor or seed it reaches
            if isinstance(value, float) and not math.isfinite(value):
                raise SpecdraftError(f"{flag(f.name)} {value}: must be a finite number")
            if low is not None and high is not None and not low <= value <= high:
                raise SpecdraftError(f"{flag(f.name)} {value}: must be {low}..{high}")
            if low is not None and value < low:
                raise SpecdraftError(f"{flag(f.name)} {value}: must be >= {low}")
            allowed = choices(hints[f.name])
            if allowed and value not in allowed:
                raise SpecdraftError(f"{flag(f.name)} {value}: use {' or '.join([', '.join(allowed[:-1]), allowed[-1]])}")
        if not 0 <= self.val_fraction < 1:
            raise SpecdraftError(f"--val-fraction {self.val_fraction}: must be in [0, 1)")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise SpecdraftError(f"--beta1 {self.beta1} --beta2 {self.beta2}: each must be in [0, 1)")
        if not 0 <= self.min_lr_ratio <= 1:
            raise SpecdraftError(f"--min-lr-ratio {self.min_lr_ratio}: must be in [0, 1]")
        if self.lr <= 0:
            raise SpecdraftError(f"--lr {self.lr}: must be positive")
        from specdraft.families import family
        family(self.family)                # an unknown family fails here, naming the registered ones
        if self.stop_if_behind and not self.baseline:
            raise SpecdraftError("--stop-if-behind: needs --baseline RUN (the run to compare with)")
        trackers.require(self.report_to)   # a missing tracker fails here, before any work
        if self.resume and self.overwrite:
            raise SpecdraftError("--resume and --overwrite: pick one (continue the run in --out, or wipe it and start over)")
        return self

    @property
    def stores(self) -> list[str]:
        """--store as a list: one store, or the parts to train on together."""
        return [self.store] if isinstance(self.store, str) else list(self.store)

    def watch_config(self):
        """The baseline watch's settings (watch.WatchConfig) from this run's."""
        return WatchConfig(split=self.watch_split, metric=self.watch_metric, margin=self.watch_margin,
                           warmup_tokens=float(self.watch_warmup_tokens), min_points=self.watch_min_points)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "config") -> "RunConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise SpecdraftError(f"{where}: unknown setting(s) {', '.join(unknown)}; "
                                 f"known: {', '.join(sorted(known))}")
        hints = typing.get_type_hints(cls)
        d = {name: check_type(name, value, hints[name], where) for name, value in d.items()}
        return cls(**d)

    def replace(self, **overrides) -> "RunConfig":
        return dataclasses.replace(self, **overrides)


def choices(hint) -> tuple:
    """The allowed values of a Literal["a", "b"] setting; () for any other type."""
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else ()


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_type(name: str, value, expected, where: str):
    """A YAML value must have the setting's type: `epochs: three` or `progress: 'no'` (a string,
    which Python would treat as true) are refused by name instead of failing later or silently.
    Returns the value; `lr: 1e-4`, which PyYAML reads as a string, becomes the float it means."""
    if choices(expected):                                    # Literal["kl", "ce"]: check() names the choices
        expected = str
    allowed = typing.get_args(expected) or (expected,)      # `str | None` -> (str, NoneType)
    if value is None and type(None) in allowed:
        return value
    if float in allowed and isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if list[str] in allowed and isinstance(value, list):   # store: [A, B]
        ok, words = bool(value) and all(isinstance(v, str) for v in value), "a string or a list of strings"
    elif bool in allowed:
        ok, words = isinstance(value, bool), "true or false"
    elif int in allowed:
        ok, words = isinstance(value, int) and not isinstance(value, bool), "a whole number"
    elif float in allowed:
        ok, words = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    else:
        ok, words = isinstance(value, str), "a string"
    if not ok:
        default = RunConfig.__dataclass_fields__[name].default
        example = f", e.g. {name}: {json.dumps(default)}" if default is not None else ""
        raise SpecdraftError(f"{where}: {name} is {value!r} ({type(value).__name__}); expected {words}{example}")
    return value


def load_yaml(path: str | Path) -> dict:
    """The training settings of a YAML file (a recipe file's `recipe:` section left out)."""
    return load_settings_and_recipe(path)[0]


def load_settings_and_recipe(path: str | Path) -> tuple[dict, object]:
    """(training settings, the `recipe:` section or None) of a YAML file, read once."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise SpecdraftError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(read_text(path, "config file")) or {}
    except yaml.YAMLError as e:
        raise SpecdraftError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise SpecdraftError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    for key in data:
        if not isinstance(key, str):
            raise SpecdraftError(f"{path}: setting {key!r} is not a name (a key of type {type(key).__name__}); "
                                 "write each setting as name: value")
    data = {k.replace("-", "_"): v for k, v in data.items()}
    if "tensorboard" in data:   # config.yaml of a run from before --report-to
        data.setdefault("report_to", "tensorboard" if data.pop("tensorboard") is True else "none")
    recipe = data.pop("recipe", None)   # a recipe file's settings of the other stages (pipeline.py), not train's
    return data, recipe


def resolve_config(config_file: str | Path | None = None, **overrides) -> RunConfig:
    """Defaults < yaml file < explicit overrides (flags). With resume and no file, the run's own
    RUN/config.yaml is the file, so `--out RUN --resume` continues with the run's settings."""
    if config_file is None and overrides.get("resume") and overrides.get("out"):
        saved = run_layout.config_file(Path(overrides["out"]))
        config_file = saved if saved.is_file() else None   # missing: training refuses (check_resume_settings)
        if config_file is not None:
            try:
                RunConfig.from_dict(load_yaml(config_file), str(config_file))
            except SpecdraftError as e:
                raise SpecdraftError(f"{e}; --resume needs the run's record of its settings: restore it, or "
                                     "start a new run in another --out") from None
    values = load_yaml(config_file) if config_file else {}
    values.update(overrides)
    return RunConfig.from_dict(values, str(config_file or "options")).check()


def read_run_config(run: str | Path) -> RunConfig | None:
    """RUN/config.yaml as its RunConfig, for the commands that read a finished run (eval, report): the one schema
    of that file, as train --resume reads it, except that a setting this version no longer has (a run of an older
    one) is left out instead of refused. None where the run has none; a wrong type is one line naming the file."""
    path = run_layout.config_file(Path(run))
    if not path.is_file():
        return None
    settings = load_yaml(path)
    known = {f.name for f in dataclasses.fields(RunConfig)}
    return RunConfig.from_dict({k: v for k, v in settings.items() if k in known}, str(path))


def save_yaml(cfg: RunConfig, path: str | Path) -> None:
    import yaml

    with atomic_path(path) as tmp:
        tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))

