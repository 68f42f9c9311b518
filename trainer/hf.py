"""baton's contract for a Hugging Face `Trainer` script: one callback, about three added lines.

    from baton.hf import BatonCallback, baton_args                    # 1
    baton = BatonCallback(checkpoint_uri=cfg.checkpoint.uri)          # 2  (before the slow set-up: it installs the
    trainer = Trainer(..., callbacks=[baton])                         #     SIGTERM handler)
    sys.exit(baton.run(trainer))                                      # 3  instead of trainer.train()

How (transformers 5.24's loop, read from its source):
- SIGTERM only sets a flag. The stop is decided in `on_log`, after the step's optimizer update and its
  loss, where every rank is at the same step: one all-reduce, which also carries the step's trajectory
  (`batch_sha`, `rng_sha`) and whether its raw loss was finite. A signal between the micro-batches of a
  gradient-accumulation step lets the step finish first (its RNG state would otherwise hold the
  abandoned micro-batches' dropout draws).
- `on_save` waits for every rank (HF has no barrier there), then rank 0 commits: the files, mirrored to
  `checkpoint_uri` unless that is `output_dir`, then `_COMMIT` last. Every checkpoint operation goes
  through `HFCheckpointer` (trainer/checkpoint/hf_checkpointer.py), the HF implementation of the one
  interface the training loop uses too: resume with fallback, the last committed step, retention after
  a commit but a preemption's, and the rule for failing periodic saves are its, not this module's.
  After the loop's break, `on_epoch_end` would save the same step again under its marker: it is cleared.
- `run(trainer)` resumes from the newest committed `checkpoint-N` that verifies, takes over HF's RNG
  restore on a mid-epoch resume (trainer/hf_rng.py), and returns baton's exit code (README, "Exit
  codes"): 75 once a preemption checkpoint is committed or for a fault a retry can mend (`retry_later`),
  0 when training finished and its final checkpoint is committed, 1 otherwise (a loss that is not finite
  included). Set the Trainer's `ddp_timeout` from `faults.collective_timeout()` (HF's default: 30 min).

Several nodes: each node's first rank writes its pod's records (`step`, `preempt`, `retry_later`,
`done`; trainer/records.py). Where the nodes share no disk (found at the start: a file rank 0 writes
into `output_dir` that the others look for), each other node's first rank uploads its node's files of a
checkpoint (its ranks' `rng_state_<i>.pth`, ...) before rank 0 commits, and the manifest lists every
node's files; at a resume, each of them fetches the whole checkpoint, checked, as rank 0 does.

Limits: HF's full checkpoint layout (`save_only_model=False`); `save_total_limit=1` with checkpoints
committed in place is refused (HF rotates before `on_save`), and so is committing in place on nodes that
share no disk.
"""

from __future__ import annotations

import math
import os
import time
import traceback
import uuid
from typing import Any

import torch
from transformers import TrainerCallback

from trainer import collectives, trajectory
from trainer.checkpoint import CorruptCheckpoint, HFCheckpointer, hf_step_name
from trainer.config import Config
from trainer.data import ignore_sigterm_in_workers
from trainer.exits import EXIT_FAIL, EXIT_OK, EXIT_PREEMPTED
from trainer.faults import FaultsConfig, SavesFailing, StoreUnreachable, is_peer_failure
from trainer.hf_rng import EpochRng, PrefetchRng, UnsupportedSampler, refuse_private_samplers
from trainer.hooks import Point, hooks
from trainer.preemption import Preemption
from trainer.records import LOADER_WORKERS_KILLED, POD_EVENTS, UNCOMMITTED_FILE, Records, log
from trainer.storage import StorageError


def baton_args(argv: list[str] | None = None, description: str | None = None) -> Config:
    """The arguments every trainer under the drill gets, parsed: `--config FILE` and any number of `--set
    dotted.key=value` (baton's config schema, trainer/config.py: `seed`, `total_steps`, `model.dropout`,
    `checkpoint.uri`, `checkpoint.every_steps`, ...). A bad config is one line on stderr and exit 1. The
    script's own flags are left alone (parse_known_args): parse them with your own parser's
    `parse_known_args()`, since `--config` and `--set` are on the same command line."""
    import argparse
    import sys

    from trainer.config import ConfigError, load_config

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--config", required=True, help="YAML config in baton's schema")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args, _theirs = ap.parse_known_args(argv)
    try:
        # Only what the drill sets is needed (checkpoint.uri and the rest have defaults): the script builds
        # its own model and data, so name, model.path and data.uri may be left out.
        cfg = load_config(args.config, args.overrides, required=())
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    cfg.name = cfg.name or "hf"
    return cfg


_LAUNCHER_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
)


def _one_process_is_not_distributed() -> None:
    """A launcher's environment for a world of one (torchrun's, or steps.train's direct launch) makes the
    Trainer treat the run as distributed and wrap the model in DistributedDataParallel, for nothing. The
    callback comes before the TrainingArguments: it takes that environment away, so one rank is one
    process to the Trainer (the run id and the rendezvous address stay; nothing else reads them)."""
    if os.environ.get("WORLD_SIZE") == "1":
        for name in _LAUNCHER_ENV:
            os.environ.pop(name, None)


class BatonCallback(TrainerCallback):
    """Preemption-safe saving, committed checkpoints and baton's records for a HF `Trainer`.

    Args:
        checkpoint_uri: where committed `checkpoint-N/` folders live: `args.output_dir` itself, or any
            fsspec URI (file://, s3://, gs://) that outlives the pod. None: `args.output_dir`.
        run_id: the `run_id` field of every record.
        keep_last: committed checkpoints kept under a `checkpoint_uri` other than `output_dir`.
        faults: failed saves in a row that end the run, and how long a resume retries a failing read
            (trainer/faults.py; `collective_timeout_s` is the Trainer's `ddp_timeout` here).
    """

    def __init__(
        self,
        checkpoint_uri: str | None = None,
        run_id: str = "hf",
        keep_last: int = 3,
        faults: FaultsConfig | None = None,
    ) -> None:
        self.preempt = Preemption()
        self.preempt.install()  # first: a SIGTERM during the rest of the set-up still ends in a clean 75
        _one_process_is_not_distributed()
        self.checkpoint_uri, self.run_id, self.keep_last = checkpoint_uri, run_id, keep_last
        self.faults = faults or FaultsConfig()
        self.retry_reason: str | None = None  # set when the run must end with 75 for a fault (retry_later)
        self.ckpt: HFCheckpointer | None = None
        self.rec = Records(run_id, 0, 0)
        self.rank, self.world = 0, 1
        self.node_first = True  # the first rank of its node: it writes its pod's records
        self.shared_disk = True  # every rank sees one output_dir (one node, or a shared file system)
        self.stopping: int | None = None  # the step the ranks decided to stop at
        self.stop_decided_at = 0.0
        self.pending_step: int | None = None  # a step whose record is still to come (its on_log)
        self.last_hook_at = time.perf_counter()
        self.micro = 0
        self.finished = False
        self.failed: str | None = None  # why the run must end with 1 (a loss that is not finite)
        self.inputs = trajectory.InputDigest()
        self.prefetch: PrefetchRng | None = None
        self.epoch_rng: EpochRng | None = None
        self.rng_at_step_begin = 0
        self._hooked = False
        self.fresh = False  # a fresh start (no checkpoint to resume): its first on_train_begin writes `start`
        self.committed_files: dict[int, dict[str, int]] = {}  # rank 0: each commit's local files and sizes
        self.reported_late: set[tuple[int, str]] = set()

    @property
    def last_committed(self) -> int | None:
        """The last committed step (the checkpoints' own: set by the resume and by every commit)."""
        return self.ckpt.last_committed if self.ckpt is not None else None

    @property
    def last_checkpoint(self) -> str | None:
        return self.ckpt.last_url if self.ckpt is not None else None

    # -- records --
    def emit(self, event: str, step: int, **fields: Any) -> None:
        if self.rank == 0 or (self.node_first and event in POD_EVENTS):
            self.rec.emit(event, step, **fields)

    # -- start-up and resume --
    def _setup(self, args) -> None:
        if self.ckpt is not None:
            return
        self.rank, self.world = collectives.rank(), collectives.world()
        self.node_first = int(os.environ.get("LOCAL_RANK", "0")) == 0
        self.ckpt = HFCheckpointer(
            self.checkpoint_uri or args.output_dir,
            args.output_dir,
            self.keep_last,
            self.faults.max_failed_saves,
        )
        if self.world > 1:
            self.shared_disk = _one_disk(args.output_dir, self.rank)
        if self.ckpt.in_place and not self.shared_disk:
            raise ValueError(
                "checkpoints committed in output_dir on nodes that share no disk: the other nodes' "
                "files would be left out; set checkpoint_uri to a bucket"
            )
        if self.ckpt.in_place and args.save_total_limit == 1:
            raise ValueError(
                "save_total_limit=1 with checkpoints committed in output_dir: HF rotates before "
                "on_save, so a kill in that gap leaves no committed checkpoint; use 2 or more, or a "
                "checkpoint_uri elsewhere"
            )
        if args.save_only_model:
            raise ValueError(
                "save_only_model=True: the checkpoint lacks the optimizer, scheduler and RNG "
                "state that an exact resume needs"
            )
        if torch.cuda.is_available() and args.device.type == "cuda":
            self.preempt.device = args.device  # the stop all-reduce runs on NCCL there
        # Rank 0 claims; every rank records the same attempt (a node's first rank writes its pod's records,
        # and verify counts them by attempt: attempt 0 on node 1 read as "trained without a resume record").
        attempt = collectives.broadcast(self.ckpt.claim_attempt() if self.rank == 0 else None)
        self.rec = Records(self.run_id, attempt, self.rank)
        bound = self.faults.collective_timeout(self.preempt.grace).total_seconds()
        if self.world > 1 and self.rank == 0 and args.ddp_timeout > bound:
            log(
                f"warning: TrainingArguments.ddp_timeout is {args.ddp_timeout} s: a dead or hung rank keeps the "
                f"others waiting that long; set it to {bound:g} s (faults.collective_timeout()) to end the pod "
                f"inside its grace of {self.preempt.grace:g} s"
            )

    def resume_checkpoint(self, args) -> str | None:
        """The local folder of the newest committed checkpoint that verifies (fetched from the bucket
        when it lives there), or None for a fresh start. Rank 0 chooses; every rank gets its answer."""
        self._setup(args)
        self.preempt.phase = "restore"  # what a signal met: the `preempt` record's `during`
        assert self.ckpt is not None
        step = self.ckpt.resume(self.emit, self.faults.read_retry_s)  # with fallback; rank 0 fetched it
        if step is None:
            self.emit("resume", 0, from_step=0, fresh=True)
            self.fresh = True  # on_train_begin writes the exact start, once the optimizer exists
            return None
        local = self.ckpt.folder(step) if self.shared_disk else self._fetch_on_every_node(step)
        manifest = self.ckpt.manifest(step) if self.rank == 0 else {}
        self.emit(
            "resume",
            step,
            from_step=step,
            checkpoint=self.last_checkpoint,
            saved_world_size=manifest.get("world_size"),
        )
        log(f"resuming from {self.last_checkpoint}")
        return local

    def _fetch_on_every_node(self, step: int) -> str:
        """The checkpoint rank 0 chose, fetched and checked by each other node's first rank too (every
        rank of the Trainer loads the model, optimizer and its own RNG file from its node's disk); this
        rank's local folder of it. A node that cannot fetch it makes every rank raise StoreUnreachable
        (75): the next attempt chooses again."""
        assert self.ckpt is not None
        error = None
        if self.node_first and self.rank != 0:
            try:
                self.ckpt.fetch(step, self.faults.read_retry_s)
            except (CorruptCheckpoint, StoreUnreachable) as e:
                error = f"checkpoint-{step} on the node of rank {self.rank}: {e}"
        errors = [e for e in collectives.gather(error) if e]
        if errors:
            raise StoreUnreachable(errors[0])
        return self.ckpt.folder(step)

    def run(self, trainer) -> int:
        """`trainer.train()` from the newest committed checkpoint; the process's exit code: 0 finished
        and committed, 75 preempted and committed or ended by a fault a retry can mend (a `retry_later`
        record), 1 anything else."""
        # Last among the callbacks, whatever the order they were given in: every other callback's on_save (an
        # EMA's file, say) has written into checkpoint-N before this one commits it.
        callbacks = trainer.callback_handler.callbacks
        if self in callbacks:
            callbacks.remove(self)
        callbacks.append(self)
        try:
            checkpoint = self.resume_checkpoint(trainer.args)
            self.epoch_rng = EpochRng(self.rank, checkpoint)  # the sampler runs here, whatever the workers
            if trainer.args.dataloader_num_workers == 0:  # the collator runs here, where its RNG can be kept
                self.prefetch = PrefetchRng(self.rank)
                self.prefetch.install(trainer, checkpoint)
            if (
                checkpoint is not None
            ):  # after PrefetchRng's, so that it sees the Trainer's restore as it ends
                self.epoch_rng.install(trainer)
            trainer.train(resume_from_checkpoint=checkpoint)
        except StoreUnreachable as e:
            return self._retry_later("store_unreachable", getattr(trainer.state, "global_step", 0), str(e))
        except UnsupportedSampler as e:  # refused before the first step: a retry cannot help
            log(f"error: {e}")
            self.emit(
                "failed", getattr(trainer.state, "global_step", 0), reason="unsupported_sampler", error=str(e)
            )
            return EXIT_FAIL
        except Exception as e:
            if _loader_workers_died(e):
                return self._loader_workers_killed(getattr(trainer.state, "global_step", 0), e)
            if self.world > 1 and is_peer_failure(e):
                # A dead or hung peer (bounded by ddp_timeout): every commit waits for every rank and is
                # all-or-nothing, so a retry resumes from the last one. Any rank may be the survivor.
                return self._retry_later(
                    "peer_lost", trainer.state.global_step, str(e).splitlines()[0][:300], every_rank=True
                )
            traceback.print_exc()
            return EXIT_FAIL
        finally:
            self._late_files()
        if self.retry_reason:
            return EXIT_PREEMPTED  # its retry_later record is written
        if self.failed:
            return EXIT_FAIL
        step = trainer.state.global_step
        if self.stopping is not None and self.stopping < trainer.state.max_steps:
            return EXIT_PREEMPTED if self.last_committed == self.stopping else EXIT_FAIL
        if step >= trainer.state.max_steps and self.last_committed == step:
            self.emit("done", step, total_steps=trainer.state.max_steps, checkpoint=self.last_checkpoint)
            log(f"done: {step} steps, final checkpoint {self.last_checkpoint}")
            return EXIT_OK
        log(
            f"training ended at step {step} of {trainer.state.max_steps} without a committed final checkpoint"
        )
        return EXIT_FAIL

    def _loader_workers_killed(self, step: int, e: BaseException) -> int:
        """The training loader's workers died (torch raised in the middle of a step): a `failed` record that says
        so, and 1. Torch's workers end on SIGTERM unless told otherwise; the callback gives every training
        loader an IgnoreSigterm worker_init_fn (trainer/data.py), so a worker_init_fn that put SIGTERM back, or
        another signal, did this."""
        why = (
            f"the data loader's workers were killed{' by the SIGTERM of the eviction' if self.preempt.local else ''}"
            f" at step {step}, before any preemption save ({str(e).splitlines()[0][:200]}); a worker_init_fn that "
            "unblocks SIGTERM with its default action undoes baton's (docs/own-trainer.md), and a SIGKILL or the "
            "OOM killer ends workers whatever they do"
        )
        log(f"error: {why}")
        self.emit("failed", step, reason=LOADER_WORKERS_KILLED, error=why, checkpoint=self.last_checkpoint)
        return EXIT_FAIL

    def _late_files(self) -> None:
        """Rank 0: each file written into a committed checkpoint-N after its commit (in no manifest, so a resume
        would never see it: a callback that wrote it outside on_save, or after baton's) gets an `uncommitted_file`
        record, once; the drill's verdict names it. Files HF rotated away are not looked for."""
        if self.rank != 0 or self.ckpt is None:
            return
        for step, files in self.committed_files.items():
            folder = self.ckpt.folder(step)
            try:
                now = {n: os.path.getsize(os.path.join(folder, n)) for n in self.ckpt.local_names(step)}
            except OSError:  # rotated away (HF's save_total_limit), or being removed
                continue
            for name, size in sorted(now.items()):
                if files.get(name) != size and (step, name) not in self.reported_late:
                    self.reported_late.add((step, name))
                    how = "changed" if name in files else "written"
                    log(
                        f"warning: {hf_step_name(step)}/{name} was {how} after the commit: it is in no manifest, so a "
                        "resume does not see it (give that callback's writes to on_save)"
                    )
                    self.emit(UNCOMMITTED_FILE, step, file=name, how=how)

    def _retry_later(self, reason: str, step: int, error: str, every_rank: bool = False) -> int:
        """End retry-safe (75) for a fault a retry can mend, with the `retry_later` record that tells
        steps.train so (torchrun turns a worker's 75 into 1)."""
        self.retry_reason = reason
        log(
            f"error: {error}; exiting {EXIT_PREEMPTED} (retry from {self.last_checkpoint or 'the last commit'})"
        )
        if every_rank or self.node_first:  # rank 0 is its node's first rank
            self.rec.emit(
                "retry_later",
                step,
                reason=reason,
                error=error[:500],
                exit=EXIT_PREEMPTED,
                checkpoint=self.last_checkpoint,
            )
        return EXIT_PREEMPTED

    # -- TrainerCallback hooks --
    def _point(self, step: int, micro: int = 0) -> Point:
        return Point(step, micro, self.rank, self.world, self.preempt, device=self.preempt.device)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._setup(args)
        loader = kwargs.get("train_dataloader")
        if loader is not None:  # the loader the Trainer iterates: HF's, or the script's own
            refuse_private_samplers(loader)
            ignore_sigterm_in_workers(
                loader
            )  # an eviction's SIGTERM reaches the workers too (trainer/data.py)
            why = self.prefetch.follow(loader) if self.prefetch is not None else None
            if why is not None and self.rank == 0:
                log(f"warning: {why}")
        self.preempt.phase = "step"
        if self.fresh and model is not None:  # the exact start (trainer/trajectory.py): before any step
            self.emit(trajectory.START_EVENT, 0, **trajectory.start_digests(model, kwargs.get("optimizer")))
            self.fresh = False
        if model is not None and not self._hooked:
            # Every micro-batch's inputs, and whether the raw loss (before HF's logging_nan_inf_filter
            # replaces a non-finite one) stayed finite: read once a step, in on_log.
            model.register_forward_pre_hook(self.inputs.on_forward, with_kwargs=True)
            model.register_forward_hook(self.inputs.on_output)
            self._hooked = True

    def on_epoch_begin(self, args, state, control, **kwargs):
        if self.epoch_rng is not None:  # before the epoch's iterator draws the sampler's shuffle
            self.epoch_rng.begin(state.epoch or 0.0)
        # A dataset with set_epoch (augmentation or an order per epoch) is told its epoch before the epoch's
        # iterator starts. accelerate 1.16 does it in DataLoaderShard.set_epoch, but only in an `elif` after the
        # batch sampler's: after a mid-epoch resume the loader is skip_first_batches', whose SkipBatchSampler has
        # a sampler with set_epoch, and the dataset keeps epoch 0's.
        dataset = getattr(kwargs.get("train_dataloader"), "dataset", None)
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(int(math.floor((state.epoch or 0.0) + 1e-9)))

    def on_step_begin(self, args, state, control, **kwargs):
        self.micro = 0
        self.rng_at_step_begin = trajectory.rng_digest()  # the state this step starts from

    def on_substep_end(self, args, state, control, **kwargs):
        # A signal here does not stop the step: it completes, then saves (see the module docstring).
        self.micro += 1
        hooks().at_point(self._point(state.global_step, self.micro))

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        # The step's gradients exist (accumulated, clipped): the test seam baton's loop calls after each
        # backward (trainer/hooks.py; the gradient-noise seam of tests/faultfs), here once a step, as micro-batch 0.
        if model is not None:
            hooks().after_backward(model, state.global_step, 0, self.rank)

    def on_step_end(self, args, state, control, **kwargs):
        self.pending_step = state.global_step
        control.should_log = True  # every step gets its loss, and its record, in on_log
        if state.global_step >= state.max_steps:
            control.should_save = True  # the final checkpoint, whatever the save strategy
        if control.should_save:  # HF writes the checkpoint next, then on_save commits it
            self.preempt.phase = "save"
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if self.pending_step != state.global_step or "loss" not in logs:
            return control  # an evaluation's or the summary's logs
        step, self.pending_step = state.global_step, None
        # The step's one collective: every rank logs every step, so every rank is here.
        batch, loss_finite = self.inputs.take()
        batch_rng = self.prefetch.take_batch_rng() if self.prefetch is not None else 0
        rows = collectives.gather_rows(
            [int(self.preempt.local), int(not loss_finite), batch, self.rng_at_step_begin, batch_rng],
            device=self.preempt.device,
        )
        bad = [
            f"{k} {v}"
            for k, v in (
                ("loss", logs["loss"]),
                ("grad_norm", logs.get("grad_norm")),
                ("learning_rate", logs.get("learning_rate")),
            )
            if isinstance(v, (int, float)) and not math.isfinite(v)
        ]
        if any(r[1] for r in rows):
            bad.insert(0, "the raw loss (before logging_nan_inf_filter)")
        if bad:
            self.failed = (
                f"step {step}: {', '.join(bad)} is not finite; stopping without saving it (the last "
                f"committed checkpoint stands)"
            )
            log(f"error: {self.failed}")
            self.emit("failed", step, reason="non_finite", error=self.failed, checkpoint=self.last_checkpoint)
            control.should_save = False
            control.should_training_stop = True
            return control
        self.emit(
            "step",
            step,
            loss=logs["loss"],
            lr=logs.get("learning_rate"),
            grad_norm=logs.get("grad_norm"),
            epoch=state.epoch,
            batch_sha=trajectory.combine(r[2] for r in rows),
            rng_sha=trajectory.combine(r[3] for r in rows),
            # the RNG before the step's batches were collated: only where baton sees the collator
            **(
                {"batch_rng_sha": trajectory.combine(r[4] for r in rows)}
                if self.prefetch is not None and self.prefetch.measured
                else {}
            ),
        )
        stop = any(r[0] for r in rows)
        if hooks().at_point(self._point(step)):
            stop = self.preempt.should_stop()  # a signal came during the test's pause
        elif stop and self.preempt.signal_name is None:
            self.preempt.decided(True)  # another rank was signalled: this one stops as "peer"
        if stop and self.stopping is None:
            self.stopping, self.stop_decided_at = step, time.perf_counter()
            log(
                f"preempted ({self.preempt.signal_name}) at step {step}: saving, "
                f"{self.preempt.grace_left():.1f}s of grace left"
            )
            control.should_save = True
            control.should_training_stop = True
        self.last_hook_at = time.perf_counter()
        return control

    def on_save(self, args, state, control, **kwargs):
        step = state.global_step
        started = self.stop_decided_at if self.stopping == step else self.last_hook_at
        reason = "final" if step >= state.max_steps else ("preempt" if self.stopping == step else "periodic")
        assert self.ckpt is not None
        folder = self.ckpt.folder(step)  # where the Trainer wrote it: output_dir/checkpoint-<step>
        if (
            self.prefetch is not None
        ):  # this rank's RNG before the batch it collated ahead (trainer/hf_rng.py)
            self.prefetch.save(folder)
        if self.epoch_rng is not None:  # and at the epoch's start, which the sampler drew from
            self.epoch_rng.save(folder)
        collectives.barrier()  # HF has none before on_save: every rank's rng_state_<i>.pth is on disk after it
        self._late_files()  # in the checkpoints committed before this one
        other_nodes, node_error = ({}, None) if self.shared_disk else self._upload_other_nodes(step)
        outcome: list[Any] = [None, node_error]  # rank 0's: the committed url, or why the commit failed
        if self.rank == 0 and node_error is None:
            try:
                url, size = self.ckpt.commit(
                    step, self.world, device=args.device.type, other_nodes=other_nodes
                )
            except StorageError as e:  # after the store's own retries: nothing of this step is committed
                outcome = [None, str(e)[:500]]
            else:
                outcome = [url, None]
                self.committed_files[step] = {
                    n: os.path.getsize(os.path.join(folder, n)) for n in self.ckpt.local_names(step)
                }
                save_ms = (time.perf_counter() - started) * 1000
                self.emit(
                    "checkpoint",
                    step,
                    reason=reason,
                    save_ms=round(save_ms, 1),
                    blocking_ms=round(save_ms, 1),
                    asynchronous=False,
                    bytes=size,
                    path=url,
                )
                if reason == "preempt":
                    self._emit_preempt(step, url, started)
        # Every rank learns the outcome, so all go on or stop together; and no rank leaves before rank 0
        # has committed and written its record: a launcher that sees one rank exit signals the others,
        # and the record is what says the stop was clean.
        url, error = collectives.broadcast(outcome)
        if error is None:
            self.ckpt.committed(step, url)
            if reason == "preempt" and self.rank != 0:  # this pod's copy, now that rank 0 has committed
                self._emit_preempt(step, url, started)
            self.ckpt.after_commit(step, reason)  # retention (rank 0), none after a preemption save
        else:
            self._save_failed(step, reason, error, control)
        self.preempt.phase = "step"
        return control

    def _emit_preempt(self, step: int, url: str, started: float) -> None:
        save_ms = round((time.perf_counter() - started) * 1000, 1)
        self.emit(
            "preempt",
            step,
            signal=self.preempt.signal_name,
            save_ms=save_ms,
            grace_left_s=round(self.preempt.grace_left(), 2),
            grace_s=self.preempt.grace,
            exit=EXIT_PREEMPTED,
            checkpoint=url,
            already_committed=False,
            outcome="saved",
            warning=False,
            during=self.preempt.during,
        )

    def _upload_other_nodes(self, step: int) -> tuple[dict[str, Any], str | None]:
        """On nodes that share no disk: each other node's first rank uploads the files of this checkpoint
        that only its node has (rank 0's names are broadcast first). Returns, on every rank, their manifest
        entries and the first upload error (None when all went up)."""
        assert self.ckpt is not None
        names0 = set(collectives.broadcast(self.ckpt.local_names(step) if self.rank == 0 else None))
        mine: list[Any] = [{}, None]
        if self.node_first and self.rank != 0:
            try:
                mine = [
                    self.ckpt.upload(step, [n for n in self.ckpt.local_names(step) if n not in names0]),
                    None,
                ]
            except StorageError as e:  # after the store's own retries: rank 0 will not commit
                mine = [{}, f"rank {self.rank}'s node: {str(e)[:400]}"]
        entries: dict[str, Any] = {}
        errors = []
        for files, error in collectives.gather(mine):
            entries.update(files)
            if error:
                errors.append(error)
        return entries, (errors[0] if errors else None)

    def _save_failed(self, step: int, reason: str, error: str, control) -> None:
        """A commit that failed: a periodic one lets training go on until `faults.max_failed_saves` fail in
        a row (the checkpoints' rule, trainer/checkpoint/interface.py); a failed preemption or final commit
        ends the run. Either end is 75: the last commit stands."""
        assert self.ckpt is not None
        if reason == "periodic":
            try:
                self.ckpt.periodic_save_failed(step, error, self.emit)
                return
            except SavesFailing as e:
                self._retry_later("saves_failing", step, str(e))
        else:
            self._retry_later(
                "store_failing", step, f"the {reason} checkpoint of step {step} failed: {error}"
            )
        control.should_training_stop = True

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.last_committed == state.global_step:
            control.should_save = False  # the step is committed: a second save would rewrite it under _COMMIT
        if self.stopping is not None:
            control.should_evaluate = False
        return control


def _loader_workers_died(e: BaseException) -> bool:
    """Whether `e` is torch's error for a DataLoader whose worker processes died (torch/utils/data)."""
    text = str(e)
    return (
        isinstance(e, RuntimeError)
        and text.startswith("DataLoader worker")
        and ("exited unexpectedly" in text or "killed by signal" in text)
    )


def _one_disk(output_dir: str, rank: int) -> bool:
    """Whether every rank sees the same `output_dir` (one node, or nodes on a shared file system): rank 0
    writes a file of a fresh name into it, and every rank looks for it. Collective."""
    token = collectives.broadcast(uuid.uuid4().hex if rank == 0 else None)
    probe = os.path.join(output_dir, f".baton-disk-{token}")
    if rank == 0:
        os.makedirs(output_dir, exist_ok=True)
        open(probe, "w").close()
    collectives.barrier()
    seen = collectives.gather(os.path.exists(probe))
    if rank == 0:
        os.remove(probe)
    return all(seen)


class StepRecords(TrainerCallback):
    """Only the step and resume records, no preemption handling: what a stock HF Trainer script does,
    made visible to `verify`. The drill's negative control for HF."""

    def __init__(self, run_id: str = "hf", attempts_uri: str | None = None) -> None:
        self.run_id, self.attempts_uri = run_id, attempts_uri
        self.rec: Records | None = None
        self.pending: int | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        rank = collectives.rank()
        attempts = HFCheckpointer(self.attempts_uri or args.output_dir, args.output_dir)
        attempt = attempts.claim_attempt() if rank == 0 else 0
        self.rec = Records(self.run_id, attempt, rank)
        if rank == 0:
            start = state.global_step
            self.rec.emit("resume", start, from_step=start, **({"fresh": True} if start == 0 else {}))

    def on_step_end(self, args, state, control, **kwargs):
        self.pending = state.global_step
        control.should_log = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        # A stock script that finished says so (and exits 0); what it saved carries no _COMMIT.
        if self.rec and self.rec.rank == 0 and state.global_step >= state.max_steps:
            self.rec.emit("done", state.global_step, total_steps=state.max_steps, checkpoint=None)

    def on_save(self, args, state, control, **kwargs):
        # What HF saved, uncommitted (no _COMMIT, nothing waits for every rank): the report counts the steps
        # a SIGTERM then loses.
        if self.rec and self.rec.rank == 0:
            self.rec.emit(
                "checkpoint",
                state.global_step,
                reason="periodic",
                committed=False,
                path=os.path.join(args.output_dir, hf_step_name(state.global_step)),
            )

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.rec and self.rec.rank == 0 and self.pending == state.global_step and "loss" in (logs or {}):
            self.pending = None
            self.rec.emit(
                "step", state.global_step, loss=logs["loss"], lr=logs.get("learning_rate"), epoch=state.epoch
            )
        return control
