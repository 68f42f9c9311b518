"""The drill's report: report.json, report.md and loss.png (the reference pale, the trial over it,
the evictions marked)."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

from steps.lib.contract import LOSS_PNG, REPORT_JSON, REPORT_MD
from steps.lib.evidence import put_atomic, write_local_atomic
from trainer.storage import is_local, url_to_fs
from trainer.untrusted import printable


def findings(report: dict[str, Any]) -> list[tuple[str, str]]:
    """What the drill found wrong, as (label, sentence), in the order the summary and report.md list them:
    each broken clause of the contract, compare's problem, then verify's."""
    return (
        [("contract", c) for c in report.get("contract", [])]
        + ([("problem", report["problem"])] if report.get("problem") else [])
        + [("problem", p) for p in report.get("verify_problems", [])]
    )


def losses(records: list[dict[str, Any]]) -> dict[int, float]:
    """Step -> loss of checked records (steps/lib/evidence.py: a number, or "nan"/"inf" as records.py writes them)."""
    return {r["step"]: float(r["loss"]) for r in records if r.get("event") == "step" and "loss" in r}


def plot(
    path: Path, reference: dict[int, float], trial: list[dict[str, Any]], preempt_steps: list[int]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    if reference:
        xs = sorted(reference)
        ax.plot(xs, [reference[s] for s in xs], color="#9bb8d8", linewidth=5, alpha=0.6, label="reference")
    by_attempt: dict[int, list[tuple[int, float]]] = {}
    for r in trial:
        if r.get("event") == "step" and "loss" in r:
            by_attempt.setdefault(r["attempt"], []).append((r["step"], float(r["loss"])))
    for i, (_attempt, pts) in enumerate(sorted(by_attempt.items())):
        pts.sort()
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            color="#c0392b",
            linewidth=1.2,
            label="trial (each attempt)" if i == 0 else None,
        )
    for j, s in enumerate(preempt_steps):
        ax.axvline(s, color="#555555", linestyle="--", linewidth=0.8, label="eviction" if j == 0 else None)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title("baton equivalence drill")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _equal_trajectory(traj: dict[str, Any]) -> str:
    return f"equal step by step (batch, RNG, lr) over {traj.get('steps_compared')} steps, replay equal too"


def summary(report: dict[str, Any]) -> str:
    """The drill's result in a few lines (what `run` prints, and report.md's opening): the counts, each
    preemption, the chaos, the trajectory, the problems, the verdict."""
    s = report["steps"]
    lines = [
        f"step records {s['total']} total, {s['distinct']} distinct",
        f"resumed from {s['resumed_from']}",
        f"replayed {s['replayed']} steps",
        f"preemptions {s['preemptions']}",
    ]
    for pr in report.get("preempt", []):
        lines.append(
            f"  step {pr['step']}: save {pr['save_ms']} ms, grace left {pr['grace_left_s']} s, "
            f"exit {pr['exit']}" + (f", signal during {pr['during']}" if pr.get("during") else "")
        )
    for c in report.get("comebacks", []):
        back = (
            "never came back"
            if c["back_s"] is None
            else f"back after {c['back_s']} s at step {c['back_at_step']}"
        )
        node = "" if c["node"] is None else f" (node {c['node']})"
        lines.append(f"  eviction at step {c['point']}: pod {c['pod']}{node}, exit {c['exit_code']}; {back}")
    chaos = report.get("chaos")
    if chaos:
        lines.append(f"chaos: {chaos['deleted']} of {chaos['planned']} pod deletions (seed {chaos['seed']})")
        for d in chaos["deletions"]:
            if d["trigger"] == "restore":
                where = (
                    "as it restored a checkpoint"
                    if d.get("at_step") is None
                    else f"step {d['at_step']} (it had nothing to restore)"
                )
            else:
                where = (
                    f"step {d['at_step']}" if d["trigger"] == "step" else f"{d['value']:g} s after its start"
                )
            ended = d.get("ended") or {}
            lines.append(
                f"  {d['task']} attempt {d['attempt']}: {where}, {ended.get('status')} "
                f"{ended.get('message')!r}"
                if d["outcome"] == "deleted"
                else f"  {d['task']}: missed"
            )
    for role, b in (report.get("baseline") or {}).items():
        if b["preempted_at"] or b["resumed_from"]:
            lines.append(
                f"baseline {role}: preempted at {b['preempted_at']}, resumed from {b['resumed_from']}"
            )
    traj = report.get("trajectory") or {}
    if traj:
        lines.append(f"trajectory: {traj.get('finding') or _equal_trajectory(traj)}")
    for row in report.get("components", []):
        if row["differing"]:
            lines.append(
                f"  {row['component']}: {row['differing']} of {row['entries']} differ"
                + (f", {row['l2_share']:.0%} of the L2" if row["l2_share"] else "")
            )
    lines += [f"{label}: {text}" for label, text in findings(report)]
    if report.get("verdict"):
        lines.append(f"verdict: {report['verdict']}")
    if report["tier"] == 1:
        unit = "tensors" if report.get("format", "dcp") == "dcp" else "entries (tensors and values)"
        lines.append(
            f"bit-identical: {report['tensors']} {unit}"
            if report["equivalent"]
            else f"NOT bit-identical: {report['tensors'] - report.get('equal_tensors', 0)} of {report['tensors']} "
            f"entries differ"
            + (
                f", max |diff| {report['max_abs_diff']:.3g}"
                if math.isfinite(report["max_abs_diff"])
                else " (a non-float entry among them)"
            )
        )
    else:
        ratio = report.get("diff_over_floor")
        lines.append(
            f"tier 2: L2 distance {ratio:.3g}x the floor: "
            if isinstance(ratio, (int, float))
            else f"tier 2: max |diff| {report['max_abs_diff']:.3g} against a floor of {report['floor']:.3g}: "
        )
        lines[-1] += "within the floor" if report["equivalent"] else "ABOVE the floor"
    for reason in report.get("inconclusive", []):
        lines.append(f"inconclusive: {reason}")
    lines.append(
        "drill PASSED"
        if report.get("passed")
        else "drill INCONCLUSIVE"
        if report.get("verdict", "").startswith("INCONCLUSIVE")
        else "drill FAILED"
    )
    return "\n".join(lines)


_MD_SPECIAL = re.compile(r"([\\`*_\[\](){}#|!~<>&])")


def md(value: Any) -> str:
    """A value as inert Markdown text on one line: record text is data, never markup. Control characters
    are escaped, newlines flattened, and every character that Markdown or HTML gives a meaning (`<` of
    an HTML comment, `#` of a heading, `|` of a table cell, `[` of a link) is backslash-escaped, so a
    trainer's record cannot write a forged heading or hide the report's problems."""
    text = printable(str(value)).replace("\r", " ").replace("\n", " ")
    return _MD_SPECIAL.sub(r"\\\1", text)


def markdown(report: dict[str, Any]) -> str:
    s = report["steps"]
    verdict = (
        "PASS"
        if report["passed"]
        else ("INCONCLUSIVE" if str(report.get("verdict", "")).startswith("INCONCLUSIVE") else "FAIL")
    )
    traj = report.get("trajectory") or {}
    lines = [
        f"# baton equivalence drill: {verdict}",
        "",
        *([f"- verdict: {md(report['verdict'])}"] if report.get("verdict") else []),
        f"- tier {report['tier']}: {report.get('equal_tensors', 0)}/{report['tensors']} "
        f"{'checkpoint entries' if report.get('format', 'dcp') == 'dcp' else 'entries'} equal; "
        f"max |diff| {report['max_abs_diff']:.3g}; floor {report['floor']:.3g}"
        + (
            f"; L2 {report['l2_diff']:.3g} against a floor of {report['floor_l2']:.3g} "
            f"({report['diff_over_floor']:.3g}x, slack {report['floor_slack']})"
            if report["tier"] == 2 and "l2_diff" in report
            else ""
        ),
        *([f"- trajectory: {md(traj.get('finding') or _equal_trajectory(traj))}"] if traj else []),
        *(
            [f"- the reference and its replay already differ in {report['floor_differing']} entries"]
            if report["tier"] == 1 and report.get("floor_differing")
            else []
        ),
        f"- step records {s['total']} total, {s['distinct']} distinct; replayed {s['replayed']}",
        f"- resumed from {s['resumed_from']}; preemptions {s['preemptions']}; "
        f"trial retries {md(report.get('trial_retries', '?'))}; trial {md(report.get('trial_outcome') or '?')}",
        f"- checkpoint format {md(report.get('format', 'dcp'))}"
        + (
            f"; compared: {md(', '.join(f'{k} {n}' for k, n in sorted(report['parts'].items())))}"
            if report.get("parts")
            else ""
        ),
        "",
    ]
    if report.get("components"):
        lines += [
            "| component | entries | differ | share of the L2 | differ in the floor |",
            "|---|---:|---:|---:|---:|",
        ]
        floor = {r["component"]: r["differing"] for r in report.get("floor_components", [])}
        for r in report["components"]:
            lines.append(
                f"| {md(r['component'])} | {md(r['entries'])} | {md(r['differing'])} | {r['l2_share']:.1%} | "
                f"{md(floor.get(r['component'], 0))} |"
            )
        lines.append("")
    lines += [
        "| step | save ms | grace left s | exit | outcome | signal during |",
        "|---:|---:|---:|---:|---|---|",
    ]
    for p in report["preempt"]:
        lines.append(
            f"| {md(p['step'])} | {md(p['save_ms'])} | {md(p['grace_left_s'])} | {md(p['exit'])} | {md(p['outcome'])} | "
            f"{md(p.get('during') or '-')} |"
        )
    if report.get("comebacks"):
        lines += [
            "",
            "| eviction at step | pod evicted | node | its exit | group back after s | at step |",
            "|---:|---|---:|---:|---:|---:|",
        ]
        for c in report["comebacks"]:
            lines.append(
                f"| {md(c['point'])} | {md(c['pod'])} | {'-' if c['node'] is None else md(c['node'])} | "
                f"{'-' if c['exit_code'] is None else md(c['exit_code'])} | "
                f"{'never' if c['back_s'] is None else md(c['back_s'])} | {md(c['back_at_step'] or '-')} |"
            )
    lines += [f"\n- {label}: {md(text)}" for label, text in findings(report)]
    for reason in report.get("inconclusive", []):
        lines.append(f"\n- inconclusive: {md(reason)}")
    if report.get("differing"):
        lines.append(
            f"\nDiffering entries ({report.get('differing_count', len(report['differing']))}; "
            f"the first 20, the telling ones first): {md(', '.join(map(str, report['differing'])))}"
        )
    if report.get("excluded"):
        lines.append(
            "\nLeft out at Tier 2 (kernels or timing change them): "
            + md("; ".join(map(str, report["excluded"])))
        )
    lines.append(f"\n![loss]({LOSS_PNG})\n")
    return "\n".join(lines)


def write_metrics(folder: Path, report: dict[str, Any]) -> None:
    """One number a file, for the workflow's output parameters and Prometheus gauges."""
    folder.mkdir(parents=True, exist_ok=True)
    saved = [p for p in report["preempt"] if p.get("outcome") == "saved"]
    values = {
        "trial_retries": report.get("trial_retries", -1),
        "preemptions": report["steps"]["preemptions"],
        "replayed_steps": report["steps"]["replayed"],
        "max_save_ms": max((p["save_ms"] for p in saved), default=-1),
        "min_grace_left_s": min((p["grace_left_s"] for p in report["preempt"]), default=-1),
    }
    for name, value in values.items():
        write_local_atomic(folder / name, f"{value}\n".encode())


def write_report(
    out: Path,
    report: dict[str, Any],
    reference_records: list[dict[str, Any]],
    trial_records: list[dict[str, Any]],
    copy_to: str | None = None,
) -> None:
    """Write the report so that no attempt that is killed part-way (compare is retried: its pod can be
    deleted) leaves a report.json that could be taken for the result: every file is written aside and
    renamed over, and report.json, the one readers and the drill go by, comes last, here and in the
    bucket (after report.md and loss.png there too; an object store's PUT is whole)."""
    out.mkdir(parents=True, exist_ok=True)
    # A report.json left by an earlier attempt of this pod would stand beside the new report.md: drop it first.
    (out / REPORT_JSON).unlink(missing_ok=True)
    write_local_atomic(out / REPORT_MD, markdown(report).encode())
    tmp_png = out / f".loss.{os.getpid()}.png"
    plot(tmp_png, losses(reference_records), trial_records, [p["step"] for p in report["preempt"]])
    os.replace(tmp_png, out / LOSS_PNG)
    write_metrics(out / "metrics", report)
    write_local_atomic(out / REPORT_JSON, json.dumps(report, indent=1, sort_keys=True, default=str).encode())
    if copy_to:
        fs, base = url_to_fs(copy_to)
        if is_local(fs):
            fs.makedirs(base, exist_ok=True)
        base = base.rstrip("/")
        try:
            fs.rm(f"{base}/{REPORT_JSON}")  # as above: never an old report.json beside new files
        except FileNotFoundError:
            pass
        for name in (REPORT_MD, LOSS_PNG, REPORT_JSON):
            put_atomic(fs, out / name, f"{base}/{name}")
