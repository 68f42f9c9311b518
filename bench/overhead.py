"""Loop overhead: steps/s of baton's loop against a plain loop on the same model, data and optimizer.

Sides, interleaved, `reps` times each, every one a fresh process on the small Qwen2 (~3.4 M parameters,
batch 4 x 64 tokens, no accumulation) for `steps` optimizer steps:
- plain: `bench.plain_loop` (no FSDP, no records, no capture, no checkpoints);
- plain_fsdp (a diagnostic): the plain loop with the model wrapped by FSDP2 as baton wraps it;
- baton: `python -m trainer` with no checkpoint before the final one (the loop's own bookkeeping);
- baton_yd: `python -m trainer` checkpointing at the Young/Daly interval sqrt(2 C M) through its own
  `cadence.mode=auto`: C is the save cost measured by the first baton run (its final save), M the
  assumed MTBF. M is 1 h scaled to the bench: the plain run's duration stands for one hour, so M is
  that duration (seconds). The save cost is not scaled, so this overhead is the one a run with
  MTBF = 1 h would pay if its save cost were C x (3600 s / run duration): pessimistic.
- with `--ws2`, also plain_ws2 and baton_ws2: the same two at world size 2 under torchrun (gloo,
  each rank half of each global batch of 8): the plain loop wrapped in FSDP2 with one all-reduce a
  step of its own, and baton, checkpointing only at the end.
steps/s counts from the first step record to the last one, so start-up and the final save are out,
and every periodic save in between is in. The figure is the median of the per-round ratios (baton over
the plain run of the same round: rounds are interleaved, so a round's two runs saw the same neighbours),
with their lowest and highest, over at least MIN_ROUNDS rounds; every run records the machine's 1-minute
load average when it started.

    python -m bench.overhead --result FILE [--reps 7] [--steps 120] [--ws2] [--sides A,B,...]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
from typing import Any

from bench.common import (
    PY,
    TINY_CORPUS,
    WORK,
    interleaved,
    log,
    median,
    run_records,
    section_args,
    write_result,
)
from bench.models import small_model


def steps_per_s(recs: list[dict]) -> tuple[float, float]:
    """(steps/s between the first and the last step record, the seconds that spans)."""
    times = [r["time"] for r in recs if r["event"] == "step"]
    span = times[-1] - times[0]
    return (len(times) - 1) / span, span


def baton_cmd(model: str, ckpt: str, steps: int, *sets: str) -> list[str]:
    cmd = [PY, "-m", "trainer", "--config", "trainer/configs/tiny.yaml"]
    for s in (
        f"model.path={model}",
        f"data.uri={TINY_CORPUS}",
        f"checkpoint.uri={ckpt}",
        f"total_steps={steps}",
        "name=bench-loop",
        "data.grad_accum=1",
        "data.batch_size=4",
        "data.seq_len=64",
        "log_every=1000",
        "checkpoint.every_steps=0",
        "checkpoint.keep_last=2",
        *sets,
    ):
        cmd += ["--set", s]
    return cmd


MIN_ROUNDS = 7
"""Rounds of the loop figure at the least (`--reps` asks for more): with 3, one slow round moved the median."""
PAIRS = {"ws1": ("baton", "plain"), "yd": ("baton_yd", "plain"), "ws2": ("baton_ws2", "plain_ws2")}
"""The figure's ratios: name -> (baton's side, the plain side it is divided by, round by round)."""


def round_ratios(
    runs: dict[str, list[dict[str, Any]]], side: str, plain: str, net_of_saves: bool = False
) -> dict[str, Any] | None:
    """Per round, `side`'s steps/s over `plain`'s of the same round: their median, lowest and highest.
    `net_of_saves`: `side`'s steps/s with its periodic saves' own time (their `save_ms`) taken out of its span,
    which leaves what the loop costs at that cadence besides the checkpoint itself."""
    if not runs.get(side) or not runs.get(plain):
        return None
    ratios = [
        (net_steps_per_s(a) if net_of_saves else a["steps_per_s"]) / b["steps_per_s"]
        for a, b in zip(runs[side], runs[plain], strict=True)
    ]
    return {"median": median(ratios), "lowest": min(ratios), "highest": max(ratios), "rounds": ratios}


def net_steps_per_s(run: dict[str, Any]) -> float:
    """A run's steps/s over its span less the time its periodic saves took (their records' `save_ms`)."""
    steps = run["steps_per_s"] * run["span_s"]
    return steps / (run["span_s"] - run["periodic_save_s"])


def _extra(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--ws2", action="store_true", help="also world size 2 (torchrun, gloo)")
    ap.add_argument(
        "--sides",
        default="",
        help="only these sides, comma-separated (plain_ws2,baton_ws2; or plain,baton,baton_yd): many rounds "
        "of one pair in less time",
    )


TORCHRUN = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
SIDES = ("plain", "plain_fsdp", "baton", "baton_yd", "plain_ws2", "baton_ws2")
"""Every side, in a round's order; the last two only with --ws2 (or named in --sides)."""


def main() -> None:
    args = section_args(__doc__ or "", _extra)
    model = str(small_model())
    root = WORK / "overhead"
    shutil.rmtree(root, ignore_errors=True)
    steps = 60 if args.quick else args.steps
    reps = args.reps if args.quick else max(args.reps, MIN_ROUNDS)
    wanted = args.sides.split(",") if args.sides else [s for s in SIDES if args.ws2 or not s.endswith("_ws2")]
    if unknown := [w for w in wanted if w not in SIDES]:
        raise SystemExit(f"--sides: unknown {unknown}; known: {', '.join(SIDES)}")
    if "baton_yd" in wanted and not {"plain", "baton"} <= set(wanted):
        raise SystemExit("--sides: baton_yd needs plain and baton (its interval comes from their runs)")
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES if s in wanted}
    save_cost: list[float] = []
    plan: dict[str, float] = {}
    for rep, side in interleaved(reps, list(runs)):
        ckpt = str(root / f"{side}-{rep}")
        load1 = os.getloadavg()[0]
        if side == "plain_ws2":
            rc, recs = run_records(
                [
                    *TORCHRUN,
                    "-m",
                    "bench.plain_loop",
                    "--model",
                    model,
                    "--corpus",
                    str(TINY_CORPUS),
                    "--steps",
                    str(steps),
                ]
            )
        elif side == "baton_ws2":
            rc, recs = run_records([*TORCHRUN, *baton_cmd(model, ckpt, steps)[1:]])
        elif side.startswith("plain"):
            rc, recs = run_records(
                [
                    PY,
                    "-m",
                    "bench.plain_loop",
                    "--model",
                    model,
                    "--corpus",
                    str(TINY_CORPUS),
                    "--steps",
                    str(steps),
                    *(["--fsdp"] if side == "plain_fsdp" else []),
                ]
            )
        elif side == "baton":
            rc, recs = run_records(baton_cmd(model, ckpt, steps))
            save_cost += [r["save_ms"] / 1000 for r in recs if r["event"] == "checkpoint"]
        else:
            if not plan:
                mtbf = median([r["span_s"] for r in runs["plain"]])
                c = median(save_cost)
                plan = {"mtbf_s": mtbf, "save_cost_s": c, "interval_s": math.sqrt(2 * c * mtbf)}
                log(
                    f"Young/Daly: C {c:.3f} s, M {mtbf:.1f} s (1 h scaled to the plain run) -> every "
                    f"{plan['interval_s']:.2f} s"
                )
            rc, recs = run_records(
                baton_cmd(
                    model,
                    ckpt,
                    steps,
                    "cadence.mode=auto",
                    f"cadence.mtbf_prior_s={plan['mtbf_s']}",
                    "cadence.mtbf_prior_weight=1000000",
                    f"cadence.every_s={plan['interval_s']}",
                    "cadence.min_interval_s=0.1",
                )
            )
        sps, span = steps_per_s(recs)
        saves = [r for r in recs if r["event"] == "checkpoint" and r.get("reason") == "periodic"]
        runs[side].append(
            {
                "steps_per_s": sps,
                "span_s": span,
                "exit": rc,
                "periodic_saves": len(saves),
                "periodic_save_s": sum(r["save_ms"] for r in saves) / 1000,
                "load1": load1,
            }
        )
        shutil.rmtree(ckpt, ignore_errors=True)
        log(
            f"overhead round {rep + 1}/{reps} {side}: {sps:.1f} steps/s over {span:.1f} s, load {load1:.2f}"
            + (f", {len(saves)} periodic saves" if side == "baton_yd" else "")
        )
    result: dict[str, Any] = {"steps": steps, "runs": runs, "plan": plan}
    for side, rs in runs.items():
        result[f"{side}_steps_per_s"] = median([r["steps_per_s"] for r in rs])
    for name, (side, plain) in PAIRS.items():
        result[f"ratio_{name}"] = round_ratios(runs, side, plain)
    result["ratio_yd_net"] = round_ratios(runs, "baton_yd", "plain", net_of_saves=True)
    loads = [r["load1"] for rs in runs.values() for r in rs]
    result["load1"] = {"median": median(loads), "lowest": min(loads), "highest": max(loads)}
    if runs.get("baton_yd"):
        result["yd_saves"] = median([r["periodic_saves"] for r in runs["baton_yd"]])
        result["yd_save_s"] = median([r["periodic_save_s"] for r in runs["baton_yd"]])
    result["trajectory_ms"] = trajectory_ms(batch=4, seq=64, accum=1)
    write_result(args.result, result)


def trajectory_ms(batch: int, seq: int, accum: int, reps: int = 500) -> float:
    """What the trajectory adds to a step on the host, in this process: the digest of the step's
    micro-batches and of the RNG states it starts from (the loop captures those states anyway, for the
    checkpoint). Its share of a step is this over baton's step time (1 / steps/s) above."""
    import time

    import torch

    from trainer import rng, trajectory

    batches = [torch.randint(0, 32000, (batch, seq)) for _ in range(accum)]
    captured = rng.capture()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            trajectory.batch_digest(batches)
            trajectory.rng_digest(captured)
        times.append((time.perf_counter() - t) / reps * 1000)
    return median(times)


if __name__ == "__main__":
    main()
