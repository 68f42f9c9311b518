"""PID 1 of a training container: launches the ranks, forwards SIGTERM, reports 0 / 75 / 1.

    python -m steps.train --nproc N --config FILE [--set KEY=VALUE ...] [--evidence URI] [--launcher L]
    python -m steps.train --nproc N --trainer hf --config FILE [--set ...]         the HF Trainer example
    python -m steps.train --nproc N --trainer "my_train.py --lr 3e-4" [--config FILE] [--set ...]
    python -m steps.train --nnodes N --node-rank I --master-addr HOST [--master-port P] --nproc R ...

`--trainer` picks the program torchrun runs on each rank: `baton` (default, `-m trainer`), `hf`
(examples/hf_trainer/train.py), or any script or `-m module` with its arguments, split like a shell
would (shlex) but never run through one. `--config` and each `--set` are appended to its arguments.

torchrun collapses a worker's exit 75 into 1, so this wrapper decides the code itself from the
records that pass through it: a `preempt` record (rank 0 writes it only after the checkpoint
committed) or a `retry_later` record (trainer/faults.py) means 75, a `done` record with torchrun's 0 means 0, anything else 1, with two cases of a
pod deleted at its edges: a SIGTERM that came before this attempt reported any step (while it started,
imported or restored, maybe before a worker's handler existed) is 75, because the attempt trained nothing
that a retry would replay and a commit is all or nothing; a SIGTERM after the `done` record (written
after the final commit) is 0, whatever torchrun returns after it.
`--evidence URI` (or BATON_EVIDENCE_URI) also copies every record line to
`URI/<name>.jsonl` as it happens, so the evidence outlives the pod.

`--launcher`: `torchrun`, or `direct` (one rank only: the program is this process's child, with the
environment torchrun would give rank 0 of 1: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID). `auto` (default): direct for one rank, else torchrun.
torchrun's own start and teardown cost 3.3 s of a one-rank restart here (docs/results.md, figure 3); with
one rank it adds nothing the contract needs: this wrapper already forwards SIGTERM, and SIGKILLs the
child `--shutdown-timeout` seconds after it, as torchrun does.

Several nodes (`--nnodes N`, one pod each): every pod runs this wrapper with its own `--node-rank`, and
torchrun always launches, even at one rank per pod. The rendezvous is torchrun's static one
(`--rdzv-backend=static`): node I's ranks are I*R .. I*R+R-1 on every start, whichever pod comes up
first, so a retried pod takes back its own ranks' saved state (RNG, data position). torchrun's c10d
rendezvous would order the nodes by arrival instead. HOST is node 0's address, where node 0's torchrun
hosts the store; every pod waits for the others there. Each node's first rank writes the records this
wrapper decides from (`step`, `preempt`, `retry_later`, `done`; trainer/loop.py), so every pod of the group
exits 0, 75 or 1 by the same rule; readers of the evidence count each event once (steps/lib/evidence.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steps.lib.contract import BOUNDS
from trainer import env as baton_env
from trainer.bounded import ArgParser, Bound, flag_type
from trainer.exits import EXIT_FAIL, EXIT_OK, EXIT_PREEMPTED


class Evidence:
    """Record lines copied to an fsspec location: appended locally, rewritten (throttled) on object stores."""

    def __init__(self, uri: str | None, name: str) -> None:
        self.lines: list[str] = []
        self.path = None
        self.last_flush = 0.0
        # add and flush hold it; a flush at SIGTERM runs on a thread of its own (flush_in_background)
        self._lock = threading.Lock()
        # Set at SIGTERM: from then on every line is copied as it comes (the few records a stopping trainer
        # writes are the ones a kill at the grace would otherwise take with it).
        self.signalled = False
        # On an object store each flush rewrites the whole file: throttled (BATON_EVIDENCE_FLUSH_S,
        # default 2 s). What the drill's evict step sees of the trial lags by about this much.
        self.flush_every_s = baton_env.number("BATON_EVIDENCE_FLUSH_S")
        if not uri:
            return
        from trainer.storage import is_local, url_to_fs

        self.fs, base = url_to_fs(uri)
        self.local = is_local(self.fs)
        if self.local:
            self.fs.makedirs(base, exist_ok=True)
        self.path = f"{base.rstrip('/')}/{name}.jsonl"

    def add(self, line: str) -> None:
        if self.path is None:
            return
        with self._lock:
            self.lines.append(line)
            if self.local:
                with open(self.path, "a") as f:
                    f.write(line + "\n")
                    f.flush()
                    os.fsync(f.fileno())
            elif self.signalled or time.monotonic() - self.last_flush > self.flush_every_s:
                self._write()

    def flush(self) -> None:
        with self._lock:
            self._write()

    def _write(self) -> None:
        if self.path is None or self.local:
            return
        with self.fs.open(self.path, "w") as f:
            f.write("".join(line + "\n" for line in self.lines))
        self.last_flush = time.monotonic()

    def flush_in_background(self) -> None:
        """At SIGTERM: copy every line so far now, on a thread of its own (the signal handler may have
        interrupted add or flush, which hold the lock). A pod SIGKILLed at its grace loses only what its
        trainer wrote after the signal; without this, the throttle's last 2 s of step records were lost with
        it, and the drill placed the kill and counted the replayed steps from a stale copy. Every line added
        after this is copied at once."""
        self.signalled = True
        if self.path is None or self.local:
            return

        def run() -> None:
            try:
                self.flush()
            except Exception as e:  # noqa: BLE001 - evidence is a copy
                print(f"[steps.train] could not write the evidence at SIGTERM: {e}", file=sys.stderr)

        threading.Thread(target=run, name="evidence-at-sigterm", daemon=True).start()


def grace() -> float:
    from trainer.grace import grace_seconds  # torch-free: one rank starts ~1 s sooner

    return grace_seconds()


# torchrun's wait between its SIGTERM to the workers and SIGKILL where it has no --shutdown-timeout
# (before torch 2.13: PContext.close's default).
TORCHRUN_FIXED_SHUTDOWN_S = 30
# After the done record: a trainer's teardown (destroying the process group, closing the store) takes seconds;
# torchrun's exit barrier can hold a finished pod 300 s (end_after_done).
DONE_LINGER_S = 60.0


MMAP_THRESHOLD = 1 << 20


def torchrun_has_shutdown_timeout() -> bool:
    """Whether this torch's torchrun takes --shutdown-timeout (torch 2.13 added it), from the installed
    package's version: importing torch.distributed.run to read its parser cost this light PID 1 a whole torch
    import (about 2 s of CPU) at every start of several ranks, before torchrun imports torch again."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(x) for x in version("torch").split(".")[:2])
    except (PackageNotFoundError, ValueError):  # a source build with an odd version: ask the parser itself
        from torch.distributed.run import get_args_parser

        return any("--shutdown-timeout" in a.option_strings for a in get_args_parser()._actions)
    return (major, minor) >= (2, 13)


def program(trainer: str) -> list[str]:
    """What torchrun runs on each rank, for `--trainer`."""
    import shlex

    if trainer == "baton":
        return ["-m", "trainer"]
    if trainer == "hf":
        here = Path(__file__).resolve().parents[1] / HF_EXAMPLE
        script = here if here.is_file() else Path.cwd() / HF_EXAMPLE  # an installed package has no examples/
        if not script.is_file():
            raise SystemExit(
                f"error: --trainer hf: {HF_EXAMPLE} is not here (looked beside steps/ and in {Path.cwd()})"
            )
        return [str(script)]
    try:
        argv = shlex.split(trainer)
    except ValueError as e:
        raise SystemExit(f"error: --trainer {trainer!r}: {e}") from None
    if argv and Path(argv[0]).name in PYTHONS:  # 'python my_train.py': the launcher is Python already
        argv = argv[1:]
    if not argv:
        raise SystemExit("error: --trainer is empty: baton, hf, or a script with its arguments")
    return argv


HF_EXAMPLE = "examples/hf_trainer/train.py"
PYTHONS = ("python", "python3", Path(sys.executable).name)


def torchrun(nproc: int, shutdown: list[str], nodes: Nodes | None = None) -> list[str]:
    """torchrun's command line: standalone on one node; a static rendezvous at node 0 on several."""
    where = ["--standalone"] if nodes is None else nodes.torchrun_args()
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *where,
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        *shutdown,
    ]


@dataclass(frozen=True)
class Nodes:
    """Where this pod sits in a job of several: torchrun's static rendezvous."""

    count: int
    """How many pods (nodes) the job has; each runs this wrapper with the same --nproc."""
    rank: int
    """This pod's place, 0 .. count-1; node 0 hosts the rendezvous store."""
    addr: str
    """Node 0's address (on a cluster, a stable name that follows node 0's pod across retries)."""
    port: int
    """The store's port on node 0."""
    round_id: str = "none"
    """torchrun's --rdzv-id: the round (steps/lib/group.py), so that one round's agents never share keys with
    another's."""
    timeout_s: float = 600.0
    """How long torchrun's static rendezvous waits for the other nodes (its `timeout`; --rendezvous-timeout):
    a round whose store never answers ends after this, never hangs the pod."""

    def torchrun_args(self) -> list[str]:
        return [
            f"--nnodes={self.count}",
            f"--node-rank={self.rank}",
            "--rdzv-backend=static",
            f"--rdzv-id={self.round_id}",
            f"--rdzv-conf=timeout={max(1, int(self.timeout_s))}",
            f"--master-addr={self.addr}",
            f"--master-port={self.port}",
        ]


def rank0_of_1_env() -> dict[str, str]:
    """What torchrun --standalone gives rank 0 of 1 (a free loopback port for the rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "0",
        "ROLE_RANK": "0",
        "ROLE_WORLD_SIZE": "1",
        "GROUP_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RUN_ID": uuid.uuid4().hex,
    }


def kill_after(child: subprocess.Popen, seconds: float) -> None:
    """SIGKILL `child` if it still runs `seconds` from now: torchrun's --shutdown-timeout, for a direct launch."""

    def kill() -> None:
        if child.poll() is None:
            print(f"[steps.train] the rank outlived its {seconds:g} s of grace: SIGKILL", file=sys.stderr)
            child.kill()

    t = threading.Timer(seconds, kill)
    t.daemon = True
    t.start()


def end_after_done(child: subprocess.Popen, seconds: float, grace: float) -> None:
    """After the `done` record, give the launcher `seconds` to exit, then SIGTERM it (and SIGKILL it `grace`
    later). Everything is committed by then; what can still hold a pod is torchrun's exit barrier, which waits
    300 s (torch 2.13, not settable from its command line) for a node whose agent failed, as one did when its
    trainer aborted while shutting down (the suite, nodes=2)."""

    def end() -> None:
        if child.poll() is None:
            print(
                f"[steps.train] the launcher still runs {seconds:g} s after the done record: SIGTERM",
                file=sys.stderr,
            )
            child.terminate()
            kill_after(child, grace)

    t = threading.Timer(seconds, end)
    t.daemon = True
    t.start()


def parse_nodes(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Nodes | None:
    """The job's nodes from --nnodes, --node-rank, --master-addr and --master-port; None for one node."""
    if args.nnodes < 1:
        ap.error(f"--nnodes must be >= 1, not {args.nnodes}")
    if args.nnodes == 1:
        if args.node_rank not in (None, 0) or args.master_addr is not None or args.rendezvous:
            ap.error("--node-rank, --master-addr and --rendezvous are for --nnodes > 1")
        return None
    if args.node_rank is None or not 0 <= args.node_rank < args.nnodes:
        ap.error(
            f"--node-rank must be 0 .. {args.nnodes - 1} with --nnodes {args.nnodes}, not {args.node_rank}"
        )
    if bool(args.master_addr) == bool(args.rendezvous):
        ap.error(
            "with --nnodes > 1, give node 0's address: --master-addr HOST, or --rendezvous URI (published "
            "there by node 0 at each start)"
        )
    if not 0 <= args.master_port < 65536 or (args.master_addr and not args.master_port):
        ap.error(
            f"--master-port must be 1 .. 65535 (0: a free one, with --rendezvous), not {args.master_port}"
        )
    return Nodes(
        args.nnodes,
        args.node_rank,
        args.master_addr or "",
        args.master_port,
        timeout_s=args.rendezvous_timeout,
    )


def advertised_addr() -> str:
    """Where the other pods reach this one: BATON_POD_IP (a pod's status.podIP), else this host's name's address."""
    import socket

    return baton_env.text("BATON_POD_IP") or socket.gethostbyname(socket.gethostname())


def form_round(args: argparse.Namespace, nodes: Nodes, stop) -> Nodes | int:
    """--rendezvous: node 0 publishes this round's store; every other node waits for a round newer than the
    one it last joined (steps/lib/group.py). An exit code instead when there is nothing to join."""
    from steps.lib import group

    if nodes.rank == 0:
        rnd = group.host(
            args.rendezvous, advertised_addr(), args.name, args.round_key, nodes.port, nodes.count
        )
        print(f"[steps.train] node 0 hosts round {rnd.round_id} at {rnd.addr}:{rnd.port}", file=sys.stderr)
    else:
        rnd = group.join(
            args.rendezvous, nodes.rank, args.name, args.round_key, args.rendezvous_timeout, stop
        )
        if rnd == "done":
            print("[steps.train] node 0 finished the run: nothing to do -> exit 0", file=sys.stderr)
            return EXIT_OK
        if rnd == "failed":
            print(
                f"[steps.train] node 0 ended with {EXIT_FAIL}, which nothing retries -> exit {EXIT_FAIL}",
                file=sys.stderr,
            )
            return EXIT_FAIL
        if isinstance(rnd, str):  # stopped (a SIGTERM while waiting) or timeout: nothing trained
            print(
                f"[steps.train] no round of node 0 to join ({rnd}) -> exit {EXIT_PREEMPTED}", file=sys.stderr
            )
            return EXIT_PREEMPTED
        print(
            f"[steps.train] node {nodes.rank} joins round {rnd.round_id} at {rnd.addr}:{rnd.port}",
            file=sys.stderr,
        )
    return Nodes(nodes.count, nodes.rank, rnd.addr, rnd.port, rnd.round_id, nodes.timeout_s)


def own_record(evidence: Evidence, rec: dict) -> dict:
    """A record this wrapper writes itself, where no trainer wrote one: on stdout and into the evidence.
    Its `attempt` is null, since only a trainer claims an attempt number (readers count such a record under
    no attempt), and its `source` is `steps.train`."""
    rec = {**rec, "attempt": None, "time": round(time.time(), 3), "source": "steps.train"}
    line = json.dumps(rec)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    try:
        evidence.add(line)
        evidence.flush()
    except Exception as e:  # noqa: BLE001 - evidence is a copy
        print(f"[steps.train] could not copy a record to the evidence: {e}", file=sys.stderr)
    return rec


def round_not_formed(
    evidence: Evidence, nodes: Nodes, rc: int, reason: str = "round_not_formed", **extra: Any
) -> dict:
    """The `retry_later` record written when this node's round never formed: no trainer ran, so none wrote
    one. Its fields: `event`, `reason` (`round_not_formed`; `round_superseded` for a node other than 0 that
    left a round node 0 had given up), `round`, `node`, `step` (0: nothing trained), `launcher_exit`, what
    `extra` adds (node 0: `missing`, the nodes that never joined; `round_superseded`: `by`, the newer round or
    node 0's end), and own_record's (`attempt` null, `source`)."""
    return own_record(
        evidence,
        {
            "event": "retry_later",
            "reason": reason,
            "round": nodes.round_id,
            "node": nodes.rank,
            "step": 0,
            "launcher_exit": rc,
            **extra,
        },
    )


def missing_peers(args: argparse.Namespace, nodes: Nodes) -> list[int]:
    """Node 0: the nodes whose files do not name this round as joined ([] when they cannot be read: the
    trainer's failure then stands as its own)."""
    from steps.lib import group

    try:
        joined = set(group.joined_peers(args.rendezvous, nodes.count, nodes.round_id, args.round_key))
    except Exception as e:  # noqa: BLE001 - a store error
        print(f"[steps.train] node 0 could not read its peers' round files: {e}", file=sys.stderr)
        return []
    return [i for i in range(1, nodes.count) if i not in joined]


class ErrorLine:
    """The trainer's stderr, passed through line by line, remembering its last `error: ...` line (baton's
    trainer and `baton_args` print a bad config that way): what the `failed` record of a trainer that
    exited before any record names."""

    def __init__(self, stream) -> None:
        self.last: str | None = None
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream) -> None:
        for line in stream:
            sys.stderr.write(line)
            sys.stderr.flush()
            text = line.strip()
            if text.startswith("error:"):
                self.last = text[:500]

    def join(self, timeout: float = 2.0) -> str | None:
        # Short: a grandchild that outlives the trainer (a data loader worker) may hold the pipe open, and
        # the pod's grace is still running after a preemption.
        self._thread.join(timeout)
        return self.last


class RoundWatch:
    """With --rendezvous: while torchrun forms this round, and until the trainer's first record, read the
    round files (steps/lib/group.py). torchrun is stopped when the round cannot form or was abandoned:
    - node 0 reads the other nodes' files: it acknowledges each node waiting with a fresh nonce (a node joins
      only a round that acknowledges its own: group.acknowledge), and a node that ended with 1 for good
      (failed_peers) can never join, and torchrun's static rendezvous would wait for it until its timeout;
      this node then ends with 1 (`peer`: the node that failed);
    - a node other than 0 reads node 0's file: a newer round (node 0 came back after this one was given up)
      or an ended one means nobody will complete this round; this node then ends with 75, and its retry
      joins the newer round (`superseded`: the round or state that took its place)."""

    def __init__(
        self,
        folder: str,
        nodes: Nodes,
        key: bytes,
        child: subprocess.Popen,
        grace_s: float,
        poll_s: float,
        pod: str,
    ) -> None:
        self.folder, self.nodes, self.key, self.child, self.grace_s, self.poll_s = (
            folder,
            nodes,
            key,
            child,
            grace_s,
            poll_s,
        )
        self.pod = pod
        self.peer: int | None = None
        self.superseded: str | None = None
        self._lock = threading.Lock()
        self._recorded = False
        self._over = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def record_seen(self) -> None:
        """The trainer wrote a record: the group formed, and the watch is over."""
        with self._lock:
            self._recorded = True
        self._over.set()

    def stop(self) -> None:
        """The watch ends; once this returns it reads and writes no round file (node 0's end() may follow)."""
        self._over.set()
        with self._lock:
            pass

    def _check(self) -> str | None:
        """Why this round is over (a sentence), or None; sets `peer` or `superseded`."""
        from steps.lib import group

        if self.nodes.rank == 0:
            rnd = group.Round(self.nodes.round_id, self.nodes.addr, self.nodes.port)
            group.acknowledge(self.folder, rnd, self.pod, self.nodes.count, self.key)
            peers = group.failed_peers(self.folder, self.nodes.count, self.key)
            if peers:
                self.peer = peers[0]
                return (
                    f"node {peers[0]} ended with {EXIT_FAIL} for good (its signed mark in {self.folder}): "
                    "this round cannot form"
                )
            return None
        round_id, state = group.node0_round(self.folder, self.key)
        if round_id is None or (round_id == self.nodes.round_id and state == "running"):
            return None  # no valid file (a store error, a planted file) is no news: the timeout still bounds the wait
        self.superseded = round_id if round_id != self.nodes.round_id else state
        return (
            f"node 0 {'published round ' + round_id if round_id != self.nodes.round_id else 'ended ' + str(state)} "
            f"before round {self.nodes.round_id} formed: leaving it"
        )

    def _run(self) -> None:
        wait = 0.0
        while not self._over.wait(wait):
            wait = self.poll_s
            with self._lock:
                if self._recorded or self._over.is_set():
                    return
                try:
                    why = self._check()
                except Exception as e:  # noqa: BLE001 - a store error: the rendezvous timeout still bounds the wait
                    print(
                        f"[steps.train] node {self.nodes.rank} could not read the round files: {e}",
                        file=sys.stderr,
                    )
                    continue
            if why is None:
                continue
            print(f"[steps.train] {why}, stopping torchrun", file=sys.stderr)
            if self.child.poll() is None:
                self.child.send_signal(signal.SIGTERM)
                kill_after(self.child, self.grace_s)
            return


def main(argv: list[str] | None = None) -> int:
    baton_env.check_or_exit()  # every BATON_ variable, before anything starts: a bad one is one line and exit 1
    ap = ArgParser(
        prog="python -m steps.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    seconds = flag_type(Bound(0, baton_env.MAX_GRACE_S))
    ap.add_argument(
        "--nproc",
        type=flag_type(BOUNDS["ranks"]),
        default=1,
        help="ranks on this node (torchrun --nproc-per-node)",
    )
    ap.add_argument(
        "--trainer",
        default="baton",
        help="baton (default), hf (the HF Trainer example), or 'SCRIPT ARGS...' / '-m MODULE ARGS...'",
    )
    ap.add_argument("--config", help="config file, passed on as --config (baton's trainer requires one)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument(
        "--evidence",
        default=baton_env.text("BATON_EVIDENCE_URI") or None,
        help="fsspec folder to copy the record lines to as they happen",
    )
    ap.add_argument(
        "--shutdown-timeout",
        type=seconds,
        default=None,
        help="torchrun's --shutdown-timeout and the workers' BATON_GRACE (default: BATON_GRACE or 30)",
    )
    ap.add_argument(
        "--done-linger",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="after the trainer's done record, how long the launcher may take to exit before it is "
        f"ended (default: {DONE_LINGER_S:g} for baton's trainer across nodes, where `done` is its "
        "last act and torchrun's exit barrier can hold the pod; otherwise never: a script may "
        "have more to do after its Trainer's done)",
    )
    ap.add_argument(
        "--name",
        default=baton_env.text("BATON_POD_NAME") or f"attempt-{uuid.uuid4().hex[:8]}",
        help="name of this attempt's evidence file",
    )
    ap.add_argument(
        "--launcher",
        default="auto",
        choices=("auto", "torchrun", "direct"),
        help="auto (default): direct for one rank on one node, torchrun otherwise",
    )
    ap.add_argument(
        "--nnodes",
        type=flag_type(BOUNDS["nodes"]),
        default=1,
        help="pods in the job, one node each (default 1)",
    )
    ap.add_argument(
        "--node-rank",
        type=flag_type(Bound(0, BOUNDS["nodes"].high - 1, integer=True)),
        default=None,
        help="this pod's node, 0 .. nnodes-1 (with --nnodes > 1)",
    )
    ap.add_argument(
        "--master-addr", default=None, help="node 0's address: the rendezvous (with --nnodes > 1)"
    )
    ap.add_argument(
        "--master-port",
        type=flag_type(BOUNDS["store_port"]),
        default=29500,
        help="the rendezvous port on node 0 (default 29500; 0 with --rendezvous: a free one)",
    )
    ap.add_argument(
        "--rendezvous",
        default=None,
        metavar="URI",
        help="instead of --master-addr: a folder where node 0 publishes each round's address "
        "(steps/lib/group.py); every other node joins only a round newer than its last",
    )
    ap.add_argument(
        "--rendezvous-timeout",
        type=flag_type(Bound(0, BOUNDS["rendezvous_timeout"].high, above=True)),
        default=900.0,
        help="seconds a node waits for node 0's next round, and torchrun's rendezvous for the other "
        "nodes, before exiting 75 (default 900)",
    )
    args = ap.parse_args(argv)
    nodes = parse_nodes(ap, args)
    if args.rendezvous:
        from steps.lib.group import round_key

        try:
            args.round_key = round_key()
        except ValueError as e:
            ap.error(f"--rendezvous: {e}")
    direct = args.launcher == "direct" or (args.launcher == "auto" and args.nproc == 1 and nodes is None)
    if direct and args.nproc != 1:
        ap.error("--launcher direct runs one rank: use torchrun for --nproc > 1")
    if direct and nodes is not None:
        ap.error("--launcher direct runs one pod alone: several nodes need torchrun's rendezvous")

    signalled = threading.Event()
    child: subprocess.Popen | None = None
    evidence: Evidence | None = None
    g = args.shutdown_timeout if args.shutdown_timeout is not None else grace()

    def forward(signum: int, _frame) -> None:
        first = not signalled.is_set()
        signalled.set()
        if first and evidence is not None:
            evidence.flush_in_background()
        if child is not None and child.poll() is None:
            child.send_signal(signum)
            if direct and first:
                kill_after(child, g)

    signal.signal(signal.SIGTERM, forward)
    if nodes is not None and args.rendezvous:
        formed = form_round(args, nodes, signalled.is_set)
        if isinstance(formed, int):
            return formed
        nodes = formed
    launch_env: dict[str, str] = {}
    if direct:
        launcher = [sys.executable]
        launch_env = rank0_of_1_env()
    elif torchrun_has_shutdown_timeout():
        launcher = torchrun(args.nproc, [f"--shutdown-timeout={max(1, int(g))}"], nodes)
    else:  # an older torchrun SIGKILLs its workers 30 s after its SIGTERM: they must budget for that
        launcher = torchrun(args.nproc, [], nodes)
        if g > TORCHRUN_FIXED_SHUTDOWN_S:
            print(
                f"[steps.train] this torch's torchrun has no --shutdown-timeout and kills workers "
                f"{TORCHRUN_FIXED_SHUTDOWN_S} s after a SIGTERM: the workers' grace is {TORCHRUN_FIXED_SHUTDOWN_S} s, "
                f"not {g:g} s",
                file=sys.stderr,
            )
            g = TORCHRUN_FIXED_SHUTDOWN_S
    cmd = [*launcher, *program(args.trainer)]
    if args.config:
        cmd += ["--config", args.config]
    for o in args.overrides:
        cmd += ["--set", o]
    evidence = Evidence(args.evidence, args.name)
    # One grace for the whole pod: the workers budget against what torchrun allows them.
    env = dict(
        os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), BATON_GRACE=str(g), **launch_env
    )
    # glibc's mmap threshold fixed at 1 MiB unless set: freed staging and load buffers go back to the OS
    # instead of staying on the heap (an async save's peak: 1.29 -> 1.06 checkpoints, docs/results.md).
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(MMAP_THRESHOLD))
    child = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1, env=env, errors="replace"
    )
    assert child.stderr is not None
    errors = ErrorLine(child.stderr)
    if signalled.is_set():  # the SIGTERM came while the launcher was starting: pass it on now
        child.send_signal(signal.SIGTERM)
        if direct:
            kill_after(child, g)
    watch = None
    if nodes is not None and args.rendezvous:
        from steps.lib.group import PEER_POLL_S

        watch = RoundWatch(args.rendezvous, nodes, args.round_key, child, g, PEER_POLL_S, args.name)
    preempted = done = stepped = recorded = False
    linger = (
        args.done_linger
        if args.done_linger is not None
        else (DONE_LINGER_S if args.trainer == "baton" and nodes is not None else None)
    )
    assert child.stdout is not None
    for line in child.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        s = line.strip()
        if s.startswith("{") and '"event"' in s:
            try:
                rec = json.loads(s)
            except json.JSONDecodeError:
                continue
            try:
                evidence.add(s)
            except Exception as e:  # noqa: BLE001 - evidence is a copy; losing a line must not end training
                print(f"[steps.train] could not copy a record to the evidence: {e}", file=sys.stderr)
            # `retry_later`: the trainer ended retry-safe for another reason (trainer/faults.py)
            preempted |= rec.get("event") in ("preempt", "retry_later")
            if rec.get("event") == "done" and not done:
                done = True
                if linger is not None:
                    end_after_done(child, linger, g)
            stepped |= rec.get("event") == "step"
            if not recorded and watch is not None:
                watch.record_seen()
            recorded = True
    rc = child.wait()
    if watch is not None:
        watch.stop()
    error = errors.join()
    try:
        evidence.flush()
    except Exception as e:  # noqa: BLE001
        print(f"[steps.train] could not write the evidence: {e}", file=sys.stderr)
    if watch is not None and watch.peer is not None:
        # Node `peer` ended with 1 for good before this round formed: nothing will retry it, so nothing will
        # join; ending with 1 now (and marking node-0.json failed, below) instead of at the rendezvous timeout.
        code = EXIT_FAIL
        own_record(
            evidence,
            {
                "event": "failed",
                "reason": "peer_failed",
                "node": watch.peer,
                "round": nodes.round_id,
                "step": 0,
                "launcher_exit": rc,
                "error": f"node {watch.peer} ended with {EXIT_FAIL} for good before round "
                f"{nodes.round_id} formed",
            },
        )
    elif watch is not None and watch.superseded is not None and not recorded:
        # Node 0 gave this round up (it came back with a newer one, or ended) before it formed: the retry joins
        # the newer round, or ends as node 0 did.
        round_not_formed(evidence, nodes, rc, "round_superseded", by=watch.superseded)
        code = EXIT_PREEMPTED
    elif done:  # the final checkpoint is committed (`done` follows the commit and a barrier)
        if rc != 0 and not signalled.is_set():
            # Seen once at nodes=2 (torch 2.13): node 1's trainer aborted ("terminate called without an active
            # exception", SIGABRT) while shutting down after `done`. Nothing committed can change after it.
            print(
                f"[steps.train] the trainer wrote `done` and then exited {rc} while shutting down: the run is "
                "complete",
                file=sys.stderr,
            )
        code = EXIT_OK  # after a SIGTERM too: the launcher's rc is then its own
    elif preempted or (signalled.is_set() and not stepped):
        code = EXIT_PREEMPTED
    elif args.rendezvous and nodes is not None and nodes.rank > 0 and not recorded:
        # The group never formed (node 0 went), or this node's trainer failed before its first step (a
        # node > 0 writes no record before it): the retry waits for node 0's next round, and ends with 1
        # if node 0 ended with 1 (steps/lib/group.py). Node 0 decides as a single node does.
        print(
            "[steps.train] torchrun ended before the trainer wrote any record: the group did not form",
            file=sys.stderr,
        )
        round_not_formed(evidence, nodes, rc)
        code = EXIT_PREEMPTED
    elif (
        args.rendezvous
        and nodes is not None
        and nodes.rank == 0
        and not recorded
        and (missing := missing_peers(args, nodes))
    ):
        # torchrun's rendezvous ended (its timeout) without these nodes: a slow replacement (a new Spot VM, an
        # image pull, a node that stays unreachable until it is deleted) is retried, not failed for good.
        print(
            f"[steps.train] round {nodes.round_id} did not form: node(s) {missing} never joined",
            file=sys.stderr,
        )
        round_not_formed(evidence, nodes, rc, missing=missing)
        code = EXIT_PREEMPTED
    else:
        code = EXIT_FAIL
        if not recorded:  # the trainer ended before its first record: the drill's report names why
            own_record(
                evidence,
                {
                    "event": "failed",
                    "reason": "trainer_error",
                    "step": 0,
                    "launcher_exit": rc,
                    "error": error or f"the trainer exited {rc} before writing any record (see its log)",
                },
            )
    print(
        f"[steps.train] {'the rank' if direct else 'torchrun'} exited {rc}; preempt record: {preempted}, done record: {done}, "
        f"signalled: {signalled.is_set()}, step records: {stepped} -> exit {code}",
        file=sys.stderr,
    )
    if nodes is not None and args.rendezvous and nodes.rank == 0 and code in (EXIT_OK, EXIT_FAIL):
        from steps.lib import group

        group.end(
            args.rendezvous,
            group.Round(nodes.round_id, nodes.addr, nodes.port),
            args.name,
            "done" if code == EXIT_OK else "failed",
            args.round_key,
        )
    if (
        nodes is not None
        and args.rendezvous
        and nodes.rank > 0
        and code == EXIT_FAIL
        and not signalled.is_set()
    ):
        # 1 without a SIGTERM: Argo records "Error (exit code 1)", which the drill never retries. Node 0's
        # next round would wait for this node until its rendezvous timeout; the signed mark ends that wait.
        # (After a SIGTERM the pod was deleted, and Argo may retry it as `pod deleted`: no mark.)
        from steps.lib import group

        try:
            group.fail(args.rendezvous, nodes.rank, args.name, nodes.round_id, args.round_key)
        except Exception as e:  # noqa: BLE001 - the exit code stands; node 0 then waits out its timeout
            print(
                f"[steps.train] could not mark node {nodes.rank} failed in {args.rendezvous}: {e}",
                file=sys.stderr,
            )
    return code


def _main() -> int:
    try:
        return main()
    except (
        baton_env.EnvError
    ) as e:  # a variable in a spelling baton does not read: one line, and no retry helps
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(_main())
