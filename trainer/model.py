"""The model: a Hugging Face causal LM from a local folder, its attention kernel, FSDP2 `fully_shard`
when there is more than one rank, and optional `torch.compile`.

A resume whose checkpoint replaces every parameter does not read the pretrained weights:
`build_empty_model` builds the structure from the config with parameters allocated but neither read
nor initialised (buffers, which checkpoints do not hold, are built as usual)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from trainer.config import Config, ConfigError
from trainer.empty import unfilled
from trainer.records import log
from trainer.weights import Weights, materialize

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def ensure_model(cfg: Config) -> Weights:
    """The model folder: copied from a bucket once per machine (trainer/weights.py), or built first when
    `model.create_if_missing` asks for it."""
    weights = materialize(cfg.model.path, cfg.model.weights_cache)
    path = weights.path
    if (path / "config.json").exists():
        return weights
    if cfg.model.create_if_missing == "tiny-qwen2":
        from trainer.data import read_documents
        from trainer.tiny import build_tiny_qwen2

        log(f"building tiny Qwen2 at {path} (model.create_if_missing)")
        build_tiny_qwen2(path, read_documents(cfg.data.uri, cfg.data.text_field))
        return weights
    raise ConfigError(
        f"config key 'model.path': {str(path)!r} is not a Hugging Face model folder "
        f"(no config.json); build one with `python -m trainer.tiny {path}`"
    )


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def import_model_class(path: Path) -> None:
    """Import the module of `path`'s causal-LM class without building anything: the heaviest of a start's
    imports (transformers' model module, and `torch._dynamo` through its masking utilities), done while
    Python's collector is paused and before the build allocates (trainer/collector.py). A folder the
    build cannot use is left for the build to report, with its own error."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(path))]
    except Exception:  # noqa: BLE001 - only a warm-up: load_model/build_empty_model raise the error
        pass


def load_model(cfg: Config, path: Path, device: torch.device) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(
        path,
        attn_implementation=cfg.model.attn_implementation,
        dtype=DTYPES[cfg.model.dtype],
        attention_dropout=cfg.model.dropout,
    )
    return model.to(device)


@contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Parameters registered inside go to the meta device (no memory, no initialisation cost);
    buffers do not (the same idea as accelerate's init_empty_weights(include_buffers=False))."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def build_empty_model(cfg: Config, path: Path, device: torch.device) -> torch.nn.Module:
    """The model of `path`'s config with uninitialised parameters on `device`: for a resume, which
    overwrites every parameter from the checkpoint. Tied parameters stay tied."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, attention_dropout=cfg.model.dropout)
    with _parameters_on_meta():
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation=cfg.model.attn_implementation, dtype=DTYPES[cfg.model.dtype]
        )
    made: dict[int, torch.nn.Parameter] = {}
    with unfilled():  # the resume overwrites every parameter (or the pretrained fallback, strictly)
        for module in model.modules():
            for name, p in list(module._parameters.items()):
                if p is not None and p.is_meta:
                    if id(p) not in made:
                        made[id(p)] = torch.nn.Parameter(
                            torch.empty_like(p, device=device), requires_grad=p.requires_grad
                        )
                    module._parameters[name] = made[id(p)]
    return model.to(device)


def shard(model: torch.nn.Module, mesh: DeviceMesh | None) -> torch.nn.Module:
    """FSDP2: each decoder layer, then the root. Not at world size 1 (`mesh` None): there FSDP2 has
    nothing to shard, and its per-layer hooks cost about a quarter of a small model's step (measured
    in docs/results.md). The checkpoint is the same either way: the same keys, each tensor one whole
    chunk, so a run resharded to and from 2 ranks loads exactly."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ConfigError("config key 'model.path': expected a decoder-only model with model.layers")
    if mesh is None:
        return model
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
