"""RunConfig: every training setting and its default, in one place. A run is this config (saved
as RUN/config.yaml) plus the recipe in train/loop.py."""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass
from pathlib import Path

from specdraft.errors import SpecdraftError


@dataclass
class RunConfig:
    # inputs and output
    out: str = "ws/runs/run"                 # run folder: config.yaml, metrics.jsonl, checkpoints/
    store: str = "ws/hidden"                 # hidden-state store written by `specdraft capture`
    vocab: str = "ws/vocab.safetensors"      # draft vocab written by `specdraft vocab build`
    model: str = "default"                   # the target (teacher head, embeddings, checks)
    trust_remote_code: bool = False
    from_pretrained: str | None = None       # start from this drafter folder instead of from scratch
    remap: bool = True                       # remap a from_pretrained lm_head to the run's vocab (else refuse)
    resume: bool = False                     # continue the latest checkpoint in `out` exactly
    overwrite: bool = False                  # wipe the run already in `out` and start over (never saved as true)
    # drafter
    norm_before_residual: bool = False
    # objective
    ttt_steps: int = 3                       # unrolled draft steps per position (1..7)
    step_decay: float = 1.0                  # weight of step k is step_decay**k
    loss: str = "kl"                         # kl (teacher over the draft vocab) or ce (teacher argmax)
    aux_noise: float = 0.0                   # uniform noise U(-a, a) added to the aux states in training
    train_on_prompts: bool = False           # train every position (prompts too), validate on the loss mask
    attention: str = "sdpa"                  # sdpa (explicit TTT mask, any device) or flex (flex_attention, CUDA)
    # data
    max_tokens: int = 2048                   # tokens per packed row
    rows_per_batch: int = 1                  # packed rows per optimizer step (per rank)
    val_fraction: float = 0.05               # samples held out for validation (by sample, seeded)
    seed: int = 0
    # optimisation
    epochs: int = 2
    lr: float = 1e-4
    min_lr_ratio: float = 0.1                # final lr = lr * min_lr_ratio
    schedule: str = "cosine"                 # cosine, linear or constant, after warm-up
    warmup_steps: int = 20
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0                   # max grad norm (0 = off)
    precision: str = "auto"                  # auto (bf16 where the hardware has it), bf16 or fp32 autocast
    # logging and checkpoints
    log_every: int = 10                      # steps per metrics.jsonl train line
    val_every: int = 0                       # also validate every N steps (0 = each epoch only)
    save_every: int = 0                      # also checkpoint every N steps (0 = each epoch only)
    keep_step_checkpoints: int = 2           # step-N checkpoints kept (epoch ones are all kept)
    stop_after: int = 0                      # stop this invocation after N steps (0 = run to the end)
    tensorboard: bool = False                # also log to RUN/tensorboard (if tensorboard is installed)
    progress: bool = True
    # baseline watch (analysis/watch.py): compare with a baseline run at equal tokens_seen
    baseline: str | None = None              # run folder (or metrics.jsonl) of the run to beat, e.g. from scratch
    stop_if_behind: bool = False             # stop (with a checkpoint) once the watch finds the run behind
    watch_split: str = "val"                 # val: validation points; train: EMA of the train records
    watch_metric: str = "full_acc_0"         # higher is better
    watch_margin: float = 0.05               # behind when run < baseline - margin
    watch_warmup_tokens: int = 0             # no verdict before this many tokens
    watch_min_points: int = 2                # ... and only after this many consecutive points behind

    def check(self) -> "RunConfig":
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise SpecdraftError(f"{flag(f.name)} {value}: must be a finite number")
        for name, low in RANGES.items():
            value = getattr(self, name)
            if value < low:
                raise SpecdraftError(f"{flag(name)} {value}: must be >= {low}")
        if not 0 <= self.val_fraction < 1:
            raise SpecdraftError(f"--val-fraction {self.val_fraction}: must be in [0, 1)")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise SpecdraftError(f"--beta1 {self.beta1} --beta2 {self.beta2}: each must be in [0, 1)")
        if not 0 <= self.min_lr_ratio <= 1:
            raise SpecdraftError(f"--min-lr-ratio {self.min_lr_ratio}: must be in [0, 1]")
        if not 1 <= self.ttt_steps <= 7:
            raise SpecdraftError(f"--ttt-steps {self.ttt_steps}: must be 1..7")
        if self.loss not in ("kl", "ce"):
            raise SpecdraftError(f"--loss {self.loss}: use kl or ce")
        if self.attention not in ("sdpa", "flex"):
            raise SpecdraftError(f"--attention {self.attention}: use sdpa or flex")
        if self.schedule not in ("cosine", "linear", "constant"):
            raise SpecdraftError(f"--schedule {self.schedule}: use cosine, linear or constant")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise SpecdraftError(f"--precision {self.precision}: use auto, bf16 or fp32")
        if self.epochs < 1:
            raise SpecdraftError(f"--epochs {self.epochs}: must be at least 1")
        if self.lr <= 0:
            raise SpecdraftError(f"--lr {self.lr}: must be positive")
        if self.watch_split not in ("val", "train"):
            raise SpecdraftError(f"--watch-split {self.watch_split}: use val or train")
        if self.watch_min_points < 1:
            raise SpecdraftError(f"--watch-min-points {self.watch_min_points}: must be at least 1")
        if self.stop_if_behind and not self.baseline:
            raise SpecdraftError("--stop-if-behind: needs --baseline RUN (the run to compare with)")
        if self.log_every < 1:
            raise SpecdraftError(f"--log-every {self.log_every}: must be at least 1")
        if self.resume and self.overwrite:
            raise SpecdraftError("--resume and --overwrite: pick one (continue the run in --out, or wipe it and start over)")
        return self

    def watch_config(self):
        """The baseline watch's settings (analysis.watch.WatchConfig) from this run's."""
        from specdraft.analysis.watch import WatchConfig

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


# Lower bounds of the numeric settings (ranges with two ends are checked in RunConfig.check).
RANGES = {"max_tokens": 1, "rows_per_batch": 1, "warmup_steps": 0, "weight_decay": 0, "grad_clip": 0,
          "step_decay": 0, "aux_noise": 0, "val_every": 0, "save_every": 0, "keep_step_checkpoints": 0,
          "stop_after": 0, "watch_margin": 0, "watch_warmup_tokens": 0}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_type(name: str, value, expected, where: str):
    """A YAML value must have the setting's type: `epochs: three` or `progress: 'no'` (a string,
    which Python would treat as true) are refused by name instead of failing later or silently.
    Returns the value; `lr: 1e-4`, which PyYAML reads as a string, becomes the float it means."""
    allowed = typing.get_args(expected) or (expected,)      # `str | None` -> (str, NoneType)
    if value is None and type(None) in allowed:
        return value
    if float in allowed and isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if bool in allowed:
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
    import yaml

    path = Path(path)
    if not path.is_file():
        raise SpecdraftError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise SpecdraftError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise SpecdraftError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return {k.replace("-", "_"): v for k, v in data.items()}


def resolve_config(config_file: str | Path | None = None, **overrides) -> RunConfig:
    """Defaults < yaml file < explicit overrides (flags). With resume and no file, the run's own
    RUN/config.yaml is the file, so `--out RUN --resume` continues with the run's settings."""
    if config_file is None and overrides.get("resume") and overrides.get("out"):
        saved = Path(overrides["out"]) / "config.yaml"
        config_file = saved if saved.is_file() else None
    values = load_yaml(config_file) if config_file else {}
    values.update(overrides)
    return RunConfig.from_dict(values, str(config_file or "options")).check()


def save_yaml(cfg: RunConfig, path: str | Path) -> None:
    import yaml

    from specdraft.io import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))

