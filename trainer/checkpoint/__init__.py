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

Outside the package, modules import from here; what is not exported is the package's own (tests, and
the bench, which measures the store itself, import those from their submodules).
"""

from trainer.checkpoint.checkpointer import Boundary, Checkpointer, Parts, RestorePolicy
from trainer.checkpoint.hf_checkpointer import HFCheckpointer
from trainer.checkpoint.interface import Checkpoints
from trainer.checkpoint.layout import CorruptCheckpoint, corpus_path, hf_step_name
from trainer.checkpoint.read import load_flat
from trainer.checkpoint.roots import open_root
from trainer.checkpoint.store import CheckpointRefused, FencedOut

__all__ = ["Boundary", "CheckpointRefused", "Checkpointer", "Checkpoints", "CorruptCheckpoint", "FencedOut",
           "HFCheckpointer", "Parts", "RestorePolicy", "corpus_path", "hf_step_name", "load_flat", "open_root"]
