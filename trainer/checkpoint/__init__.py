"""Checkpointing, in one package with one interface: `Checkpoints` (interface.py), which the training
loop and the HF callback both go through, in two implementations: `Checkpointer` (DCP, the loop's) and
`HFCheckpointer` (the Hugging Face Trainer's `checkpoint-N/` folders, trainer/hf.py's). The interface
owns the rules: committed steps newest first, a resume that falls back past refused checkpoints, the
last committed step, retention after a commit (never after a preemption save), and the rule for failing
periodic saves. One exception means a bad checkpoint (`CorruptCheckpoint`); `CheckpointRefused` (another
run's) and `FencedOut` (a newer attempt owns the run) are the two others.

    interface.py        `Checkpoints`: the rules above, and `newest_intact` (the fallback)
    checkpointer.py     the DCP implementation: the state of the trainer's parts, save (with its read-back
                        policy), resume (resolve, load into staging, restore), the save in flight
    hf_checkpointer.py  the HF implementation, over hf_store.py
    store.py            one run's DCP checkpoints in a store: listing, attempts and fencing, commit, verify,
                        retention
    write.py            what a save writes and returns; hashing while writing
    read.py             reading: the `.metadata` allowlist (checked against the manifest first), a load that
                        hashes every file while DCP reads it, a whole checkpoint without a process group
    resolve.py          a restart's load: the newest intact checkpoint, into a staging copy, with fallback
    async_save.py       saves written while training goes on (a member of the store)
    layout.py           names, and the checks everything read from a bucket passes first
    digest.py           a file's checksum: the one place it is computed (checkpoints and model weights)
    hf_store.py         the HF Trainer's `checkpoint-N/` folders: commit, fetch, retention
    hf_read.py          reading an HF checkpoint safely, as one flat mapping (what compare judges)
    roots.py            a checkpoint root of either format, as the drill and the bench read it (`open_root`)

Outside the package, every module (the trainer's, the steps, the workflows, gpu/, the bench) imports the
names below from here, never a submodule (tests/unit/test_architecture.py reads every import). Each name is
imported from its submodule when it is first asked for (PEP 562), so that a torch-free caller (the config
hashing weights through `digest`) does not load torch with the package. Tests may reach inside.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    # the two implementations and what a trainer hands them
    "Checkpoints": "interface",
    "Checkpointer": "checkpointer",
    "HFCheckpointer": "hf_checkpointer",
    "Boundary": "checkpointer",
    "Parts": "checkpointer",
    "RestorePolicy": "checkpointer",
    "SaveResult": "write",
    # the three refusals
    "CorruptCheckpoint": "layout",
    "CheckpointRefused": "store",
    "FencedOut": "store",
    # names and reading, for the drill's steps, the bench and the trainer's other rooms
    "corpus_path": "layout",
    "hf_step_name": "layout",
    "load_flat": "read",
    "open_root": "roots",
    "wrapped_failures": "read",
    "file_problem": "tensor_record",
    "committed_checkpoints": "hf_read",
    "final_hf_checkpoint": "hf_read",
    "is_hf_root": "hf_read",
    "load_hf_checkpoint": "hf_read",
    "numpy_safe_globals": "hf_read",
    # what the bench measures itself: the store, a restart's load, a save's archive, and checksums
    "Store": "store",
    "resolve_and_load": "resolve",
    "ArchiveFileSystem": "write",
    "digest": None,
}
"""Exported name -> the submodule that defines it (None: the name is a submodule)."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_EXPORTS[name] or name}")
    value = module if _EXPORTS[name] is None else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
