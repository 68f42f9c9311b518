"""The model: a Hugging Face causal LM from a local folder, its attention kernel, FSDP2 `fully_shard`,
and optional `torch.compile`."""

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
        path, attn_implementation=cfg.model.attn_implementation, dtype=DTYPES[cfg.model.dtype],
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


def compile_layers(model: torch.nn.Module) -> torch.nn.Module:
    """`torch.compile` each decoder layer in place. `nn.Module.compile` keeps the module (and so the
    state-dict keys that DCP saves under) where `torch.compile(model)` would wrap it in `_orig_mod`; a
    checkpoint written compiled loads uncompiled and back. Per layer, not the root: FSDP2's hooks stay
    outside the compiled regions, and every layer shares one compiled graph."""
    for layer in model.model.layers:
        layer.compile()
    return model
