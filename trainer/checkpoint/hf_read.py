"""Reading Hugging Face Trainer `checkpoint-N/` folders safely (what `compare` judges).

Nothing from the bucket is unpickled into code: model weights come from safetensors; the optimizer,
the scheduler and the RNG state are loaded with `torch.load(weights_only=True)` (the RNG file holds
numpy arrays, so numpy's array reconstruction, `ndarray`, `dtype` and the uint32 dtype class are
allowed: the list `transformers.trainer_pt_utils.safe_globals()` allows, rebuilt here so that
compare does not import transformers); JSON files are parsed as JSON. `training_args.bin` is left
out: it pickles transformers/accelerate classes and holds no tensors.

Every value becomes an entry of one flat mapping, named by its part and path (`model.<name>`,
`optimizer.state.0.exp_avg`, `scheduler.last_epoch`, `rng.rng_state.pth.cpu`, `trainer_state.global_step`):
tensors as they are, numbers and lists of numbers as tensors, strings and None as they are. Before
anything is read, each file is checked against the size and sha256 that `_COMMIT` lists.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np
import torch

from trainer.checkpoint.digest import of_bytes
from trainer.checkpoint.layout import COMMIT, CorruptCheckpoint, hf_step_name, hf_step_of, parse_hf_commit
from trainer.checkpoint.tensor_record import bytes_problem
from trainer.storage import full_url, url_to_fs
from trainer.untrusted import Refused, parse_json, read_bytes

SKIPPED = ("training_args.bin",)
# Paths and wall-clock values in trainer_state.json that say where or when, not what was computed.
TRAINER_STATE_SKIPPED = ("best_model_checkpoint", "trial_name", "trial_params")


def numpy_safe_globals() -> list[Any]:
    np_core = np._core if hasattr(np, "_core") else np.core
    return [np_core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def committed_checkpoints(root: str) -> list[tuple[int, str]]:
    """(step, url) of every `checkpoint-N/` under `root` with a `_COMMIT`, newest first (by N as a number)."""
    fs, base = url_to_fs(root)
    fs.invalidate_cache()
    base = base.rstrip("/")
    try:
        entries = fs.ls(base, detail=True)
    except FileNotFoundError:
        return []
    steps = sorted(
        (
            step
            for e in entries
            if e.get("type") == "directory"
            and not e.get("islink")
            and (step := hf_step_of(e["name"].rstrip("/").rsplit("/", 1)[-1])) is not None
        ),
        reverse=True,
    )
    return [
        (s, full_url(fs, f"{base}/{hf_step_name(s)}"))
        for s in steps
        if fs.exists(f"{base}/{hf_step_name(s)}/{COMMIT}")
    ]


def is_hf_root(root: str) -> bool:
    """Whether `root` holds HF `checkpoint-N/` folders (committed or not) rather than baton's `runs/`."""
    fs, base = url_to_fs(root)
    fs.invalidate_cache()
    try:
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(base.rstrip("/"), detail=False)]
    except FileNotFoundError:
        return False
    return any(hf_step_of(n) is not None for n in names) and "runs" not in names


def final_hf_checkpoint(root: str) -> tuple[str, dict[str, Any]]:
    """The newest committed checkpoint under `root` and its manifest (the `_COMMIT` body)."""
    found = committed_checkpoints(root)
    if not found:
        raise FileNotFoundError(f"no committed checkpoint-N (with {COMMIT}) under {root}")
    step, url = found[0]
    fs, path = url_to_fs(url)
    try:
        manifest = parse_hf_commit(read_bytes(fs, f"{path}/{COMMIT}", "manifest", f"{url}/{COMMIT}"), step)
    except (CorruptCheckpoint, Refused) as e:
        raise CorruptCheckpoint(f"{url}: {e}") from None
    manifest.setdefault("step", step)
    return url, manifest


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, torch.Tensor):
        out[prefix] = value
    elif isinstance(value, np.ndarray):
        out[prefix] = torch.from_numpy(value.copy())
    elif isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}", v, out)
    elif isinstance(value, (list, tuple)):
        if value and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            dtype = torch.float64 if any(isinstance(v, float) for v in value) else torch.int64
            out[prefix] = torch.tensor(value, dtype=dtype)
        else:
            for i, v in enumerate(value):
                _flatten(f"{prefix}.{i}", v, out)
    elif isinstance(value, bool):
        out[prefix] = torch.tensor(value)
    elif isinstance(value, int):
        out[prefix] = torch.tensor(value, dtype=torch.int64)
    elif isinstance(value, float):
        out[prefix] = torch.tensor(value, dtype=torch.float64)
    else:  # str, None: compared by equality
        out[prefix] = value


def _part(name: str) -> str | None:
    if name.endswith(".safetensors"):
        return "model"
    if name == "optimizer.pt":
        return "optimizer"
    if name == "scheduler.pt":
        return "scheduler"
    if name.startswith("rng_state") and name.endswith(".pth"):
        return "rng"
    if name == "trainer_state.json":
        return "trainer_state"
    if name.endswith(".json"):
        return "config"
    if name.endswith((".pt", ".pth")):
        return "other"
    return None


def load_hf_checkpoint(url: str) -> tuple[dict[str, Any], dict[str, int]]:
    """Every value of a committed HF checkpoint as one flat mapping, and how many entries each part
    holds. Raises CorruptCheckpoint if a file does not match the manifest or cannot be loaded safely."""
    from safetensors.torch import load as load_safetensors

    fs, path = url_to_fs(url)
    path = path.rstrip("/")
    try:
        files = parse_hf_commit(
            read_bytes(fs, f"{path}/{COMMIT}", "manifest", f"{url}/{COMMIT}"),
            hf_step_of(path.rsplit("/", 1)[-1]) or 0,
        )["files"]
    except OSError as e:
        raise CorruptCheckpoint(f"{url}: unreadable {COMMIT}: {e}") from None
    except (CorruptCheckpoint, Refused) as e:
        raise CorruptCheckpoint(f"{url}: {e}") from None
    flat: dict[str, Any] = {}
    parts: dict[str, int] = {}
    for name in sorted(files):
        if name in SKIPPED:
            continue
        meta = files[name]
        try:  # never more than the manifest declares, and only from a regular file
            data = read_bytes(fs, f"{path}/{name}", "hf_file", f"{url}/{name}", cap=meta["size"])
        except FileNotFoundError:
            raise CorruptCheckpoint(f"{url}/{name} is missing") from None
        except OSError as e:
            raise CorruptCheckpoint(f"{url}/{name} is unreadable: {e}") from None
        except Refused as e:
            raise CorruptCheckpoint(f"{e}: it does not match its size in {COMMIT}") from None
        if len(data) != meta["size"] or of_bytes("sha256", data) != meta["sha256"]:
            raise CorruptCheckpoint(f"{url}/{name} does not match its size or sha256 in {COMMIT}")
        part = _part(name)
        before = len(flat)
        try:
            if part == "model":
                for k, v in load_safetensors(data).items():
                    flat[f"model.{k}"] = v
            elif part in ("optimizer", "scheduler", "rng", "other"):
                why = bytes_problem(data)
                if why is not None:  # before torch.load would inflate what its records declare
                    raise CorruptCheckpoint(f"{url}/{name}: {why}")
                with torch.serialization.safe_globals(numpy_safe_globals()):
                    obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
                _flatten(part if part != "rng" and part != "other" else f"{part}.{name}", obj, flat)
            elif part == "trainer_state":
                state = parse_json(data, f"{url}/{name}", expect=dict)
                for k in TRAINER_STATE_SKIPPED:
                    state.pop(k, None)
                _flatten("trainer_state", state, flat)
            elif part == "config":
                _flatten(f"config.{name}", parse_json(data, f"{url}/{name}"), flat)
            else:
                flat[f"file.{name}"] = of_bytes("sha256", data)
                part = "file"
        except (
            pickle.UnpicklingError,
            RuntimeError,
            ValueError,
            TypeError,
            EOFError,
        ) as e:  # weights_only refusals
            raise CorruptCheckpoint(
                f"{url}/{name} cannot be loaded safely: {str(e).splitlines()[0][:300]}"
            ) from None
        parts[part] = parts.get(part, 0) + len(flat) - before
    return flat, parts
