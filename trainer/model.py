"""The model: a Hugging Face causal LM from a local folder, eager attention, FSDP2 `fully_shard`."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from trainer.config import Config, ConfigError
from trainer.records import log

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def ensure_model(cfg: Config) -> Path:
    """The model folder, built first when `model.create_if_missing` asks for it."""
    path = Path(cfg.model.path)
    if (path / "config.json").exists():
        return path
    if cfg.model.create_if_missing == "tiny-qwen2":
        from trainer.data import read_documents
        from trainer.tiny import build_tiny_qwen2

        log(f"building tiny Qwen2 at {path} (model.create_if_missing)")
        return build_tiny_qwen2(path, read_documents(cfg.data.uri, cfg.data.text_field))
    raise ConfigError(f"config key 'model.path': {str(path)!r} is not a Hugging Face model folder "
                      f"(no config.json); build one with `python -m trainer.tiny {path}`")


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def load_model(cfg: Config, path: Path, device: torch.device) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="eager", dtype=DTYPES[cfg.model.dtype],
        attention_dropout=cfg.model.dropout,
    )
    return model.to(device)


def shard(model: torch.nn.Module, mesh: DeviceMesh) -> torch.nn.Module:
    """FSDP2: each decoder layer, then the root."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ConfigError("config key 'model.path': expected a decoder-only model with model.layers")
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model
