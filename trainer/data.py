"""The corpus, packed into fixed-length samples, and the order in which each rank sees them.

The order of an epoch is a pure function of (seed, epoch): nothing about it lives in a generator
that would need saving. Within an epoch, a torchdata StatefulDataLoader holds the position; the
epoch number and the epoch's starting sample are plain integers saved beside it.

Global layout of one epoch: a permutation `perm` of all samples. Optimizer step s, micro-batch m,
rank r takes `perm[start + ((s*accum + m)*world + r)*bs : ... + bs]`, so the global sample position
is the same whatever the world size, which is what a resharded resume continues from.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import multiprocessing.context as mp_context
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
import torch
from torch.utils.data import Dataset, Sampler
from torchdata.stateful_dataloader import StatefulDataLoader

from trainer.config import ConfigError, DataConfig
from trainer.storage import redact, storage_error, storage_options


def read_documents(uri: str, text_field: str = "text") -> list[str]:
    """Documents of a corpus: JSONL (one object a line, `text_field` holds the text) or plain text
    (documents separated by blank lines)."""
    return documents(read_corpus(uri), uri, text_field)


def read_corpus(uri: str) -> bytes:
    """The corpus file's bytes; a clear error (naming `data.uri`) for what is not a readable file."""
    shown = redact(uri)
    try:
        with fsspec.open(uri, "rb", **storage_options(uri)) as f:
            return f.read()
    except FileNotFoundError:
        raise ConfigError(f"config key 'data.uri': {shown!r} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config key 'data.uri': {shown!r} is a directory, not a corpus file") from None
    except ConfigError:
        raise
    except Exception as e:  # an unreachable endpoint, a missing bucket, refused credentials
        raise storage_error(uri, "config key 'data.uri': reading", e) from None


def documents(raw: bytes, uri: str, text_field: str = "text") -> list[str]:
    """The documents in a corpus file's bytes `raw` (read from `uri`, whose suffix says the format)."""
    shown = redact(uri)
    try:
        # Universal newlines, as a text-mode read gives them: the documents (and so the samples) of a
        # corpus with \r\n line ends are what they always were.
        content = raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError:
        raise ConfigError(f"config key 'data.uri': {shown!r} is not UTF-8 text (.txt or .jsonl)") from None
    if uri.endswith(".jsonl"):
        docs = []
        for n, line in enumerate(content.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"config key 'data.uri': {shown} line {n} is not JSON ({e})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
                raise ConfigError(
                    f"config key 'data.text_field': {shown} line {n} has no string field {text_field!r}"
                )
            docs.append(obj[text_field])
    else:
        docs = [d.strip() for d in content.split("\n\n") if d.strip()]
    if not docs:
        raise ConfigError(f"config key 'data.uri': {shown!r} holds no documents")
    return docs


def pack(docs: list[str], tokenizer, seq_len: int) -> torch.Tensor:
    """Tokenize each document, end it with EOS, concatenate, and cut into [n, seq_len] samples."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ConfigError("config key 'model.path': the tokenizer has no eos_token")
    ids: list[int] = []
    for enc in tokenizer(docs, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(eos)
    n = len(ids) // seq_len
    if n == 0:
        raise ConfigError(
            f"config key 'data.seq_len': the corpus has {len(ids)} tokens, fewer than seq_len={seq_len}"
        )
    return torch.tensor(ids[: n * seq_len], dtype=torch.long).view(n, seq_len)


class PackedDataset(Dataset):
    def __init__(self, samples: torch.Tensor) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return self.samples.shape[0]

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.samples[i]


def epoch_seed(seed: int, epoch: int) -> int:
    digest = hashlib.sha256(f"baton-epoch:{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def epoch_permutation(n_samples: int, seed: int, epoch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(epoch_seed(seed, epoch))
    return torch.randperm(n_samples, generator=g)


@dataclass(frozen=True)
class Geometry:
    """Batch geometry of one run."""

    n_samples: int
    batch_size: int
    grad_accum: int
    world: int

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step, all ranks together."""
        return self.batch_size * self.grad_accum * self.world

    def steps_in_epoch(self, start: int = 0) -> int:
        """Whole optimizer steps left in an epoch that has consumed `start` samples."""
        return (self.n_samples - start) // self.global_batch


class EpochSampler(Sampler[int]):
    """This rank's sample indices for one epoch, from global sample `start` on, whole steps only."""

    def __init__(self, geo: Geometry, seed: int, epoch: int, rank: int, start: int = 0) -> None:
        self.geo, self.rank, self.start = geo, rank, start
        self.perm = epoch_permutation(geo.n_samples, seed, epoch)
        self.n_micro = geo.steps_in_epoch(start) * geo.grad_accum

    def __len__(self) -> int:
        return self.n_micro * self.geo.batch_size

    def __iter__(self) -> Iterator[int]:
        bs, world = self.geo.batch_size, self.geo.world
        for t in range(self.n_micro):
            base = self.start + (t * world + self.rank) * bs
            yield from self.perm[base : base + bs].tolist()


class IgnoreSigterm:
    """A DataLoader `worker_init_fn` after which the worker ends on a SIGTERM from its parent only, then runs
    `inner` (the loader's own, if any). An eviction signals the pod's whole process group (Argo's emissary,
    the local runner), and torch's workers install a SIGTERM handler that ends them whoever sent it
    (torch/csrc/DataLoader.cpp, handler_SIGTERM): the main process would then fail in the middle of a step,
    before its preemption save, with "DataLoader worker ... exited unexpectedly". Here SIGTERM stays blocked in
    the worker and a thread takes each one (sigwaitinfo, which names the sender): from the parent (multiprocessing
    ending its daemonic children at exit) the worker ends at once, as torch's handler would; from anyone else it
    is dropped, and the worker serves the step and the save. A worker ignoring its parent's SIGTERM too would hold
    the parent's exit, which joins it, until the grace's SIGKILL. Workers start with SIGTERM blocked
    (SigtermBlockedFork, below), so one that comes while a worker starts waits for that thread. A class, not a
    closure: picklable where workers are spawned."""

    def __init__(self, inner: Callable[[int], Any] | None = None) -> None:
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # threads started from here on inherit it
        threading.Thread(
            target=_end_on_parents_sigterm, args=(os.getppid(),), daemon=True, name="baton-sigterm"
        ).start()
        if self.inner is not None:
            self.inner(worker_id)


def _end_on_parents_sigterm(parent: int) -> None:
    while True:
        info = signal.sigwaitinfo({signal.SIGTERM})
        if info.si_pid == parent:
            os._exit(0)


class _StartsWithSigtermBlocked:
    """A worker process started with SIGTERM blocked: the child inherits the mask, so a SIGTERM sent to the pod's
    process group while the worker starts (an eviction at an epoch's first batch, when a loader starts its
    workers) stays pending until IgnoreSigterm runs, instead of meeting the handler torch installs first."""

    def start(self) -> None:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            super().start()  # type: ignore[misc]
        finally:
            signal.pthread_sigmask(
                signal.SIG_SETMASK, old
            )  # a SIGTERM that came meanwhile reaches this process now


class SigtermBlockedForkProcess(_StartsWithSigtermBlocked, mp_context.ForkProcess):
    pass


class SigtermBlockedSpawnProcess(_StartsWithSigtermBlocked, mp_context.SpawnProcess):
    pass


class SigtermBlockedFork(mp_context.ForkContext):
    Process = SigtermBlockedForkProcess


class SigtermBlockedSpawn(mp_context.SpawnContext):
    Process = SigtermBlockedSpawnProcess


def _sigterm_blocked(context: Any) -> Any:
    """The loader's multiprocessing context, starting its workers with SIGTERM blocked (fork and spawn; a
    forkserver's workers are forked by its server, so they are left as they are)."""
    method = context.get_start_method() if context is not None else multiprocessing.get_start_method()
    blocked = {"fork": SigtermBlockedFork, "spawn": SigtermBlockedSpawn}.get(method)
    return context if blocked is None or isinstance(context, blocked) else blocked()


def set_loader_attribute(loader: Any, name: str, value: Any) -> None:
    """Set a DataLoader's attribute where its iterators read it: on the loader, and on the DataLoader that an
    adapter wraps (accelerate's DataLoaderShard iterates its `base_dataloader`, and skip_first_batches builds
    its loader from the adapter's attributes)."""
    setattr(loader, name, value)
    base = vars(loader).get("base_dataloader")
    if base is not None:
        setattr(base, name, value)


def ignore_sigterm_in_workers(loader: Any) -> bool:
    """Give a DataLoader with workers an IgnoreSigterm `worker_init_fn` (around its own); whether it has workers.
    Before the loader's next iterator is made: each iterator reads the attribute when it starts its workers."""
    if not getattr(loader, "num_workers", 0):
        return False
    if not isinstance(loader.worker_init_fn, IgnoreSigterm):
        set_loader_attribute(loader, "worker_init_fn", IgnoreSigterm(loader.worker_init_fn))
    set_loader_attribute(loader, "multiprocessing_context", _sigterm_blocked(loader.multiprocessing_context))
    return True


class EpochData:
    """Builds the loader for (epoch, start) and says where the run is in its data."""

    def __init__(self, cfg: DataConfig, samples: torch.Tensor, seed: int, rank: int, world: int) -> None:
        self.cfg, self.seed, self.rank = cfg, seed, rank
        self.dataset = PackedDataset(samples)
        self.geo = Geometry(len(self.dataset), cfg.batch_size, cfg.grad_accum, world)
        if self.geo.steps_in_epoch() < 1:
            raise ConfigError(
                f"config key 'data.batch_size': one optimizer step needs {self.geo.global_batch} samples "
                f"(batch_size {cfg.batch_size} x grad_accum {cfg.grad_accum} x world {world}) "
                f"but the corpus packs into {self.geo.n_samples}"
            )
        self.seek(0, 0)

    def _make_loader(self) -> StatefulDataLoader:
        sampler = EpochSampler(self.geo, self.seed, self.epoch, self.rank, self.start)
        # A private generator keeps the loader's per-iterator seed draw off the global torch RNG.
        gen = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch) ^ self.rank)
        return StatefulDataLoader(
            self.dataset,
            batch_size=self.cfg.batch_size,
            sampler=sampler,
            drop_last=False,
            num_workers=self.cfg.num_workers,
            generator=gen,
            worker_init_fn=IgnoreSigterm() if self.cfg.num_workers else None,
            multiprocessing_context=_sigterm_blocked(None) if self.cfg.num_workers else None,
        )

    def seek(self, epoch: int, start: int, loader_state: dict | None = None, yielded: int = 0) -> None:
        """Position at (epoch, start). `loader_state` (with the `yielded` micro-batches it has given)
        restores the position within that loader."""
        self.epoch, self.start = epoch, start
        self.loader = self._make_loader()
        self.yielded = 0
        if loader_state is not None:
            self.loader.load_state_dict(loader_state)
            self.yielded = yielded
        self._iter: Iterator[torch.Tensor] | None = None

    def next_epoch(self) -> None:
        self.seek(self.epoch + 1, 0)

    def next_batch(self) -> torch.Tensor:
        if self._iter is None:
            self._iter = iter(self.loader)
        batch = next(self._iter)
        self.yielded += 1
        return batch

    @property
    def epoch_done(self) -> bool:
        return self.yielded >= len(self.loader)

    @property
    def position(self) -> int:
        """Global samples consumed in this epoch so far."""
        return self.start + self.yielded * self.geo.batch_size * self.geo.world
