"""A checkpoint root as the drill reads it, in either format: what `compare`, `status`, the bench and the
GPU check ask of a root, through one interface (`CheckpointRoot`), never a glob of their own.

- `DcpRoot`: baton's own, `<root>/runs/<run_id>/step-<N:08d>/` (one `Store` a run: trainer/checkpoint/store.py);
- `HfRoot`: the HF callback's, `<root>/checkpoint-N/` with a `_COMMIT` manifest (hf_read.py).
`open_root` tells them apart by what the root holds.
"""

from __future__ import annotations

from typing import Any, Protocol

from trainer.checkpoint.hf_read import (
    committed_checkpoints,
    final_hf_checkpoint,
    is_hf_root,
    load_hf_checkpoint,
)
from trainer.checkpoint.layout import CorruptCheckpoint, name_of, plain_name
from trainer.checkpoint.read import load_flat
from trainer.checkpoint.store import Store
from trainer.storage import redact, url_to_fs


class CheckpointRoot(Protocol):
    """A root of committed checkpoints."""

    uri: str
    format: str
    """"dcp" or "hf-checkpoint"."""

    def committed(self) -> dict[str, list[int]]:
        """Committed steps, newest first, by run (an HF root holds one run, named "")."""
        ...

    def final(self) -> tuple[str, dict[str, Any]]:
        """(url, manifest) of the newest committed checkpoint, the manifest checked against its commit
        marker and its schema: FileNotFoundError when there is none, CorruptCheckpoint (or the format's
        own refusal) when it is malformed."""
        ...

    def load(self, url: str, manifest: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
        """Every entry of the checkpoint at `url` as one flat mapping (every file checked against the
        manifest as it is read), and how many entries each part holds."""
        ...


def run_ids(root_uri: str) -> list[str]:
    """The runs under a DCP root (`<root>/runs/<run_id>/`), sorted; names that are not plain file names,
    and symlinks, are left out."""
    fs, root = url_to_fs(root_uri)
    fs.invalidate_cache()
    try:
        entries = fs.ls(f"{root.rstrip('/')}/runs", detail=True)
    except FileNotFoundError:
        return []
    out = []
    for e in entries:
        name = name_of(e["name"])
        try:
            plain_name(name, "the listing")
        except CorruptCheckpoint:
            continue
        if e.get("type") == "directory" and not e.get("islink"):
            out.append(name)
    return sorted(out)


class DcpRoot:
    format = "dcp"

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def committed(self) -> dict[str, list[int]]:
        runs = {run: Store(self.uri, run, check=False).committed_steps() for run in run_ids(self.uri)}
        return {run: steps for run, steps in runs.items() if steps}

    def final(self) -> tuple[str, dict[str, Any]]:
        newest: tuple[int, Store] | None = None
        for run_id in run_ids(self.uri):
            store = Store(self.uri, run_id, check=False)
            steps = store.committed_steps()
            if steps and (newest is None or steps[0] > newest[0]):
                newest = (steps[0], store)
        if newest is None:
            raise FileNotFoundError(f"no committed checkpoint under {redact(self.uri)}")
        step, store = newest
        return store.url(store.step_path(step)), store.read_manifest(step)

    def load(self, url: str, manifest: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
        flat = load_flat(url, manifest["files"])
        parts: dict[str, int] = {}
        for key in flat:
            part = key.split(".", 1)[0]
            parts[part] = parts.get(part, 0) + 1
        return flat, parts


class HfRoot:
    format = "hf-checkpoint"

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def committed(self) -> dict[str, list[int]]:
        steps = [step for step, _ in committed_checkpoints(self.uri)]
        return {"": steps} if steps else {}

    def final(self) -> tuple[str, dict[str, Any]]:
        return final_hf_checkpoint(self.uri)

    def load(self, url: str, manifest: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
        return load_hf_checkpoint(url)


def open_root(uri: str) -> CheckpointRoot:
    """The root at `uri` in its format: HF when it holds `checkpoint-N/` folders and no `runs/`, else DCP."""
    return HfRoot(uri) if is_hf_root(uri) else DcpRoot(uri)


def final_committed(root_uri: str) -> tuple[str, dict[str, Any]]:
    """(url, manifest) of the newest committed DCP checkpoint of any run under `root_uri`."""
    return DcpRoot(root_uri).final()
