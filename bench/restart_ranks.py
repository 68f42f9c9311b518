"""The restart at 2 ranks and on 2 nodes, against a floor measured the same way (issue 52, item 3).

A checkpoint of world size 2 is committed by a real run (`steps.train --nproc 2`, SIGTERMed once its
periodic checkpoint at step K is committed: it saves the step it reached and exits 75). Then, interleaved,
`reps` times each:
- `ranks`: `python -m steps.train --nproc 2` resuming from it: the pod's PID 1, torchrun, two gloo ranks;
- `ranks_floor`: `torchrun --nproc-per-node 2 -m bench.restart_floor`, the same processes doing only what
  a restart must (imports, a plain process group, each rank's share of the checkpoint's bytes read once,
  the model built and sharded, one step with one all-reduce);
- `nodes`: two PID 1s, `steps.train --nnodes 2 --node-rank I --nproc 1 --rendezvous DIR` (node 0 publishes
  its round in a folder of the bucket, a local one here), started together;
- `nodes_floor`: two `torchrun --nnodes 2 --node-rank I --rdzv-backend static --nproc-per-node 1 -m
  bench.restart_floor`, started together.
Each is timed from the spawn (of both, for the nodes) to the first step record of rank 0. The restarts'
`resume` records give each rank's phases (`rank_phases`). Goal: a restart <= 1.3x its floor.

    python -m bench.restart_ranks --result FILE [--reps 3] [--quick]
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

from bench.common import (
    PY,
    REPO,
    TINY_CORPUS,
    WORK,
    child_env,
    free_port,
    interleaved,
    kill_tree,
    log,
    median,
    parse_line,
    section_args,
    timed_until,
    write_result,
)
from bench.startup import CONFIG, SIZES, build_model
from trainer.checkpoint import open_root
from trainer.exits import EXIT_PREEMPTED
from trainer.storage import local_path

K = 10
SIZE = "17m"
ROUND_KEY = "bench-restart-ranks-round-key"
GOAL = 1.3


def sets(model: Path, ckpt: Path) -> list[str]:
    return [
        f"name=bench-restart-{model.name}",
        f"model.path={model}",
        f"data.uri={TINY_CORPUS}",
        f"total_steps={K + 1000}",
        f"checkpoint.uri=file://{ckpt}",
        f"checkpoint.every_steps={K}",
        "notice.enabled=false",
        "log_every=100000",
    ]


def train_cmd(s: list[str], *extra: str) -> list[str]:
    cmd = [PY, "-m", "steps.train", "--config", str(CONFIG), *extra]
    for x in s:
        cmd += ["--set", x]
    return cmd


def commit_at_world_2(s: list[str], ckpt: Path) -> tuple[Path, int]:
    """A real two-rank run, SIGTERMed after its checkpoint at step K: the committed step's folder, and its step."""
    p = subprocess.Popen(
        train_cmd(s, "--nproc", "2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=child_env(),
        cwd=REPO,
        start_new_session=True,
    )
    assert p.stdout is not None
    try:
        for line in p.stdout:
            rec = parse_line(line)
            if rec and rec.get("event") == "checkpoint" and rec.get("step") == K:
                p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=300)
    finally:
        if p.poll() is None:
            kill_tree(p.pid)
    if rc != EXIT_PREEMPTED:
        raise RuntimeError(f"the two-rank run that commits the checkpoint exited {rc}, not {EXIT_PREEMPTED}")
    url, manifest = open_root(f"file://{ckpt}").final()
    if manifest.get("world_size") != 2:
        raise RuntimeError(f"the committed checkpoint is of world size {manifest.get('world_size')}, not 2")
    return Path(local_path(url) or url), int(manifest["step"])


def first_step(node0: list[str], others: list[list[str]], resumed_at: int | None) -> dict[str, Any]:
    """Start `others` (in the background) and `node0` together; seconds from the spawn to node 0's first step
    record, and its `resume` record's per-rank phases."""
    env = child_env(BATON_ROUND_KEY=ROUND_KEY)
    procs = [
        subprocess.Popen(
            c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO, start_new_session=True
        )
        for c in others
    ]
    try:
        secs, recs, _ = timed_until(node0, lambda r: r.get("event") == "step", env=env, timeout=600)
    finally:
        for p in procs:
            kill_tree(p.pid)
            p.wait()
    steps = [r["step"] for r in recs if r.get("event") == "step"]
    if secs is None or (resumed_at is not None and steps[:1] != [resumed_at + 1]):
        raise RuntimeError(f"no first step after {resumed_at}: steps {steps}")
    resume = next((r for r in recs if r.get("event") == "resume"), {})
    return {"first_step_s": secs, "rank_phases": resume.get("rank_phases")}


def main() -> None:
    args = section_args(__doc__ or "")
    root = WORK / "restart-ranks"
    shutil.rmtree(root, ignore_errors=True)
    model, count = build_model(SIZE, SIZES[SIZE])
    ckpt = root / "ckpt"
    s = sets(model, ckpt)
    folder, saved = commit_at_world_2(s, ckpt)
    nbytes = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    log(
        f"restart-ranks: {count / 1e6:.1f} M parameters, world-2 checkpoint at step {saved}: {nbytes / 1e9:.2f} GB"
    )
    floor = [PY, "-m", "torch.distributed.run"]
    floor_args = ["-m", "bench.restart_floor", "--model", str(model), "--checkpoint", str(folder)]
    floor_args += ["--corpus", str(TINY_CORPUS)]

    def run(side: str, rep: int) -> dict[str, Any]:
        if side == "ranks":
            return first_step(train_cmd(s, "--nproc", "2"), [], saved)
        if side == "ranks_floor":
            return first_step([*floor, "--standalone", "--nproc-per-node=2", *floor_args], [], None)
        port = free_port()
        if side == "nodes":
            rdzv = root / f"rounds-{rep}"

            def node(i: int) -> list[str]:
                group = ["--nnodes", "2", "--node-rank", str(i), "--rendezvous", str(rdzv)]
                return train_cmd(s, "--nproc", "1", *group, "--master-port", "0", "--name", f"node-{i}-{rep}")

            return first_step(node(0), [node(1)], saved)
        static = [*floor, "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=static"]
        static += ["--master-addr=127.0.0.1", f"--master-port={port}"]
        return first_step(
            [*static, "--node-rank=0", *floor_args], [[*static, "--node-rank=1", *floor_args]], None
        )

    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in ("ranks", "ranks_floor", "nodes", "nodes_floor")}
    for rep, side in interleaved(args.reps, list(runs)):
        value = run(side, rep)
        runs[side].append(value)
        log(f"restart-ranks rep {rep + 1}/{args.reps} {side}: {value['first_step_s']:.2f} s")
    result: dict[str, Any] = {"k": saved, "params": count, "checkpoint_bytes": nbytes, "runs": runs}
    for kind in ("ranks", "nodes"):
        first = median([r["first_step_s"] for r in runs[kind]])
        floor_s = median([r["first_step_s"] for r in runs[f"{kind}_floor"]])
        phased = [r["rank_phases"] for r in runs[kind] if r["rank_phases"]]
        per_rank = (
            [
                {k: median([p[rank][k] for p in phased if k in p[rank]]) for k in phased[0][rank]}
                for rank in range(len(phased[0]))
            ]
            if phased
            else []
        )
        result[kind] = {
            "first_step_s": first,
            "floor_s": floor_s,
            "ratio": first / floor_s,
            "rank_phases": per_rank,
        }
    shutil.rmtree(root, ignore_errors=True)
    write_result(args.result, result)


if __name__ == "__main__":
    main()
