"""The run's configuration: dataclasses, YAML loading, `--set` overrides, validation, fingerprint.

Every field has a docstring. Validation lives in `__post_init__` and every message names the
dotted key, so `--set optim.lr=abc` says `optim.lr` and not "bad float".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainer.cadence import CadenceConfig
from trainer.faults import FaultsConfig
from trainer.notice import NoticeConfig
from trainer.validation import ConfigError
from trainer.validation import require as _require
from trainer.weights import identity

__all__ = ["Config", "ConfigError", "load_config", "config_from_dict"]


ATTN_IMPLEMENTATIONS = ("eager", "sdpa")
DIGESTS = ("crc32c", "blake3", "sha256")  # trainer/checkpoint/digest.py ALGORITHMS
# Keys added after runs existed: they enter the fingerprint only when they differ from these defaults,
# so a run started before they existed keeps its run_id (and resumes) after an upgrade.
_FINGERPRINT_ONLY_IF_SET = {"attn_implementation": "eager", "compile": False}


@dataclass
class ModelConfig:
    path: str = ""
    """A Hugging Face causal LM, loaded with `from_pretrained`: a local folder, or a bucket URI (s3://,
    gs://) holding weights staged with `python -m trainer.weights stage`, which each machine copies to
    `weights_cache` once, checked against their manifest. Where the folder holds `baton-weights.json`,
    the fingerprint has the weights' identity (the hash of that manifest) instead of this path."""
    weights_cache: str = ""
    """Local folder for the copies of weights from a bucket (empty: <system temp>/baton-weights). Not in
    the fingerprint."""
    dropout: float = 0.0
    """Attention dropout (Qwen2's `attention_dropout`). > 0 makes every forward pass draw from the RNG."""
    dtype: str = "float32"
    """Parameter dtype: float32 or bfloat16."""
    create_if_missing: str = ""
    """If set to 'tiny-qwen2' and `path` (a local folder) does not exist, build a tiny Qwen2 (random weights from a fixed
    seed, tokenizer trained on `data.uri`) and `save_pretrained` it there first. Empty: `path` must exist."""
    attn_implementation: str = "eager"
    """Attention kernel: `eager` (the Hugging Face reference, deterministic everywhere) or `sdpa`
    (torch's scaled_dot_product_attention: fused, the fast path on a GPU). In the fingerprint when not
    `eager`: another kernel computes other roundings and, with dropout, draws other masks."""
    compile: bool = False
    """`torch.compile` each decoder layer in place (`nn.Module.compile`, so the state-dict keys and the
    checkpoint format do not change). In the fingerprint when true: Inductor fuses and reorders the
    arithmetic and draws dropout from its own RNG stream."""

    def __post_init__(self) -> None:
        _require(0.0 <= self.dropout < 1.0, "model.dropout", f"must be in [0, 1), got {self.dropout}")
        _require(
            self.dtype in ("float32", "bfloat16"),
            "model.dtype",
            f"must be float32 or bfloat16, got {self.dtype!r}",
        )
        _require(
            self.create_if_missing in ("", "tiny-qwen2"),
            "model.create_if_missing",
            f"must be '' or 'tiny-qwen2', got {self.create_if_missing!r}",
        )
        _require(
            self.attn_implementation in ATTN_IMPLEMENTATIONS,
            "model.attn_implementation",
            f"must be one of {', '.join(ATTN_IMPLEMENTATIONS)}, got {self.attn_implementation!r}",
        )


@dataclass
class DataConfig:
    uri: str = ""
    """fsspec URI or local path of the corpus: `.txt` (one document per blank-line-separated block) or `.jsonl`."""
    text_field: str = "text"
    """The field that holds the text in a JSONL corpus."""
    seq_len: int = 64
    """Tokens per packed sample."""
    batch_size: int = 4
    """Samples per micro-batch, per rank."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    num_workers: int = 0
    """DataLoader worker processes. Does not change what is computed."""
    pack_cache: bool = True
    """Keep the packed corpus beside the run's checkpoints (`runs/<run_id>/corpus/`), so that a restart
    reads it back instead of loading the tokenizer and tokenizing again (trainer/packed.py). Does not
    change what is computed."""

    def __post_init__(self) -> None:
        _require(self.seq_len >= 2, "data.seq_len", f"must be >= 2, got {self.seq_len}")
        _require(self.batch_size >= 1, "data.batch_size", f"must be >= 1, got {self.batch_size}")
        _require(self.grad_accum >= 1, "data.grad_accum", f"must be >= 1, got {self.grad_accum}")
        _require(self.num_workers >= 0, "data.num_workers", f"must be >= 0, got {self.num_workers}")


@dataclass
class OptimConfig:
    lr: float = 1e-3
    """Peak learning rate of AdamW."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping."""
    warmup_steps: int = 5
    """Linear warmup from lr/warmup_steps to lr over this many steps."""
    min_lr_ratio: float = 0.1
    """Cosine decay ends at lr * min_lr_ratio at total_steps."""

    def __post_init__(self) -> None:
        _require(self.lr > 0, "optim.lr", f"must be > 0, got {self.lr}")
        _require(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            "optim.betas",
            f"must be two numbers in [0, 1), got {self.betas}",
        )
        _require(self.eps > 0, "optim.eps", f"must be > 0, got {self.eps}")
        _require(self.weight_decay >= 0, "optim.weight_decay", f"must be >= 0, got {self.weight_decay}")
        _require(self.grad_clip >= 0, "optim.grad_clip", f"must be >= 0, got {self.grad_clip}")
        _require(self.warmup_steps >= 0, "optim.warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        _require(
            0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}"
        )


@dataclass
class CheckpointConfig:
    uri: str = ""
    """Root of the checkpoint store: any fsspec URI (file://, s3://, gs://) or a local path.
    Checkpoints go to <uri>/runs/<run_id>/step-<step:08d>/."""
    every_steps: int = 10
    """Save every N optimizer steps (0: only the final checkpoint and preemption saves)."""
    keep_last: int = 3
    """Retention: keep the newest K committed checkpoints (the final one is always kept)."""
    keep_best_metric: str = "loss"
    """Retention also keeps the committed checkpoint with the lowest value of this metric (recorded in
    its manifest from the step record of its step). Empty: keep the newest `keep_last` only."""
    io_threads: int = 4
    """Threads per rank that write a checkpoint (DCP's thread_count: a file per thread) and hash its
    files, at the commit and when a resume verifies them. 1: one file per rank, written and hashed
    in turn. Not part of the fingerprint: a checkpoint written with any value loads with any other."""
    digest: str = "crc32c"
    """Checksum of the data files in the manifest (trainer/checkpoint/digest.py): `crc32c` (fast, finds
    torn and corrupt files, no defence against a forger), `blake3` (cryptographic, multi-threaded) or
    `sha256`. `.metadata` always has sha256. Not part of the fingerprint: every algorithm is read."""
    async_save: bool = False
    """Periodic saves write in the background (dcp.async_save on a gloo group of their own) and commit
    at a later step boundary; the step after a save waits only for the staging copy. Preemption and
    final saves stay synchronous, after the save in flight has committed."""

    def __post_init__(self) -> None:
        _require(bool(self.uri), "checkpoint.uri", "is required (an fsspec URI or a local path)")
        _require(self.every_steps >= 0, "checkpoint.every_steps", f"must be >= 0, got {self.every_steps}")
        _require(self.keep_last >= 1, "checkpoint.keep_last", f"must be >= 1, got {self.keep_last}")
        _require(
            self.keep_best_metric == "" or self.keep_best_metric.isidentifier(),
            "checkpoint.keep_best_metric",
            f"must be a metric name of the step record (such as 'loss') or '', got {self.keep_best_metric!r}",
        )
        _require(
            isinstance(self.io_threads, int) and 1 <= self.io_threads <= 64,
            "checkpoint.io_threads",
            f"must be an integer in [1, 64], got {self.io_threads!r}",
        )
        _require(
            self.digest in DIGESTS,
            "checkpoint.digest",
            f"must be one of {', '.join(DIGESTS)}, got {self.digest!r}",
        )
        _require(
            isinstance(self.async_save, bool),
            "checkpoint.async_save",
            f"must be true or false, got {self.async_save!r}",
        )


TRAINER_KEYS = ("name", "model.path", "data.uri")
"""What baton's own trainer needs beyond the defaults (a script of one's own builds its model and data)."""
REQUIRED_WHY = {
    "name": "the run's name: the run_id is <name>-<fingerprint>",
    "model.path": "a Hugging Face model folder, or a bucket URI of staged weights",
    "data.uri": "a corpus path or fsspec URI",
}


@dataclass
class Config:
    name: str = ""
    """Experiment name; the run_id is <name>-<first 12 hex of the fingerprint>."""
    seed: int = 0
    """Seeds python, numpy and torch, and the per-epoch data order."""
    total_steps: int = 40
    """Optimizer steps to train. The cosine schedule ends here."""
    deterministic: bool = True
    """torch.use_deterministic_algorithms(True) and CUBLAS_WORKSPACE_CONFIG."""
    log_every: int = 1
    """Write a human-readable progress line to stderr every N steps."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    notice: NoticeConfig = field(default_factory=NoticeConfig)
    """Preemption warnings: podinfo annotations and GCP's metadata server (trainer/notice.py)."""
    cadence: CadenceConfig = field(default_factory=CadenceConfig)
    """Wall-clock and Young/Daly checkpoint cadence beside checkpoint.every_steps (trainer/cadence.py)."""
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    """Failed periodic saves and the collective timeout (trainer/faults.py)."""

    def __post_init__(self) -> None:
        _require(
            all(c.isalnum() or c in "-_." for c in self.name),
            "name",
            f"may hold letters, digits, '-', '_' and '.', got {self.name!r}",
        )
        _require(self.seed >= 0, "seed", f"must be >= 0, got {self.seed}")
        _require(self.total_steps >= 1, "total_steps", f"must be >= 1, got {self.total_steps}")
        _require(self.log_every >= 1, "log_every", f"must be >= 1, got {self.log_every}")

    def require(self, keys: tuple[str, ...]) -> Config:
        """Refuse the config if any of `keys` (dotted) is empty, naming the first; returns self. baton's
        trainer needs TRAINER_KEYS; a script of one's own (`baton_args`) only what the drill sets."""
        for key in keys:
            value: Any = self
            for part in key.split("."):
                value = getattr(value, part)
            _require(bool(value), key, f"is required ({REQUIRED_WHY[key]})")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def fingerprint(self) -> str:
        """SHA-256 over the canonical JSON of the fields that change what is computed."""
        return hashlib.sha256(
            json.dumps(fingerprint_fields(self), sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()

    @property
    def run_id(self) -> str:
        return f"{self.name}-{self.fingerprint[:12]}"


def fingerprint_fields(cfg: Config) -> dict[str, Any]:
    """What a run computes: model (with its attention kernel and compilation), data, seed, optimizer,
    schedule, batch geometry, dropout, precision, determinism. Storage, logging, checkpoint cadence and
    worker counts are left out. The model is its weights' manifest hash where it has one (so reading
    the fingerprint of bucket weights reads their manifest), else its path."""
    data = dataclasses.asdict(cfg.data)
    data.pop("num_workers")
    data.pop("pack_cache")
    model = dataclasses.asdict(cfg.model)
    model.pop("create_if_missing")
    model.pop("weights_cache")
    weights = identity(cfg.model.path)
    if weights is not None:  # the same weights, wherever they lie, are the same run
        del model["path"]
        model["weights"] = weights
    for key, default in _FINGERPRINT_ONLY_IF_SET.items():
        if model[key] == default:
            del model[key]
    return {
        "model": model,
        "data": data,
        "optim": dataclasses.asdict(cfg.optim),
        "seed": cfg.seed,
        "total_steps": cfg.total_steps,
        "deterministic": cfg.deterministic,
    }


# ---- building from nested dicts, with type checks that name the key --------------------------------


def _check_type(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is bool:
        _require(isinstance(value, bool), key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        _require(
            isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer, got {value!r}"
        )
        return value
    if tp is float:
        _require(
            isinstance(value, (int, float)) and not isinstance(value, bool),
            key,
            f"must be a number, got {value!r}",
        )
        _require(math.isfinite(value), key, f"must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        _require(isinstance(value, str), key, f"must be a string, got {value!r}")
        return value
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        _require(isinstance(value, list), key, f"must be a list, got {value!r}")
        return [_check_type(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"unsupported union in config type for {key}")
    raise TypeError(f"unsupported config type {tp!r} for {key}")


def _build(cls: type, raw: Any, prefix: str) -> Any:
    where = prefix or "the top level"
    if not isinstance(raw, dict):
        raise ConfigError(f"config key '{where}': must be a mapping, got {repr(raw)[:80]}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for k in raw:
        if k not in names:
            full = f"{prefix}.{k}" if prefix else str(k)
            raise ConfigError(f"config key '{full}': unknown key (known here: {', '.join(sorted(names))})")
    kwargs = {}
    for k, v in raw.items():
        full = f"{prefix}.{k}" if prefix else k
        tp = hints[k]
        if dataclasses.is_dataclass(tp):
            kwargs[k] = _build(tp, v, full)
        else:
            kwargs[k] = _check_type(v, tp, full)
    return cls(**kwargs)


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b=value` -> (['a', 'b'], value), the value parsed as YAML (so 3 is int, 0.1 float, true bool)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected dotted.key=value")
    key, _, text = item.partition("=")
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {item!r}: expected dotted.key=value")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        path, value = parse_override(item)
        node = raw
        for i, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(
                    f"config key '{'.'.join(path[: i + 1])}': is not a section, cannot set {'.'.join(path)}"
                )
            node = child
        node[path[-1]] = value
    return raw


def load_config(
    path: str | Path | None, overrides: list[str] | None = None, required: tuple[str, ...] = TRAINER_KEYS
) -> Config:
    """Read a YAML config (or start empty), apply `dotted.key=value` overrides, validate; `required`: the
    keys that may not be left empty (Config.require)."""
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except UnicodeDecodeError:
            raise ConfigError(
                f"config file {str(p)!r} is not text (not UTF-8): is it the right file?"
            ) from None
        except OSError as e:
            raise ConfigError(f"config file {str(p)!r} cannot be read: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {str(e)[:300]}") from None
    apply_overrides(raw, overrides or [])
    return _build(Config, raw, "").require(required)


def config_from_dict(raw: dict[str, Any]) -> Config:
    """A config from a dict, validated as load_config validates it, TRAINER_KEYS required."""
    return _build(Config, json.loads(json.dumps(raw)), "").require(TRAINER_KEYS)
