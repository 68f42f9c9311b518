"""The training loop: resume, step, checkpoint, stop on preemption.

Order inside one optimizer step, and why:
- before every micro-batch, the collective stop check: a preemption abandons the partial step (its
  gradients are never saved) and saves the state of the last step boundary, captured beforehand;
- checkpoints are taken only at step boundaries, after `step()` and `zero_grad()`.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from trainer import collector, env, faults, rng, trajectory
from trainer.cadence import Attempt, Cadence
from trainer.checkpoint import Boundary, Checkpointer, FencedOut, Parts, RestorePolicy, SaveResult
from trainer.config import Config
from trainer.data import EpochData, read_corpus
from trainer.exits import EXIT_FAIL, EXIT_OK, EXIT_PREEMPTED
from trainer.hooks import Point, hooks
from trainer.model import (
    build_empty_model,
    compile_layers,
    ensure_model,
    import_model_class,
    load_model,
    shard,
)
from trainer.notice import NoticeThread, NoticeWatcher
from trainer.packed import PackedCorpus, packed_samples
from trainer.preemption import Preemption
from trainer.records import POD_EVENTS, Records, log
from trainer.storage import StorageError


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine to `min_ratio` at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def restore_policy() -> RestorePolicy:
    """The negative controls, read once at the start: `BATON_SKIP_RESTORE=rng,data,...` and
    `BATON_SWAP_RANK_STATE`. Never set them for real work."""
    raw = env.text("BATON_SKIP_RESTORE")
    try:
        return RestorePolicy(
            frozenset(s.strip() for s in raw.split(",") if s.strip()), env.flag("BATON_SWAP_RANK_STATE")
        )
    except ValueError as e:
        raise env.EnvError(f"BATON_SKIP_RESTORE: {e}") from None


def init_distributed(timeout: timedelta | None = None) -> tuple[int, int, torch.device]:
    """The process group; `timeout` bounds every collective (faults.collective_timeout_s): a dead or
    hung peer raises instead of holding the others for gloo's default 30 minutes."""
    cuda = torch.cuda.is_available()
    kw = {} if timeout is None else {"timeout": timeout}
    if timeout is not None:
        faults.set_collective_timeout(timeout)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if cuda:
            torch.cuda.set_device(local)
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", **kw)
        device = torch.device("cuda", local) if cuda else torch.device("cpu")
    else:
        if cuda:
            torch.cuda.set_device(0)
        dist.init_process_group(
            "cpu:gloo,cuda:nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1, **kw
        )
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


def deterministic_algorithms(compiled: bool) -> None:
    """torch.use_deterministic_algorithms(True). Without torch.compile, its C flag alone: the Python call
    imports torch._inductor only to set inductor's own flag (torch 2.13, torch/__init__.py), 1-2 s of
    every start here."""
    if compiled:
        torch.use_deterministic_algorithms(True)
    else:
        torch._C._set_deterministic_algorithms(True, warn_only=False)


# The start's phases that every rank reports in the `resume` record's `rank_phases` (at world size > 1): the
# restart is as slow as its slowest rank, which rank 0's own `phases` cannot show.
RANK_PHASES = (
    "startup_s",
    "init_s",
    "listing_s",
    "build_s",
    "build_model_s",
    "manifest_s",
    "load_verify_s",
    "restore_s",
)


class Trainer:
    def __init__(self, cfg: Config, preempt: Preemption) -> None:
        self.times: dict[str, float] = {"startup_s": round(time.time() - process_start(), 3)}
        t = time.perf_counter()
        self.cfg, self.preempt = cfg, preempt
        policy = restore_policy()
        self.rank, self.world, self.device = init_distributed(cfg.faults.collective_timeout())
        # The first rank of each node speaks for its pod (records.POD_EVENTS); torchrun sets LOCAL_RANK.
        self.node_first = int(os.environ.get("LOCAL_RANK", "0")) == 0
        mark = self._phase("init_group_s", t)
        self.preempt.device = torch.device("cpu")  # gloo carries the flag; under NCCL the cpu:gloo half does
        if cfg.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            deterministic_algorithms(compiled=cfg.model.compile)
        self.ckpt = Checkpointer(
            cfg.checkpoint,
            cfg.run_id,
            cfg.fingerprint,
            self.emit,
            self._manifest,
            self._committed,
            policy,
            cfg.faults.max_failed_saves,
            self._saving,
        )
        self._phase("init_store_s", mark)
        # The attempt claimed, the committed steps listed, and the newest being read on a thread (prefetch.py)
        # while the model is built: the restore has begun, and a signal from here on lands in it.
        opened = self.ckpt.begin(
            {"host": os.uname().nodename, "pid": os.getpid(), "world_size": self.world},
            self.times,
            history=cfg.cadence.mode == "auto",
        )
        self.attempt, self.opened = opened.attempt, opened
        if opened.prefetching:
            self.preempt.phase = "restore"
        self.last_committed: int | None = None  # the checkpoints' own: set by the resume and by every commit
        self.last_checkpoint: str | None = None
        self.rec = Records(cfg.run_id, self.attempt, self.rank)
        self.first_step_pending = True
        self.times["init_s"] = round(
            time.perf_counter() - t - self.times["listing_s"], 3
        )  # listing_s is its own phase

    def _phase(self, name: str, since: float) -> float:
        """Time a part of the start into the `resume` record's phases; returns now, the next part's start."""
        now = time.perf_counter()
        self.times[name] = round(now - since, 3)
        return now

    # -- records (rank 0 speaks for the job; each node's first rank also for its pod) --
    def emit(self, event: str, step: int, **fields: Any) -> None:
        if self.rank == 0 or (self.node_first and event in POD_EVENTS):
            self.rec.emit(event, step, **fields)

    def emit_after_rank0(self, event: str, step: int, **fields: Any) -> None:
        """A record that says a commit happened (`preempt`, `done`): rank 0, which committed, writes it
        first; the other nodes write their copies only after a barrier that follows it."""
        if self.rank == 0:
            self.rec.emit(event, step, **fields)
        dist.barrier()
        if self.rank != 0:
            self.emit(event, step, **fields)

    # -- setup --
    def build(self) -> None:
        t = time.perf_counter()
        cfg = self.cfg
        # Rank 0 first (it may build or copy the model), then the others, who find it made.
        weights = ensure_model(cfg) if self.rank == 0 else None
        dist.barrier()
        weights = weights or ensure_model(cfg)
        path = self.model_path = weights.path
        self.emit("weights", 0, **weights.record())
        mark = self._phase("build_weights_s", t)
        rng.seed_everything(cfg.seed, self.rank)
        raw = read_corpus(cfg.data.uri)
        mark = self._phase("build_read_corpus_s", mark)
        cache = PackedCorpus(cfg.checkpoint.uri, cfg.run_id) if cfg.data.pack_cache else None
        samples, self.packing = packed_samples(
            raw, cfg.data.uri, cfg.data.text_field, cfg.data.seq_len, path, cache, write=self.rank == 0
        )
        self.data = EpochData(cfg.data, samples, cfg.seed, self.rank, self.world)
        mark = self._phase("build_corpus_s", mark)
        # With a committed checkpoint to resume from, every parameter is about to be overwritten: build
        # the structure without reading the pretrained weights. Should every checkpoint be refused,
        # resume() reads them after all (pretrained_fallback).
        self.empty_model = bool(self.opened.committed)
        # The last of the start's imports, then the collector back on with what the start made frozen,
        # before the build allocates the model (trainer/collector.py).
        import_model_class(path)
        self.times["collector_frozen"] = collector.settle()
        build_model = build_empty_model if self.empty_model else load_model
        model = build_model(cfg, path, self.device)
        # Seeded again after the model is built, so how it was built cannot move the RNG stream.
        rng.seed_everything(cfg.seed, self.rank)
        mesh = init_device_mesh(self.device.type, (self.world,)) if self.world > 1 else None
        self.model = shard(model, mesh)
        if cfg.model.compile:
            compile_layers(self.model)
        self.model.train()
        mark = self._phase("build_model_s", mark)
        o = cfg.optim
        self.optim = torch.optim.AdamW(
            self.model.parameters(),
            lr=o.lr,
            betas=tuple(o.betas),
            eps=o.eps,
            weight_decay=o.weight_decay,
            foreach=False,
        )
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.optim, lambda s: lr_factor(s, o.warmup_steps, cfg.total_steps, o.min_lr_ratio)
        )
        self.step = 0
        self.parts = Parts(
            self.model,
            self.optim,
            self.sched,
            self.data,
            self.rank,
            self.world,
            cfg.seed,
            cfg.data.batch_size,
            cfg.data.num_workers,
        )
        self._phase("build_optimizer_s", mark)
        self.metrics: dict[str, float] = {}
        self.notice: NoticeThread | None = None
        if cfg.notice.enabled and self.rank == 0:  # one watcher; the flag is OR-reduced over the ranks
            self.watcher = NoticeWatcher.from_config(cfg.notice, lead_s=cfg.notice.poll_s)
            self.notice = NoticeThread(self.watcher, cfg.notice.poll_s).start()
        self.cadence = Cadence(cfg.cadence)
        self.last_save_at = time.time()
        self.warned = False
        log(
            f"run {cfg.run_id} attempt {self.attempt}: rank {self.rank}/{self.world} on {self.device}, "
            f"{self.data.geo.n_samples} samples, {self.data.geo.steps_in_epoch()} steps/epoch, "
            f"{sum(p.numel() for p in self.model.parameters())} parameters (this rank's shards)"
            + (", built empty for the resume" if self.empty_model else "")
        )
        self.times["build_s"] = round(time.perf_counter() - t, 3)

    # -- the checkpoint --
    def boundary(self) -> Boundary:
        return self.parts.capture(self.step)

    def resume(self) -> None:
        committed = self.opened.committed
        if committed:  # what it is about to load: lets a watcher (the drill's chaos) act mid-restore
            self.emit("restore", committed[0], committed=len(committed), path=self.opened.newest_url)
        resumed = self.ckpt.resume(self.parts, self.cfg.faults.read_retry_s, self.times)
        t = time.perf_counter()
        if resumed is None:
            if self.empty_model:
                self._pretrained_fallback()
            self.times["restore_s"] = round(time.perf_counter() - t, 3)
            self.emit(
                "resume",
                0,
                from_step=0,
                fresh=True,
                phases=self.times,
                corpus=self.packing,
                **self._rank_phases(),
            )
            # The exact start: what the drill compares between two fresh starts (trainer/trajectory.py).
            self.emit(trajectory.START_EVENT, 0, **trajectory.start_digests(self.model, self.optim))
            log("no committed checkpoint: starting fresh")
            return
        step, manifest = resumed.step, resumed.manifest
        self.step = self.last_committed = step
        self.last_checkpoint = resumed.url
        if not resumed.same_world:
            log(
                f"resharded resume: saved by {manifest['world_size']} ranks, running on {self.world}; "
                "model and optimizer load exactly, the continuation is not bitwise (reduction order)"
            )
        self.times["restore_s"] = round(time.perf_counter() - t, 3)
        self.emit(
            "resume",
            step,
            from_step=step,
            checkpoint=self.last_checkpoint,
            saved_world_size=manifest.get("world_size"),
            phases=self.times,
            corpus=self.packing,
            **self._rank_phases(),
        )
        log(f"resumed from step {step} ({self.last_checkpoint})")

    def _rank_phases(self) -> dict[str, Any]:
        """`rank_phases` for the `resume` record: each rank's RANK_PHASES, gathered in one collective of floats
        (nothing is pickled between ranks); a phase a rank did not time is left out of its entry. Every rank
        calls it; empty on one rank."""
        if self.world == 1:
            return {}
        mine = torch.tensor([float(self.times.get(k, -1.0)) for k in RANK_PHASES], dtype=torch.float64)
        every = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(every, mine)
        return {
            "rank_phases": [
                {k: round(v, 3) for k, v in zip(RANK_PHASES, t.tolist(), strict=True) if v >= 0}
                for t in every
            ]
        }

    def _pretrained_fallback(self) -> None:
        """Every checkpoint was refused after the model was built empty: read the pretrained weights
        now, as a fresh start would have, drop the optimizer state and re-seed (the stream a fresh
        start begins with)."""
        log("every checkpoint was refused: reading the pretrained weights")
        pretrained = load_model(self.cfg, self.model_path, self.device)
        set_model_state_dict(
            self.model, pretrained.state_dict(), options=StateDictOptions(full_state_dict=True)
        )
        del pretrained
        # Building a load template initialised the optimizer's state (one zero-gradient step): a fresh
        # start has none.
        self.optim.state.clear()
        rng.seed_everything(self.cfg.seed, self.rank)
        self.empty_model = False

    @contextmanager
    def _saving(self) -> Iterator[None]:
        """Around every save the checkpointer makes: its phase for a signal's record, and the next stop check
        asks the ranks again (a save takes a while)."""
        before, self.preempt.phase = self.preempt.phase, "save"
        self.preempt.invalidate()
        try:
            yield
        finally:
            self.preempt.phase = before

    def _manifest(self, b: Boundary) -> dict[str, Any]:
        """The trainer's fields of a save's manifest; the metrics of this step (the step record's loss), for
        keep-best retention."""
        return {
            "run_id": self.cfg.run_id,
            "epoch": b.epoch,
            "device": self.device.type,
            "config": self.cfg.to_dict(),
            "time": time.time(),
            "metrics": dict(self.metrics),
        }

    def _committed(self, res: SaveResult, reason: str) -> None:
        """A checkpoint is committed (every rank): the last committed step, the cadence, and its record."""
        self.last_committed, self.last_checkpoint = res.step, res.path
        self._after_save(res.blocking_ms if res.asynchronous else res.save_ms)
        self.emit(
            "checkpoint",
            res.step,
            reason=reason,
            save_ms=round(res.save_ms, 1),
            blocking_ms=round(res.blocking_ms, 1),
            bytes=res.bytes,
            path=res.path,
            asynchronous=res.asynchronous,
        )

    # -- the stop --
    def stop(self, b: Boundary) -> int:
        signal_name = self.preempt.signal_name
        log(f"preempted ({signal_name}) at step {b.step}, {self.preempt.grace_left():.1f}s of grace left")
        saved = self.ckpt.save(
            b, "preempt"
        )  # a save in flight commits first; a committed step is not saved again
        outcome = saved.outcome
        # No rank leaves before rank 0 has written the record: a launcher that sees one rank exit
        # signals the others, and the record is what says the stop was clean.
        self.emit_after_rank0(
            "preempt",
            b.step,
            signal=signal_name,
            save_ms=round(saved.blocking_ms, 1),
            grace_left_s=round(self.preempt.grace_left(), 2),
            grace_s=self.preempt.grace,
            exit=EXIT_PREEMPTED,
            checkpoint=self.last_checkpoint,
            already_committed=outcome == "already_committed",
            outcome=outcome,
            warning=self.warned,
            during=self.preempt.during,
        )
        return EXIT_PREEMPTED

    def _boundary_flags(
        self, loss_sum: torch.Tensor, grad_norm: torch.Tensor | None, batch: int, rng_state: int
    ) -> tuple[float, float | None, bool, bool, str, str]:
        """One host sync a step, and one collective at world > 1, which every rank's numbers travel in:
        the loss, the gradient norm (when clipping computed one), the preemption warning, the wall-clock
        cadence, the stop flag, and the digests of the step's inputs and starting RNG state. Each rank
        fills its own row of a SUM all-reduce (an all-gather in rank order, exact for floats as their
        bits). Returns (mean loss, global grad norm, any warning, cadence due, batch_sha, rng_sha); the
        stop flag answers the next micro-batch's stop check unless something slow happens first."""
        pending = bool(self.notice and self.notice.pending())
        due = self.rank == 0 and self.cadence.due(time.time(), self.last_save_at)
        # Under FSDP2 the norm is a DTensor whose local value is this rank's shards' norm: the ranks'
        # squares add up to the global norm's square (and a NaN or inf anywhere stays one).
        local_norm = grad_norm.to_local() if isinstance(grad_norm, DTensor) else grad_norm
        parts = [loss_sum] if local_norm is None else [loss_sum, local_norm.double().square()]
        values = torch.stack(parts).tolist()  # the host sync
        mine = [
            trajectory.f64_bits(values[0]),
            trajectory.f64_bits(values[1] if len(values) > 1 else 0.0),
            int(pending),
            int(due),
            int(self.preempt.local),
            batch,
            rng_state,
        ]
        if self.world == 1:
            rows = [mine]
        else:
            table = torch.zeros((self.world, len(mine)), dtype=torch.int64)
            table[self.rank] = torch.tensor(mine, dtype=torch.int64)
            dist.all_reduce(table, op=dist.ReduceOp.SUM)
            rows = table.tolist()
            self.preempt.decided(any(r[4] for r in rows) or hooks().stops_alone(self.rank, self.step))
        loss = sum(trajectory.bits_f64(r[0]) for r in rows) / self.world
        norm = None if local_norm is None else math.sqrt(sum(trajectory.bits_f64(r[1]) for r in rows))
        return (
            loss,
            norm,
            any(r[2] for r in rows),
            any(r[3] for r in rows),
            trajectory.combine(r[5] for r in rows),
            trajectory.combine(r[6] for r in rows),
        )

    def _on_boundary(self, pending: bool, due: bool) -> int | None:
        """Warnings and the wall-clock cadence, decided together for all ranks at a step boundary
        (`_boundary_flags`). Returns an exit code when a warning under policy `stop` ends the run."""
        if pending:
            notice = self.notice.take() if self.notice else None
            reason = notice.reason if notice else "peer"
            self.warned = True
            log(f"preemption warning ({reason}{': ' + notice.source if notice else ''}) at step {self.step}")
            self.ckpt.save(self.step, "warning")  # unless this step is committed already
            if self.cfg.notice.policy == "stop":
                self.preempt.signal_name = f"warning:{reason}"
                self.preempt.received_at = time.monotonic()
                return self.stop(self.boundary())
        elif due:  # a periodic save, which may fail without ending the run (the checkpoints' rule)
            self.ckpt.save(self.step, "periodic", due=True)
        return None

    def _after_save(self, save_ms: float) -> None:
        """Feed the measured cost to the cadence and to the warning lead time."""
        self.last_save_at = time.time()
        if self.notice:
            self.watcher.lead_s = self.cfg.notice.poll_s + 2 * save_ms / 1000 + 5
        history = self._attempt_history() if self.cfg.cadence.mode == "auto" else None
        change = self.cadence.update(save_cost_s=save_ms / 1000, history=history)
        if change and change.interval_s is not None and self.rank == 0:
            log(
                f"checkpoint cadence ({change.mode}): every {change.interval_s:.0f} s "
                f"(save cost {change.save_cost_s}, MTBF {change.mtbf_s})"
            )

    def _attempt_history(self) -> list[Attempt]:
        """Approximate: every attempt before this one is taken to have ended by preemption."""
        if getattr(self, "_history", None) is None:
            starts = self.opened.start_times or []
            self._history = [Attempt(a, True, b - a) for a, b in zip(starts, starts[1:], strict=False)]
            self._history_started = starts[-1] if starts else time.time()
        return [*self._history, Attempt(self._history_started, False, time.time() - self._history_started)]

    def _at_point(self, micro: int = 0) -> None:
        """A step boundary (micro 0) or a micro-batch boundary: where a test's hooks may act (trainer/hooks.py)."""
        hooks().at_point(
            Point(
                self.step,
                micro,
                self.rank,
                self.world,
                self.preempt,
                lambda: bool(self.notice and self.notice.pending()),
            )
        )

    # -- the loop --
    def run(self) -> int:
        cfg, data = self.cfg, self.data
        accum = cfg.data.grad_accum
        tokens_per_step = cfg.data.batch_size * cfg.data.seq_len * accum * self.world
        self._at_point()
        while self.step < cfg.total_steps:
            b = self.boundary()
            t0 = time.perf_counter()
            loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)  # one host sync a step
            batches = []
            for m in range(accum):
                if m:
                    self._at_point(micro=m)
                if self.preempt.should_stop():
                    self.optim.zero_grad(set_to_none=True)
                    return self.stop(b)
                cpu_batch = data.next_batch()
                batches.append(cpu_batch)  # hashed on the host copy: no device-to-host sync
                batch = cpu_batch.to(self.device)
                if self.world > 1:  # FSDP2's; at world size 1 the model is not wrapped
                    self.model.set_requires_gradient_sync(m == accum - 1)
                loss = self.model(input_ids=batch, labels=batch).loss / accum
                loss.backward()
                hooks().after_backward(self.model, self.step, m, self.rank)
                loss_sum += loss.detach().double()
            self.ckpt.wait_for_staging()  # an async save's staging copy must be done before the update
            grad_norm = None
            if cfg.optim.grad_clip > 0:
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip)
            lr = self.optim.param_groups[0]["lr"]
            self.optim.step()
            self.sched.step()
            self.optim.zero_grad(set_to_none=True)
            self.step += 1
            hooks().after_update(self.rank, self.step)
            loss_value, norm, warning, due, batch_sha, rng_sha = self._boundary_flags(
                loss_sum, grad_norm, trajectory.batch_digest(batches), trajectory.rng_digest(b.rng)
            )
            _require_finite(self.step, loss=loss_value, grad_norm=norm, lr=lr)  # the same on every rank
            self.metrics = {"loss": loss_value}  # what keep-best retention ranks checkpoints by
            if data.epoch_done:
                data.next_epoch()
            dt = time.perf_counter() - t0
            since = {}
            if self.first_step_pending:  # the restart's last phase: process start to its first step done
                since, self.first_step_pending = (
                    {"since_process_start_s": round(time.time() - process_start(), 3)},
                    False,
                )
            self.emit(
                "step",
                self.step,
                loss=loss_value,
                lr=lr,
                tokens_per_s=round(tokens_per_step / dt, 1),
                # the data loader draws from no global RNG: the RNG before the batch is the step's own
                epoch=b.epoch,
                batch_sha=batch_sha,
                rng_sha=rng_sha,
                batch_rng_sha=rng_sha,
                **since,
            )
            if self.rank == 0 and (self.step % cfg.log_every == 0 or self.step == cfg.total_steps):
                log(f"step {self.step}/{cfg.total_steps} loss {loss_value:.4f} lr {lr:.2e} epoch {b.epoch}")
            if self.step == cfg.total_steps:
                break
            # The save in flight commits once every rank's upload is done; checkpoint.every_steps decides a new one.
            if self.ckpt.save(self.step, "periodic").busy:
                self.preempt.invalidate()  # waiting for staging or committing takes a while
            if (code := self._on_boundary(warning, due)) is not None:
                return code
            self._at_point()
        self.ckpt.save(self.step, "final")  # unless the last step is committed already
        self.emit_after_rank0("done", self.step, total_steps=cfg.total_steps, checkpoint=self.last_checkpoint)
        log(f"done: {cfg.total_steps} steps, final checkpoint {self.last_checkpoint}")
        return EXIT_OK


class NonFinite(RuntimeError):
    """A loss, gradient norm or learning rate that is NaN or infinite: the run is garbage from here on.
    It ends with 1 (a retry would compute the same) and nothing of this step is saved."""


def _require_finite(step: int, **values: float | None) -> None:
    bad = [
        f"{name} {value}" for name, value in values.items() if value is not None and not math.isfinite(value)
    ]
    if bad:
        raise NonFinite(
            f"step {step}: {', '.join(bad)} is not finite; stopping without saving it "
            "(the last committed checkpoint stands); check optim.lr, the data and the model"
        )


def process_start() -> float:
    """When this process started (unix seconds), from /proc; now where /proc is absent."""
    try:
        ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        btime = next(int(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime"))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def train(cfg: Config, preempt: Preemption) -> int:
    trainer = Trainer(cfg, preempt)
    try:
        trainer.build()
        preempt.phase = "restore"
        trainer.resume()
        preempt.phase = "step"
        try:
            return trainer.run()
        except StorageError as e:
            # A store that worked at the start (listing, attempt claim, resume) and fails now, after the
            # store's own retries, in a final or preemption save: nothing of that save is committed, the
            # last commit stands, and a retry resumes from it. A bad bucket or credentials fail at the start.
            raise faults.StoreFailing(str(e)) from None
    except (FencedOut, NonFinite) as e:
        log(f"error: {e}")
        if isinstance(e, NonFinite):
            trainer.emit(
                "failed",
                getattr(trainer, "step", 0),
                reason="non_finite",
                error=str(e),
                checkpoint=trainer.last_checkpoint,
            )
        return EXIT_FAIL
    except (faults.SavesFailing, faults.StoreUnreachable, faults.StoreFailing) as e:
        # Retry-safe: the last commit stands and a retry resumes from it (the store may be back by then).
        log(f"error: {e}; exiting {EXIT_PREEMPTED} (retry)")
        reason = {faults.SavesFailing: "saves_failing", faults.StoreUnreachable: "store_unreachable"}.get(
            type(e), "store_failing"
        )
        trainer.emit(
            "retry_later",
            getattr(trainer, "step", 0),
            reason=reason,
            error=str(e)[:500],
            exit=EXIT_PREEMPTED,
            checkpoint=trainer.last_checkpoint,
        )
        return EXIT_PREEMPTED
    except Exception as e:
        if getattr(trainer, "world", 1) < 2 or not faults.is_peer_failure(e):
            raise
        # A dead or hung peer (faults.collective_timeout_s bounds the wait): retry-safe, since every commit
        # is collective and all-or-nothing. Any rank may be the survivor, so each writes its own record.
        log(
            f"error: a peer rank is gone ({type(e).__name__}: {str(e).splitlines()[0][:300]}); exiting "
            f"{EXIT_PREEMPTED} (retry from step {trainer.last_committed})"
        )
        trainer.rec.emit(
            "retry_later",
            getattr(trainer, "step", 0),
            reason="peer_lost",
            error=str(e).splitlines()[0][:300],
            exit=EXIT_PREEMPTED,
            checkpoint=trainer.last_checkpoint,
        )
        return EXIT_PREEMPTED
    finally:
        if getattr(trainer, "notice", None):
            trainer.notice.stop()
        if dist.is_initialized():
            dist.destroy_process_group()
