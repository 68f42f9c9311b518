"""Figure 10: start to first step at three sizes, against imports + a raw read + one steady step."""

from __future__ import annotations

from typing import Any

from bench.figure import Figure, fmt_x

GOAL = 1.5


def _load(ph: dict[str, Any]) -> str:
    """How the checkpoint was read: on a thread beside the model's build (overlapped) or alone, and how
    many times each item's bytes were copied on their way to the tensor."""
    if "items" not in ph:
        return ""
    if ph.get("prefetch_used"):
        how = (
            f"read on a thread beside the build (overlapped) in {ph.get('prefetch_read_s', 0):.2f} s, the load "
            f"waited {ph.get('prefetch_wait_s', 0):.2f} s for it"
        )
    else:
        how = "read alone, after the build"
    return (
        f"; checkpoint {how}; {ph.get('copies_per_item', 0):.1f} copies per item over {ph['items']:.0f} items"
    )


def startup_figure(r: dict[str, Any]) -> Figure:
    rows = []
    for name, v in sorted(r["sizes"].items(), key=lambda kv: kv[1]["params"]):
        ph = v.get("phases") or {}
        parts = ", ".join(
            f"{k.removesuffix('_s')} {ph[k]:.2f}"
            for k in ("startup_s", "init_s", "build_model_s", "load_verify_s", "restore_s")
            if k in ph
        )
        rows.append(
            (
                f"start: {name} ({v['params'] / 1e6:.0f} M parameters, {v['checkpoint_bytes'] / 1e9:.2f} GB "
                f"checkpoint): spawn to first step vs imports + raw read + one step (goal <= {GOAL}x)"
                + (f"; phases, s: {parts}" if parts else "")
                + _load(ph),
                f"{v['first_step_s']:.2f} s",
                f"{v['imports_s']:.2f} + {v['raw_read_s']:.2f} + {v['steady_step_s']:.2f} = {v['floor_s']:.2f} s",
                fmt_x(v["ratio"]),
            )
        )
        if "ratio_paused" in v:
            rows.append(
                (
                    f"start: {name}, against the floor with the collector paused for its imports too",
                    f"{v['first_step_s']:.2f} s",
                    f"{v['imports_paused_s']:.2f} + {v['raw_read_s']:.2f} + {v['steady_step_s']:.2f} s",
                    fmt_x(v["ratio_paused"]),
                )
            )
    what, baton, other, ratio = rows[0]
    f = Figure("10", what, baton, other, ratio, "", rows[1:])
    worst = max(r["sizes"], key=lambda n: r["sizes"][n]["ratio"])
    f.text = (
        f"A restart through the pod's PID 1 (`steps.train --nproc 1`, resuming at step {r['k']}), from its spawn "
        "to its first step record, against what no start can avoid, measured side by side in the same run: a "
        'fresh `python -c "import torch, transformers"`, one read of every byte of the committed checkpoint '
        "(page cache as warm as the restart's), and one steady step of the same run. The goal is "
        f"{GOAL}x; the worst size here is {worst} at {r['sizes'][worst]['ratio']:.2f}x. The phases come from "
        "the restart's `resume` record (medians). On one rank the checkpoint is read on a thread while the "
        "model's class is imported and the model built (trainer/checkpoint/prefetch.py): the read overlaps "
        "the build, and `load_verify` is what the load still waited for. Copies per item: 1 where the "
        "bytes are read straight into the staging tensor, 3 through `torch.load` (bytes, its storage, "
        "the target). `python -m trainer` imports with Python's cyclic garbage collector paused and freezes "
        "what its imports made before the model is allocated (trainer/collector.py); the second row of each "
        "size holds the restart to a floor whose imports were paused the same way."
    )
    return f


RANKS_GOAL = 1.3
RANKS_TEXT = (
    "The multi-rank rows (bench/restart_ranks.py): a checkpoint of world size 2 committed by a real two-rank "
    "run, then the restart through `steps.train --nproc 2` (torchrun, two gloo ranks) and through two PID 1s "
    "on two nodes of this machine (`--nnodes 2`, the round published in a folder), each from the spawn to "
    "rank 0's first step record, against a floor started the same way (`bench/restart_floor.py` under "
    "torchrun: imports, a plain process group, each rank's share of the checkpoint's bytes read once, the "
    f"model built and sharded, one step with one all-reduce). The goal is {RANKS_GOAL}x. The phases are "
    "each rank's, from the `resume` record's `rank_phases` (medians)."
)


def ranks_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    rows = []
    for kind, how in (("ranks", "2 ranks, one pod (torchrun)"), ("nodes", "2 nodes, one rank each")):
        v = r.get(kind)
        if not v:
            continue
        phases = "; ".join(
            f"rank {i}: "
            + ", ".join(
                f"{k.removesuffix('_s')} {p[k]:.2f}"
                for k in ("startup_s", "init_s", "build_s", "load_verify_s", "restore_s")
                if k in p
            )
            for i, p in enumerate(v.get("rank_phases") or [])
        )
        rows.append(
            (
                f"restart: {how}, {r['params'] / 1e6:.0f} M parameters, {r['checkpoint_bytes'] / 1e9:.2f} GB "
                f"checkpoint: spawn to first step vs the floor (goal <= {RANKS_GOAL}x)"
                + (f"; phases, s: {phases}" if phases else ""),
                f"{v['first_step_s']:.2f} s",
                f"{v['floor_s']:.2f} s",
                fmt_x(v["ratio"]),
            )
        )
    return rows
