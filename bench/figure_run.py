"""Figures 3, 4 and 5: resume cost, equivalence of an interrupted run, loop overhead."""

from __future__ import annotations

from typing import Any

from bench.figure import Figure, fmt_s, fmt_x


def resume_figure(r: dict[str, Any]) -> Figure:
    k0, k1 = r["ks"]
    b0, b1, h0, h1 = (r[f"{s}@{k}_s"] for s in ("baton", "hf") for k in (k0, k1))
    f = Figure(
        "3",
        f"resume: spawn to first step at K={k0}, baton vs HF `resume_from_checkpoint`",
        fmt_s(b0),
        fmt_s(h0),
        fmt_x(b0 / h0),
        "",
    )
    f.rows.append(
        (
            f"resume: spawn to first step at K={k1} ({k1} batches into an epoch of "
            f"{r['batches_per_epoch']}), baton vs HF",
            fmt_s(b1),
            fmt_s(h1),
            fmt_x(b1 / h1),
        )
    )
    f.rows.append(
        (
            f"resume: growth from K={k0} to K={k1} (each side against itself)",
            fmt_x(b1 / b0),
            fmt_x(h1 / h0),
            "",
        )
    )
    bt0, bt, ht0, ht = (r.get(f"{s}@{k}_tail_s") for s in ("baton", "hf") for k in (k0, k1))
    if None not in (bt0, bt, ht0, ht):
        f.rows.append(
            (
                f"resume: last phase only (restore done to first step), K={k0} -> K={k1}",
                f"{bt0 * 1000:.0f} -> {bt * 1000:.0f} ms",
                f"{ht0 * 1000:.0f} -> {ht * 1000:.0f} ms",
                "",
            )
        )
    f.text = (
        f"A restart at step {k1}, {k1} batches into its epoch, reaches its first step {b1 / b0:.2f}x as "
        f"late as a restart at step {k0} for baton and {h1 / h0:.2f}x for the HF Trainer: neither replays "
        f"data (baton's StatefulDataLoader fast-forwards its sampler's indices; HF's accelerate "
        f"`skip_first_batches` skips index batches of a map-style dataset). The constant part dominates: "
        f"starting Python and importing torch and transformers, reading the corpus, building the "
        f"model and loading the checkpoint, and its jitter from run to run (a few tenths of a second "
        f"here) is larger than the effect of K, so these two ratios say 'flat', not more. baton's restart "
        f"takes {b0 / h0:.0%} of the HF Trainer's time at K={k0} and {b1 / h1:.0%} at K={k1}; both import "
        f"the same libraries, and baton also verifies the checkpoint's checksums and claims an attempt before "
        f"it loads."
    )
    if None not in (bt0, bt, ht0, ht):
        db, dh = bt - bt0, ht - ht0
        f.text += (
            f" The last phase isolates the position's cost: from the restore being done (baton's `resume` "
            f"record; HF's train_begin, before its batch skip) to the first step it grows by "
            f"{db * 1000:.0f} ms for baton and {dh * 1000:.0f} ms for HF over {k1 - k0} batches."
        )
        if db > 0.02 and db > 3 * dh:
            f.text += (
                " baton's is the larger: its loader fast-forwards by drawing every skipped batch from "
                "`EpochSampler`, which slices the epoch's permutation tensor once per batch (microseconds "
                "each); HF walks a list of indices. Both are small next to the restart itself."
            )
    direct, torchrun = r.get(f"baton-direct@{k0}_s"), r.get(f"baton-torchrun@{k0}_s")
    if direct is not None and torchrun is not None:
        f.rows.append(
            (
                f"resume: spawn to first step at K={k0} through `steps.train --nproc 1`, `--launcher direct` "
                "(the default for one rank) vs `torchrun`",
                fmt_s(direct),
                fmt_s(torchrun),
                fmt_x(direct / torchrun),
            )
        )
        f.text += (
            f" Through the pod's PID 1 (`steps.train`), torchrun's own start and teardown cost "
            f"{torchrun - direct:.2f} s of a one-rank restart at K={k0} ({direct:.2f} s direct vs "
            f"{torchrun:.2f} s with torchrun): one rank now runs as the wrapper's own child."
        )
    ph = r.get(f"baton@{k0}_phases")
    if ph:
        order = ["startup_s", "init_s", "build_s", "listing_s", "manifest_s", "load_verify_s", "restore_s"]
        cells = ", ".join(f"{k.removesuffix('_s')} {ph[k]:.2f}" for k in order if k in ph)
        f.rows.append(
            (f"resume: baton's phases at K={k0} (s, medians, from its `resume` record)", cells, "", "")
        )
        parts = [k for k in ph if k.startswith(("init_", "build_")) and k not in ("init_s", "build_s")]
        if parts:
            f.rows.append(
                (
                    f"resume: the parts of init and build at K={k0} (s, medians)",
                    ", ".join(f"{k.removesuffix('_s')} {ph[k]:.2f}" for k in parts),
                    "",
                    "",
                )
            )
        f.text += (
            f" baton's `resume` record times each phase of its start (medians at K={k0}): {cells} s. "
            "`startup` is the interpreter and the imports up to the trainer; `build` the corpus (read, and "
            "its samples read back from the run's packed copy: no tokenizer), the model, built without "
            "reading the pretrained weights since a checkpoint exists, and the optimizer; `load_verify` the "
            "load with every file checked while read."
        )
    return f


def equivalence_figure(e: dict[str, Any]) -> Figure:
    b, h = e["baton"], e["hf"]

    def cell(x: dict[str, Any]) -> str:
        return f"{x['differing']}/{x['tensors']} differ, max {x['max_abs_diff']:.3g}"

    f = Figure(
        "4",
        f"equivalence: SIGTERM at step {e['interrupted_at']} + resume vs uninterrupted, "
        f"model + AdamW tensors",
        cell(b),
        cell(h),
        "",
        "",
    )
    f.rows.append(
        ("equivalence, negative control (RNG not restored)", cell(b["control"]), cell(h["control"]), "")
    )
    f.text = (
        f"Both trainers resume exactly on CPU: after a SIGTERM at step {e['interrupted_at']} of "
        f"{e['total_steps']} (attention dropout 0.1, so every step draws from the RNG) the final model and "
        f"AdamW tensors equal the uninterrupted run's ({b['differing']} of {b['tensors']} differ for baton, "
        f"{h['differing']} of {h['tensors']} for HF with full_determinism). The negative controls differ in "
        f"{b['control']['differing']} and {h['control']['differing']} tensors, so the comparison sees a "
        f"difference when there is one. They part on the signal itself: baton saved at the step the "
        f"signal landed on and exited 75 ({b.get('replayed_steps', 0)} steps replayed); the HF Trainer "
        f"died of SIGTERM (exit {h['exits'][1]}), and resumed from step {e['interrupted_at']} only because "
        f"the bench held it right after writing that checkpoint. Signalled between saves, it loses every "
        f"step since its last `save_steps` checkpoint."
    )
    return f


def _ratio(o: dict[str, Any], name: str, side: str, plain: str) -> float | None:
    """The median of the per-round ratios (bench/overhead.py's PAIRS); the ratio of the medians for a result
    written before the rounds were paired."""
    r = o.get(f"ratio_{name}")
    if r:
        return r["median"]
    a, b = o.get(f"{side}_steps_per_s"), o.get(f"{plain}_steps_per_s")
    return a / b if a and b else None


def overhead_figure(o: dict[str, Any], big_save_s: float | None) -> Figure:
    p, b, y = o["plain_steps_per_s"], o["baton_steps_per_s"], o["baton_yd_steps_per_s"]
    r1, ry, r2 = (
        _ratio(o, "ws1", "baton", "plain"),
        _ratio(o, "yd", "baton_yd", "plain"),
        _ratio(o, "ws2", "baton_ws2", "plain_ws2"),
    )
    plan = o["plan"]
    f = Figure(
        "5",
        "loop: steps/s, baton (no checkpoint) vs plain loop (median of the rounds' ratios)",
        f"{b:.2f}/s",
        f"{p:.2f}/s",
        fmt_x(r1),
        "",
    )
    for name, what in (("ws1", "world size 1"), ("ws2", "world size 2")):
        r = o.get(f"ratio_{name}")
        if r:
            f.rows.append(
                (
                    f"loop: the rounds' ratios at {what}, lowest and highest of {len(r['rounds'])}",
                    fmt_x(r["lowest"]),
                    fmt_x(r["highest"]),
                    fmt_x(r["median"]),
                )
            )
    if o.get("load1"):
        ld = o["load1"]
        f.rows.append(
            (
                "loop: the machine's 1-minute load average as each run started (2 cores): lowest, "
                "highest, median",
                f"{ld['lowest']:.2f}",
                f"{ld['highest']:.2f}",
                f"{ld['median']:.2f}",
            )
        )
    f.rows.append(
        (
            "loop: steps/s, baton at the Young/Daly interval vs plain loop",
            f"{y:.2f}/s",
            f"{p:.2f}/s",
            fmt_x(ry),
        )
    )
    net = o.get("ratio_yd_net")
    if net:
        f.rows.append(
            (
                "loop: baton at the Young/Daly interval with its saves' own time (their `save_ms`) taken out, "
                f"vs plain loop (goal >= 0.97x): the rounds' ratios, lowest and highest of {len(net['rounds'])}",
                fmt_x(net["lowest"]),
                fmt_x(net["highest"]),
                fmt_x(net["median"]),
            )
        )
    fs = o.get("plain_fsdp_steps_per_s")
    if fs:
        f.rows.append(
            (
                "loop: steps/s, plain loop wrapped in FSDP2 (one rank) vs plain loop (diagnostic)",
                f"{fs:.2f}/s",
                f"{p:.2f}/s",
                fmt_x(fs / p),
            )
        )
    p2, b2 = o.get("plain_ws2_steps_per_s"), o.get("baton_ws2_steps_per_s")
    if p2 and b2:
        f.rows.append(
            (
                "loop: steps/s at world size 2 (torchrun, gloo), baton vs a plain FSDP2 loop with one "
                "all-reduce a step",
                f"{b2:.2f}/s",
                f"{p2:.2f}/s",
                fmt_x(r2),
            )
        )
    traj = o.get("trajectory_ms")
    if traj is not None:
        step_ms = 1000 / b
        f.rows.append(
            (
                "loop: the trajectory's digests (batch and RNG) per step, vs baton's step (goal < 1%)",
                f"{traj:.3f} ms",
                f"{step_ms:.1f} ms",
                f"{traj / step_ms:.2%}",
            )
        )
    predicted = plan["save_cost_s"] / plan["interval_s"]
    text = [
        f"On the small model ({o['steps']} steps, batch 4 x 64) baton's loop without checkpoints runs at "
        f"{r1:.0%} of a plain loop over the same batches; checkpointing at the Young/Daly interval "
        f"(save cost C = {plan['save_cost_s']:.2f} s, MTBF M = {plan['mtbf_s']:.1f} s, which is 1 h scaled "
        f"so that the plain run lasts one MTBF: every {plan['interval_s']:.2f} s, {o['yd_saves']:.0f} saves) "
        f"it runs at {ry:.0%} of the plain loop and {y / b:.0%} of baton without checkpoints, where the "
        f"model predicts {1 - predicted:.0%} (the saves cost C/T = {predicted:.1%})."
    ]
    if p2 and b2:
        text.append(
            f"At world size 2 (torchrun, 2 gloo ranks, FSDP2 on both sides) baton runs at {r2:.0%} of a "
            f"plain FSDP2 loop that makes one all-reduce a step of its own (goal 97%: "
            f"{'met' if r2 >= 0.97 else 'missed'})."
        )
    text.append(
        f"Goal at world size 1: 97% of the plain loop: {'met' if r1 >= 0.97 else 'missed'} ({r1:.0%})."
    )
    spread = max(
        (max(v) - min(v)) / median
        for v, median in (
            ([r["steps_per_s"] for r in o["runs"][side]], o[f"{side}_steps_per_s"])
            for side in ("baton", "baton_yd")
        )
    )
    text.append(
        f"The runs of one side spread by up to {spread:.0%} here, so the measured cost of the saves is "
        + (
            "within the noise; the prediction is the better estimate."
            if abs(y / b - 1 + predicted) < spread
            else "outside the noise."
        )
    )
    if r1 < 0.95:
        text.append(
            "baton loses here. At world size 1 it no longer wraps the model in FSDP2 (the same plain loop "
            "wrapped in FSDP2 on one rank runs at "
            + (f"{fs / p:.0%} of plain" if fs else "a fraction of plain")
            + "), so what is left is the loop's "
            "bookkeeping: capturing the RNG and the loader state at every boundary, hashing the batch "
            "and writing a JSON record per step. On a ~3 M-parameter model on CPU these are a visible "
            "share of a step; their cost does not grow with the model, so on a real one it shrinks."
        )
    real = (plan["save_cost_s"] / (2 * 3600)) ** 0.5
    text.append(
        f"With the real 1 h MTBF the same save cost would cost sqrt(C / 2M) = {real:.2%} of the run"
        + (
            f", and the big model's synchronous save ({big_save_s:.1f} s) {(big_save_s / 7200) ** 0.5:.1%}."
            if big_save_s
            else "."
        )
    )
    f.text = " ".join(text)
    return f
