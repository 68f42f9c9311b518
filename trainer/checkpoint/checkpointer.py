"""The training loop's checkpoints: `Checkpointer`, the DCP implementation of `Checkpoints`
(interface.py: newest first, resume with fallback, the last committed step, retention after a commit
but a preemption's, the rule for failing periodic saves).

A `Checkpointer` holds one run's store (trainer/checkpoint/store.py) and, from the resume on, the
trainer's stateful parts (`Parts`: model and optimizer, scheduler, data position, RNG). The training loop
goes through four calls:
- `begin(info)`: claims the attempt, lists the committed steps and starts reading the newest on a thread
  (prefetch.py), all before the model is built; its `Opened` says what the start needs;
- `resume(parts)`: the newest intact checkpoint (resolve.py, through `newest_intact`: fall back past
  refused ones, retry a failing store), loaded into a staging copy and then restored into the live parts;
  None for a fresh start;
- `save(at, reason)`: the checkpointer decides (`at` is the step the loop is at, whose boundary is captured
  only when a save happens, or a boundary captured earlier: a preemption's). Called with "periodic" at the
  end of every step, it
  commits the save in flight once every rank's upload is done and saves when `checkpoint.every_steps` or
  the wall-clock cadence says so, and a failure lets training go on (the interface's rule); "warning",
  "preempt" and "final" save now, unless that step is committed already (a preemption first lets the save
  in flight commit). A commit sets `last_committed`, tells the loop (`on_commit`) and is followed by the
  interface's retention;
- `wait_for_staging()`: before the optimizer moves the weights, an asynchronous save's staging copy must
  be done.
A boundary's state (`Boundary`) is the parts' own: `Parts.capture(step)`, taken before the next step
moves past it.

The checkpoint state is tensors only: the model's and the optimizer's state dicts, the learning rates,
the scheduler's counters, the progress, and per rank (under rank-unique keys: DCP deduplicates on the
key alone) the RNG states and the data loader's position (JSON bytes as a uint8 tensor).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_model_state_dict, set_state_dict

from trainer import rng
from trainer.checkpoint.interface import Checkpoints, Emit
from trainer.checkpoint.layout import CorruptCheckpoint
from trainer.checkpoint.prefetch import Prefetch
from trainer.checkpoint.resolve import LoadTimes, resolve_and_load
from trainer.checkpoint.store import Store
from trainer.checkpoint.write import SaveResult
from trainer.collectives import broadcast, rank, world
from trainer.config import CheckpointConfig
from trainer.empty import unfilled
from trainer.faults import retry_reads
from trainer.records import log
from trainer.storage import StorageError, describe
from trainer.untrusted import Refused, parse_json


@dataclass(frozen=True)
class RestorePolicy:
    """What a resume restores: everything, for real work. The negative controls, read once at the start
    (trainer/loop.py: `BATON_SKIP_RESTORE=rng,data,optimizer,scheduler`, `BATON_SWAP_RANK_STATE`), leave
    parts as they were built or take another rank's state, so that a test can show the drill catches each.
    `Checkpointer._restore` applies it in one place: each part of PARTS is restored only when `restores(part)`,
    from `source_rank`'s state; the optimizer's moments are then not even loaded (DCP loads in place)."""

    PARTS = ("rng", "data", "optimizer", "scheduler")
    skip: frozenset[str] = frozenset()
    """Parts left as they were built (a subset of PARTS)."""
    swap_ranks: bool = False
    """Each rank takes the state of rank world-1-rank: the per-rank RNG and data position of another."""

    def __post_init__(self) -> None:
        unknown = set(self.skip) - set(self.PARTS)
        if unknown:
            raise ValueError(f"unknown part(s) {sorted(unknown)}; known: {', '.join(self.PARTS)}")

    def restores(self, part: str) -> bool:
        return part not in self.skip

    def source_rank(self, rank_: int, world: int) -> int:
        return world - 1 - rank_ if self.swap_ranks else rank_

    def describe(self) -> str | None:
        """The log line of a resume under a negative control; None for real work."""
        if not (self.skip or self.swap_ranks):
            return None
        return f"NEGATIVE CONTROL: restore skipped for {sorted(self.skip)}, swapped ranks={self.swap_ranks}"


def tensor_from_json(obj: Any) -> torch.Tensor:
    return torch.frombuffer(bytearray(json.dumps(obj, sort_keys=True).encode()), dtype=torch.uint8).clone()


def json_from_tensor(t: torch.Tensor) -> Any:
    """A JSON object held in a byte tensor of a checkpoint (a loader's state): strict and depth-capped
    (trainer/untrusted.py); Refused for anything else."""
    return parse_json(t.to(torch.uint8).numpy().tobytes(), "the loader state", expect=dict)


@dataclass
class Boundary:
    """Everything about a step boundary that the live objects move past during the next step."""

    step: int
    epoch: int
    start: int
    yielded: int
    rng: dict[str, torch.Tensor]
    loader: dict[str, Any]


@dataclass
class Parts:
    """The trainer's stateful parts, as a checkpoint holds them."""

    model: torch.nn.Module
    optim: torch.optim.Optimizer
    sched: Any
    """A LambdaLR: its `last_epoch` and `_step_count` are saved."""
    data: Any
    """trainer.data.EpochData: the epoch, its starting sample and the loader's position."""
    rank: int
    world: int
    seed: int
    """Re-seeds the RNG when a checkpoint of another world size is resumed (its per-rank RNG cannot carry over)."""
    batch_size: int
    num_workers: int

    def capture(self, step: int) -> Boundary:
        """The state of the boundary before `step + 1`: what the next step moves past."""
        d = self.data
        return Boundary(step, d.epoch, d.start, d.yielded, rng.capture(), d.loader.state_dict())


@dataclass
class Opened:
    """What a start needs from the store, read once by `Checkpointer.begin` (every rank gets the same)."""

    attempt: int
    """This attempt's number, claimed in the store (older attempts are fenced out from here on)."""
    committed: list[int]
    """The committed steps, newest first."""
    newest_url: str | None
    """Where the newest committed checkpoint is (None: none), for the `restore` record."""
    prefetching: bool
    """The newest is being read on a thread: the restore has begun."""
    start_times: list[float] | None
    """The attempts' start times (unix seconds), when asked for (the `auto` cadence's history)."""


@dataclass
class Resumed:
    step: int
    manifest: dict[str, Any]
    same_world: bool
    url: str


@dataclass
class Saved:
    """What `Checkpointer.save` did: `outcome` is saved, already_committed, nothing_to_save, not_due or failed
    (a periodic save that may fail); `blocking_ms` what the caller waited; `busy` whether a save was or is in
    flight (waiting for it took a while: a stop decision made before it is stale)."""

    outcome: str
    blocking_ms: float = 0.0
    busy: bool = False


class Checkpointer(Checkpoints):
    """One run's checkpoints, and the parts they save and restore (the module docstring lists the four calls).

    `policy` is what a resume restores (RestorePolicy: everything, unless a negative control says
    otherwise). Never anything but the default for real work. `emit` writes the records (it decides which
    ranks write); `manifest(boundary)` gives the trainer's fields of a save's manifest; `on_commit(result,
    reason)` is told of each commit, on every rank; `saving()` is entered around each save that happens (the loop marks its phase).
    """

    def __init__(
        self,
        cfg: CheckpointConfig,
        run_id: str,
        fingerprint: str,
        emit: Emit,
        manifest: Callable[[Boundary], dict[str, Any]],
        on_commit: Callable[[SaveResult, str], None],
        policy: RestorePolicy = RestorePolicy(),
        max_failed_saves: int = 3,
        saving: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> None:
        super().__init__(max_failed_saves)
        self.cfg, self.fingerprint, self.policy = cfg, fingerprint, policy
        self.emit, self.manifest, self.on_commit, self.saving = emit, manifest, on_commit, saving
        self.store = Store(cfg.uri, run_id, io_threads=cfg.io_threads, digest_algorithm=cfg.digest)
        self.parts: Parts | None = None
        self.attempt: int | None = None
        self._prefetch: Prefetch | None = None
        self._committed: list[int] | None = None  # begin's listing, for the resume

    # -- the start --
    def begin(self, info: dict[str, Any], times: dict[str, float], history: bool = False) -> Opened:
        """Claim this attempt (`info` is written beside it), list the committed steps, and start reading the
        newest on a thread when one rank loads it all (prefetch.py: several ranks each load a shard, which the
        thread cannot know). `times` gets `init_claim_s` and `listing_s`; `history`: read the attempts' start
        times too. Collective: rank 0 asks the store, every rank gets its answers."""
        t = time.perf_counter()
        self.attempt = broadcast(self.store.claim_attempt(info) if self._rank0 else None)
        times["init_claim_s"] = round(time.perf_counter() - t, 3)
        t = time.perf_counter()
        committed = self._committed = self.committed_steps()
        times["listing_s"] = round(time.perf_counter() - t, 3)
        if committed and world() == 1:
            self._prefetch = Prefetch(self.store, committed[0])
        return Opened(
            self.attempt,
            committed,
            self.url(committed[0]) if committed else None,
            self._prefetch is not None,
            self.store.attempt_start_times() if history else None,
        )

    # -- the store's --
    def committed_steps(self) -> list[int]:
        """Committed steps, newest first (one listing request, on rank 0; every rank gets its answer)."""
        return broadcast(self.store.committed_steps() if self._rank0 else None)

    def url(self, step: int) -> str:
        return self.store.url(self.store.step_path(step))

    def retain(self, newest: int) -> list[int]:
        """The store's retention (keep_last, the best by a metric, the newest verified), on rank 0."""
        if not self._rank0:
            return []
        return self.store.retain(self.cfg.keep_last, newest, self.cfg.keep_best_metric)

    @property
    def _rank0(self) -> bool:
        return rank() == 0

    def _p(self) -> Parts:
        if self.parts is None:
            raise RuntimeError("Checkpointer.resume(parts) must come before saving")
        return self.parts

    # -- the state --
    def state(self, b: Boundary, parts: Parts | None = None) -> dict[str, Any]:
        """What a checkpoint of boundary `b` holds, from `parts` (by default the resume's)."""
        p = parts or self._p()
        model_sd, optim_sd = get_state_dict(p.model, p.optim)
        return {
            "model": model_sd,
            "optim": {"state": optim_sd["state"]},
            "optim_lr": torch.tensor(
                [[g["lr"], g["initial_lr"]] for g in p.optim.param_groups], dtype=torch.float64
            ),
            "sched": torch.tensor([p.sched.last_epoch, p.sched._step_count], dtype=torch.int64),
            "progress": torch.tensor([b.step, b.epoch, b.start, b.yielded], dtype=torch.int64),
            f"rng.rank{p.rank}": b.rng,
            f"loader.rank{p.rank}": tensor_from_json(
                {
                    "rank": p.rank,
                    "epoch": b.epoch,
                    "start": b.start,
                    "yielded": b.yielded,
                    "state": b.loader,
                    "num_workers": p.num_workers,
                }
            ),
        }

    # -- save --
    def wait_for_staging(self) -> None:
        """Before the optimizer moves the weights: an asynchronous save's staging copy must be done."""
        self.store.asyncs.before_update()

    def save(self, at: Boundary | int, reason: str, due: bool = False) -> Saved:
        """Save if it is time (see the module docstring): `at` is a boundary captured earlier (a preemption's,
        taken at the step's start) or the step the loop is at, whose boundary is captured only when a save
        happens; `due`: the wall-clock cadence says a periodic save is due (decided with every rank).
        Collective: every rank gets the same outcome, and every rank raises the same StorageError for a
        warning, preemption or final save that failed."""
        step = at if isinstance(at, int) else at.step
        st = self.store.asyncs
        busy = st.pending is not None
        if reason == "periodic":
            try:
                st.step_boundary()  # the save in flight: commit it if every rank's upload is done
            except StorageError as e:  # that asynchronous save failed: nothing of it is committed
                self.periodic_save_failed(step, str(e), self.emit)
            every = self.cfg.every_steps
            if self.last_committed == step or not (due or (every and step % every == 0)):
                return Saved("not_due", busy=busy or st.pending is not None)
            try:
                ms = self._save(self._boundary(at), reason)
            except StorageError as e:  # every rank raises it (the commit is collective): every rank goes on
                self.periodic_save_failed(step, str(e), self.emit)
                return Saved("failed", busy=True)
            return Saved("saved", ms, busy=True)
        if reason == "preempt":
            failed = st.drain(raise_storage_errors=False)  # a save in flight commits first
            if failed:
                log(f"the checkpoint in flight failed ({failed}); saving step {step} synchronously")
            if step == 0 and self.last_committed is None:
                # Nothing trained yet: a restart recomputes this exact state from the config and seed.
                log("nothing to save before the first step")
                return Saved("nothing_to_save", busy=busy)
        if self.last_committed == step:
            if reason == "preempt":
                log(f"step {step} is committed already: exiting")
            return Saved("already_committed", busy=busy)
        return Saved("saved", self._save(self._boundary(at), reason), busy=True)

    def _boundary(self, at: Boundary | int) -> Boundary:
        return self._p().capture(at) if isinstance(at, int) else at

    def _save(self, b: Boundary, reason: str) -> float:
        """Save `b` now (reason: periodic, warning, preempt, final); once it is committed, `last_committed` is its
        step, `on_commit` is called and the interface's retention follows (`after_commit`: none after a
        preemption save). Returns the ms the caller blocked. A periodic save with `async_save` commits later,
        at a step boundary; a save of a step already in flight only waits for it (unless periodic)."""
        pending = self.store.asyncs.pending
        if pending is not None and pending.step == b.step:  # this step is already being saved
            if reason != "periodic":
                with self.saving():
                    self.store.asyncs.drain()  # it must be durable now: wait for it to commit
            return 0.0
        manifest = {"fingerprint": self.fingerprint, "reason": reason, **self.manifest(b)}

        def committed(res: SaveResult) -> None:
            self.committed(res.step, res.path)
            self.on_commit(res, reason)
            self.after_commit(res.step, reason)

        with self.saving():
            if self.cfg.async_save and reason == "periodic":
                return self.store.asyncs.save_async(b.step, self.state(b), manifest, self.attempt, committed)
            # Saves hash their files while writing them. Retention never deletes the newest verified
            # checkpoint (read back, or loaded by this attempt's resume), so a periodic save also reads its
            # files back when there is none yet, or when it would otherwise push the verified one out of the
            # newest keep_last (one periodic save in keep_last; with keep_last 1, every one), and so does the
            # final save. Preemption and warning saves never read back: the grace is short (GKE Spot: 15 s),
            # and a resume hashes every file while loading it.
            st = self.store
            read_back = reason == "final" or (
                reason == "periodic"
                and (st.verified_step is None or st.unverified_commits + 1 >= self.cfg.keep_last)
            )
            return st.save(
                b.step, self.state(b), manifest, self.attempt, committed, read_back=read_back
            ).save_ms

    # -- resume --
    def resume(
        self, parts: Parts, read_retry_s: float, times: dict[str, float] | None = None
    ) -> Resumed | None:
        """Load the newest intact checkpoint of those `begin` listed and restore it into `parts` (kept for the
        saves); None when none is usable (every one refused, or none committed). Each refused one is
        announced (`refused`: a log line and a `checkpoint_refused` record). A store that fails while being
        read is retried for `read_retry_s` (then faults.StoreUnreachable); a checkpoint of another run raises
        CheckpointRefused. `times` (the start's phase timings, for the `resume` record) gets this load's:
        `listing_s` (begin's, kept), `manifest_s` and `load_verify_s`."""
        self.parts = p = parts
        load_times = LoadTimes(listing=(times or {}).pop("listing_s", 0.0))
        try:
            loaded = retry_reads(
                lambda: resolve_and_load(
                    self.store,
                    self.fingerprint,
                    self._template,
                    lambda step, why: self.refused(step, why, self.emit),
                    times=load_times,
                    steps=self._committed,
                    check_staged=_progress_matches,
                    prefetched=self._prefetch.take if self._prefetch else None,
                ),
                read_retry_s,
                StorageError,
                log,
                several_ranks=p.world > 1,
            )
        finally:
            if self._prefetch is not None:
                if self._prefetch.used:  # its items were loaded on its thread
                    load_times.copies.update(self._prefetch.copies)
                if times is not None:
                    times.update(self._prefetch.phases())
            if times is not None:
                times.update(load_times.as_dict())
            self._prefetch = None  # its tensors are the staged state now, or dropped
        if loaded is None:
            return None
        step, manifest, st = loaded
        same_world = manifest.get("world_size") == p.world
        self._restore(st, manifest, same_world)
        self.resumed(step)
        if self.policy.describe():
            log(self.policy.describe())
        return Resumed(step, manifest, same_world, self.url(step))

    def _source_rank(self) -> int:
        p = self._p()
        return self.policy.source_rank(p.rank, p.world)

    def _template(self, step: int, manifest: dict) -> dict[str, Any]:
        """The state to load `step` into: the live state's structure, with the saved RNG and loader shapes
        (read from .metadata, checked first). Rank 0 reads them and every rank gets the same answer,
        failure included: ranks that disagreed would enter dcp.load's collectives out of step."""
        p = self._p()
        answer: tuple[str, Any] = ("ok", None)
        if self._rank0:
            try:
                answer = ("ok", self.store.shapes(step, manifest))
            except CorruptCheckpoint as e:
                answer = ("corrupt", str(e))
            except Exception as e:  # noqa: BLE001 - a read that failed: carried to every rank, retried there
                answer = ("storage", describe(e))
        kind, shapes = broadcast(answer)
        if kind == "corrupt":
            raise CorruptCheckpoint(f"cannot read .metadata: {shapes}")
        if kind == "storage":
            raise StorageError(f"reading the .metadata of step {step} failed: {shapes}")
        src = self._source_rank()
        moments = self.policy.restores("optimizer")
        if moments:  # the control keeps the optimizer's own (zeroed) state: it is never loaded
            empty_adam_state(p.optim)
        template = self.state(p.capture(0))
        if (
            not moments
        ):  # DCP loads in place, into the optimizer's own tensors: the control must not ask for them
            template.pop("optim")
        template.pop(f"rng.rank{p.rank}")
        template.pop(f"loader.rank{p.rank}")
        if manifest.get("world_size") == p.world:
            # The generators the checkpoint holds, not the ones this process has: a CPU checkpoint
            # resumed on a GPU has no `cuda` state (restore() then leaves CUDA's seeded stream alone).
            stored = sum(f["size"] for f in manifest["files"].values())

            def empty(key: str, dtype: torch.dtype) -> torch.Tensor:
                shape = shapes.get(key)
                if shape is None:
                    raise CorruptCheckpoint(f"the checkpoint holds no {key}")
                if math.prod(shape) * dtype.itemsize > stored:  # a shape no file could hold
                    raise CorruptCheckpoint(
                        f".metadata gives {key} the shape {shape}, larger than the checkpoint"
                    )
                return torch.empty(shape, dtype=dtype)

            template[f"rng.rank{src}"] = {
                k: empty(f"rng.rank{src}.{k}", v.dtype)
                for k, v in rng.capture().items()
                if f"rng.rank{src}.{k}" in shapes
            }
            template[f"loader.rank{src}"] = empty(f"loader.rank{src}", torch.uint8)
        return template

    def _param_groups(self, lrs: torch.Tensor) -> list[dict[str, Any]]:
        p = self._p()
        _, optim_sd = get_state_dict(p.model, p.optim)
        groups = optim_sd["param_groups"]
        for g, (lr, initial) in zip(groups, lrs.tolist(), strict=True):
            g["lr"], g["initial_lr"] = lr, initial
        return groups

    def _restore(self, st: dict[str, Any], manifest: dict[str, Any], same_world: bool) -> None:
        """The staged checkpoint into the live parts (every file of it has matched its checksum by now): the
        model always, then each part the policy restores, in one place."""
        self._restore_model(st, moments=self.policy.restores("optimizer"))
        for part, restore in (
            ("scheduler", self._restore_scheduler),
            ("data", self._restore_data),
            ("rng", self._restore_rng),
        ):
            if self.policy.restores(part):
                restore(st, manifest, same_world)

    def _restore_model(self, st: dict[str, Any], moments: bool) -> None:
        """The model, the learning rates, and the optimizer's moments unless the control drops them."""
        p = self._p()
        if moments:
            set_state_dict(
                p.model,
                p.optim,
                model_state_dict=st["model"],
                optim_state_dict={
                    "state": st["optim"]["state"],
                    "param_groups": self._param_groups(st["optim_lr"]),
                },
            )
        else:
            set_model_state_dict(p.model, st["model"])
            for g, (lr, initial) in zip(p.optim.param_groups, st["optim_lr"].tolist(), strict=True):
                g["lr"], g["initial_lr"] = lr, initial  # the control drops the moments, not the schedule

    def _restore_scheduler(self, st: dict[str, Any], manifest: dict[str, Any], same_world: bool) -> None:
        p = self._p()
        last_epoch, step_count = st["sched"].tolist()
        p.sched.last_epoch, p.sched._step_count = last_epoch, step_count
        p.sched._last_lr = [g["lr"] for g in p.optim.param_groups]

    def _restore_data(self, st: dict[str, Any], manifest: dict[str, Any], same_world: bool) -> None:
        p = self._p()
        _, epoch, start, yielded = st["progress"].tolist()  # its step was checked on the staging copy
        if same_world:
            blob = json_from_tensor(st[f"loader.rank{self._source_rank()}"])
            if blob.get("num_workers", 0) == p.num_workers:
                p.data.seek(epoch, start, blob["state"], yielded)
            else:  # a loader state does not carry across worker counts; the sample order does
                p.data.seek(epoch, start + yielded * p.batch_size * p.world)
        else:
            # Another world size: continue from the same global sample in the epoch.
            p.data.seek(epoch, start + yielded * p.batch_size * manifest["world_size"])
            if p.data.epoch_done:
                p.data.next_epoch()

    def _restore_rng(self, st: dict[str, Any], manifest: dict[str, Any], same_world: bool) -> None:
        p = self._p()
        if same_world:
            rng.restore(st[f"rng.rank{self._source_rank()}"])
        else:
            step = int(st["progress"][0])
            rng.seed_everything(p.seed * 1_000_003 + step, p.rank)


def _progress_matches(step: int, staged: dict[str, Any]) -> str | None:
    """A staged checkpoint whose saved progress is not its folder's step (a copy of step 8 named
    step-00000099) is refused before it reaches the model: the loader falls back."""
    progress = staged.get("progress")
    if not isinstance(progress, torch.Tensor) or progress.numel() != 4:
        return "the checkpoint holds no progress record"
    saved = int(progress[0])
    if saved != step:
        return f"the folder is step {step} but the checkpoint holds progress for step {saved}"
    for key, blob in staged.items():  # parsed here, so that a malformed one falls back before the restore
        if key.startswith("loader.rank") and isinstance(blob, torch.Tensor):
            try:
                json_from_tensor(blob)
            except Refused as e:
                return str(e)
    return None


def empty_adam_state(optim: torch.optim.Optimizer) -> bool:
    """Adam(W)'s per-parameter state as its own lazy initialisation makes it (`Adam._init_group`: the
    `step` scalar's dtype and device, `exp_avg`, `exp_avg_sq`, `max_exp_avg_sq` with amsgrad), but left
    empty, for a resume that overwrites all of it. Without it DCP's get_state_dict creates the state by
    running a step of zero gradients over every parameter (`_init_optim_state`): 3.1 s of a 125 M
    restart on this CPU, for values the load then replaces. False (nothing done) for another optimizer
    or one that has state already."""
    from torch.optim.optimizer import _get_scalar_dtype

    if not isinstance(optim, torch.optim.Adam) or optim.state:
        return False
    for group in optim.param_groups:
        for param in group["params"]:
            if not param.requires_grad:
                continue
            if group["capturable"] or group["fused"]:
                step = torch.zeros((), dtype=_get_scalar_dtype(is_fused=group["fused"]), device=param.device)
            else:
                step = torch.tensor(0.0, dtype=_get_scalar_dtype(), device="cpu")
            names = (
                ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if group["amsgrad"] else ("exp_avg", "exp_avg_sq")
            )
            with unfilled():
                optim.state[param] = {
                    "step": step,
                    **{n: torch.empty_like(param, memory_format=torch.preserve_format) for n in names},
                }
    return True
