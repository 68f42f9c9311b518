"""The drill's report: report.json, report.md and loss.png (the reference pale, the trial over it,
the evictions marked)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from steps.evidence import put_atomic, write_local_atomic
from trainer.storage import is_local, url_to_fs


def losses(records: list[dict[str, Any]]) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records if r.get("event") == "step"}


def plot(path: Path, reference: dict[int, float], trial: list[dict[str, Any]], preempt_steps: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    if reference:
        xs = sorted(reference)
        ax.plot(xs, [reference[s] for s in xs], color="#9bb8d8", linewidth=5, alpha=0.6, label="reference")
    by_attempt: dict[int, list[tuple[int, float]]] = {}
    for r in trial:
        if r.get("event") == "step":
            by_attempt.setdefault(r["attempt"], []).append((r["step"], r["loss"]))
    for i, (_attempt, pts) in enumerate(sorted(by_attempt.items())):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color="#c0392b", linewidth=1.2,
                label="trial (each attempt)" if i == 0 else None)
    for j, s in enumerate(preempt_steps):
        ax.axvline(s, color="#555555", linestyle="--", linewidth=0.8, label="eviction" if j == 0 else None)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title("baton equivalence drill")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def markdown(report: dict[str, Any]) -> str:
    s = report["steps"]
    verdict = "PASS" if report["passed"] else (
        "INCONCLUSIVE" if str(report.get("verdict", "")).startswith("INCONCLUSIVE") else "FAIL")
    lines = [f"# baton equivalence drill: {verdict}", "",
             f"- tier {report['tier']}: {report.get('equal_tensors', 0)}/{report['tensors']} "
             f"{'model and optimizer tensors' if report.get('format', 'dcp') == 'dcp' else 'entries'} equal; "
             f"max |diff| {report['max_abs_diff']:.3g}; floor {report['floor']:.3g}",
             f"- step records {s['total']} total, {s['distinct']} distinct; replayed {s['replayed']}",
             f"- resumed from {s['resumed_from']}; preemptions {s['preemptions']}; "
             f"trial retries {report.get('trial_retries', '?')}; trial {report.get('trial_outcome') or '?'}",
             f"- checkpoint format {report.get('format', 'dcp')}"
             + (f"; compared: {', '.join(f'{k} {n}' for k, n in sorted(report['parts'].items()))}"
                if report.get("parts") else ""),
             *([f"- verdict: {report['verdict']}"] if report.get("verdict") else []), "",
             "| step | save ms | grace left s | exit | outcome | signal during |", "|---:|---:|---:|---:|---|---|"]
    for p in report["preempt"]:
        lines.append(f"| {p['step']} | {p['save_ms']} | {p['grace_left_s']} | {p['exit']} | {p['outcome']} | "
                     f"{p.get('during') or '-'} |")
    if report.get("problem"):
        lines.append(f"\n- problem: {report['problem']}")
    for problem in report.get("verify_problems", []):
        lines.append(f"\n- problem: {problem}")
    for reason in report.get("inconclusive", []):
        lines.append(f"\n- inconclusive: {reason}")
    if report.get("differing"):
        lines.append(f"\nDiffering tensors (first 20): {', '.join(report['differing'])}")
    lines.append("\n![loss](loss.png)\n")
    return "\n".join(lines)


def write_metrics(folder: Path, report: dict[str, Any]) -> None:
    """One number a file, for the workflow's output parameters and Prometheus gauges."""
    folder.mkdir(parents=True, exist_ok=True)
    saved = [p for p in report["preempt"] if p.get("outcome") == "saved"]
    values = {"trial_retries": report.get("trial_retries", -1),
              "preemptions": report["steps"]["preemptions"],
              "replayed_steps": report["steps"]["replayed"],
              "max_save_ms": max((p["save_ms"] for p in saved), default=-1),
              "min_grace_left_s": min((p["grace_left_s"] for p in report["preempt"]), default=-1)}
    for name, value in values.items():
        write_local_atomic(folder / name, f"{value}\n".encode())


def write_report(out: Path, report: dict[str, Any], reference_records: list[dict[str, Any]],
                 trial_records: list[dict[str, Any]], copy_to: str | None = None) -> None:
    """Write the report so that no attempt that is killed part-way (compare is retried: its pod can be
    deleted) leaves a report.json that could be taken for the result: every file is written aside and
    renamed over, and report.json, the one readers and the drill go by, comes last, here and in the
    bucket (after report.md and loss.png there too; an object store's PUT is whole)."""
    out.mkdir(parents=True, exist_ok=True)
    # A report.json left by an earlier attempt of this pod would stand beside the new report.md: drop it first.
    (out / "report.json").unlink(missing_ok=True)
    write_local_atomic(out / "report.md", markdown(report).encode())
    tmp_png = out / f".loss.{os.getpid()}.png"
    plot(tmp_png, losses(reference_records), trial_records, [p["step"] for p in report["preempt"]])
    os.replace(tmp_png, out / "loss.png")
    write_metrics(out / "metrics", report)
    write_local_atomic(out / "report.json", json.dumps(report, indent=1, sort_keys=True, default=str).encode())
    if copy_to:
        fs, base = url_to_fs(copy_to)
        if is_local(fs):
            fs.makedirs(base, exist_ok=True)
        base = base.rstrip("/")
        try:
            fs.rm(f"{base}/report.json")  # as above: never an old report.json beside new files
        except FileNotFoundError:
            pass
        for name in ("report.md", "loss.png", "report.json"):
            put_atomic(fs, out / name, f"{base}/{name}")
