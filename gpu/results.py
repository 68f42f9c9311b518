"""What the GPU check reports: pytest's counts, the drill's metrics (throughput, checkpoint size, flush,
SIGTERM-to-commit headroom against each grace, restarts, the floor and the verdict) and the markdown
snippet for docs/results.md."""

from __future__ import annotations

import json
import statistics
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

DRILL_GRACE_S = 120  # what the drill's pods get; headroom is reported against each of GRACES
GRACES = (15, 120)


# ---- reading the results -----------------------------------------------------------------------------------


def junit_counts(path: Path) -> dict[str, int]:
    """tests / passed / failed / errors / skipped from pytest's --junitxml."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    c = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    return {
        "tests": c["tests"],
        "passed": c["tests"] - c["failures"] - c["errors"] - c["skipped"],
        "failed": c["failures"],
        "errors": c["errors"],
        "skipped": c["skipped"],
    }


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip().startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return out


def drill_evidence(drill_out: Path) -> dict[str, list[dict[str, Any]]]:
    """Every role's records, from the evidence the drill copied into its local bucket."""
    from steps.lib.contract import ROLES, evidence_root, local_drills

    roles: dict[str, list[dict[str, Any]]] = {}
    for drill in local_drills(drill_out / "bucket"):
        for role in ROLES:
            recs = []
            for f in sorted(Path(evidence_root(str(drill), role)).glob("*.jsonl")):
                recs += read_jsonl(f)
            if recs:
                roles.setdefault(role, []).extend(recs)
    return roles


def _stats(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    return {
        "n": len(xs),
        "median": round(statistics.median(xs), 1),
        "min": round(min(xs), 1),
        "max": round(max(xs), 1),
    }


def drill_metrics(
    report: dict[str, Any],
    evidence: dict[str, list[dict[str, Any]]],
    grace_s: float = DRILL_GRACE_S,
    graces: tuple[int, ...] = GRACES,
    warmup_steps: int = 3,
) -> dict[str, Any]:
    """The numbers worth reporting, from the drill's report.json and the records of every role."""
    out: dict[str, Any] = {}
    tps: dict[str, Any] = {}
    for role, recs in sorted(evidence.items()):
        by_attempt: dict[int, list[dict[str, Any]]] = {}
        for r in recs:
            if r.get("event") == "step" and "tokens_per_s" in r:
                by_attempt.setdefault(r.get("attempt", 0), []).append(r)
        steady = [
            r["tokens_per_s"]
            for rs in by_attempt.values()
            for r in sorted(rs, key=lambda r: r["step"])[warmup_steps:]
        ]
        tps[role] = _stats(steady)
    out["tokens_per_s"] = tps
    checkpoints = [r for recs in evidence.values() for r in recs if r.get("event") == "checkpoint"]
    sizes = [r["bytes"] for r in checkpoints if isinstance(r.get("bytes"), int)]
    out["checkpoint_bytes"] = max(sizes) if sizes else None
    out["checkpoint_gb"] = round(max(sizes) / 1e9, 3) if sizes else None
    by_reason: dict[str, list[float]] = {}
    for r in checkpoints:
        by_reason.setdefault(r.get("reason", "?"), []).append(float(r.get("save_ms", 0.0)))
    out["flush_ms"] = {
        "all": _stats([x for xs in by_reason.values() for x in xs]),
        **{reason: _stats(xs) for reason, xs in sorted(by_reason.items())},
    }
    trial = evidence.get("trial", [])
    preempts = [r for r in trial if r.get("event") == "preempt"] or list(report.get("preempt", []))
    rows = []
    for p in sorted(preempts, key=lambda r: (r.get("attempt", 0), r.get("step", 0))):
        # The record's own grace: on a torch whose torchrun has no --shutdown-timeout it is 30 s, not the pod's.
        to_commit = (
            float(p.get("grace_s", grace_s)) - float(p["grace_left_s"])
            if p.get("grace_left_s") is not None
            else None
        )
        rows.append(
            {
                "step": p.get("step"),
                "attempt": p.get("attempt"),
                "outcome": p.get("outcome"),
                "save_ms": p.get("save_ms"),
                "sigterm_to_commit_s": None if to_commit is None else round(to_commit, 2),
                **{f"headroom_{g}s": None if to_commit is None else round(g - to_commit, 2) for g in graces},
            }
        )
    out["preemptions"] = rows
    out["headroom_s"] = {
        str(g): min((r[f"headroom_{g}s"] for r in rows if r[f"headroom_{g}s"] is not None), default=None)
        for g in graces
    }
    resumes = {r.get("attempt"): r for r in trial if r.get("event") == "resume" and not r.get("fresh")}
    restarts = []
    for p in preempts:
        nxt = resumes.get((p.get("attempt") or 0) + 1)
        if nxt and "time" in nxt and "time" in p:
            restarts.append(round(nxt["time"] - p["time"], 2))
    out["restart_s"] = restarts
    for k in (
        "tier",
        "equivalent",
        "passed",
        "floor",
        "max_abs_diff",
        "tensors",
        "equal_tensors",
        "floor_differing",
        "diff_over_floor",
        "floor_l2",
        "l2_diff",
        "verify_passed",
        "verify_problems",
    ):
        out[k] = report.get(k)
    out["steps"] = report.get("steps")
    return out


# ---- the report ---------------------------------------------------------------------------------------------


def _fmt(x: Any, unit: str = "") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.3g}{unit}" if abs(x) < 1e-2 and x != 0 else f"{x:,.1f}{unit}"
    if isinstance(x, int) and not isinstance(x, bool):
        return f"{x:,}{unit}"
    return f"{x}{unit}"


def markdown(result: dict[str, Any]) -> str:
    dev = result.get("device") or {}
    pre = result.get("preflight") or {}
    model = result.get("model") or {}
    d = result.get("drill") or {}
    ph = result.get("phases", {})
    verdict = "PASSED" if result.get("passed") else "FAILED"
    lines = [
        f"### GPU check: {dev.get('name', '?')} x {dev.get('count', '?')} ({result.get('date', '?')}): {verdict}",
        "",
        f"`{result.get('command', 'python -m gpu.check')}` in {_fmt(result.get('seconds'))} s; torch "
        f"{dev.get('torch', '?')}, CUDA {dev.get('cuda', '?')}, NCCL {dev.get('nccl', '?')}, "
        f"transformers {dev.get('transformers', '?')}, {d.get('ranks', result.get('ranks', 1))} rank(s).",
        "",
        "| what | value |",
        "|---|---|",
    ]
    if pre:
        lines.append(
            f"| pre-flight (`pytest tests/gpu`) | {pre.get('passed', 0)} passed, {pre.get('failed', 0)} failed, "
            f"{pre.get('errors', 0)} errors, {pre.get('skipped', 0)} skipped "
            f"({_fmt(ph.get('preflight', {}).get('seconds'))} s) |"
        )
        for m in pre.get("measurements", []):
            if m.get("name", "").startswith("resume_"):
                lines.append(
                    f"| pre-flight {m['name']} (tiny Qwen2) | floor {_fmt(m.get('floor'))}, trial "
                    f"{_fmt(m.get('max_abs_diff'))}, bit-identical {m.get('bit_identical')} |"
                )
    if model:
        lines.append(
            f"| model | {model.get('source')}: {_fmt(model.get('parameters'))} parameters, "
            f"{model.get('dtype')}, vocab {_fmt(model.get('vocab_size'))} (tokenizer {model.get('tokenizer_size')}) |"
        )
    if d:
        lines += drill_rows(d, "drill")
    solo = result.get("solo_fast") or {}
    if solo:
        lines.append(
            f"| fast mode alone (sdpa, torch.compile, deterministic false; seq {solo.get('seq_len')}, "
            f"{solo.get('tokens_per_step')} tokens/step) | {_fmt(solo.get('tokens_per_s'))} tokens/s, "
            + (
                f"MFU {100 * solo['mfu']:.1f}% of {solo['peak_flops'] / 1e12:,.1f} TFLOP/s dense bf16 |"
                if solo.get("mfu") is not None
                else "MFU n/a (no known peak for this device) |"
            )
        )
    if result.get("drill_fast"):
        lines += drill_rows(result["drill_fast"], "fast drill")
    for name, p in ph.items():
        if not p.get("ok"):
            lines.append(f"| phase {name} | {p.get('skipped') or p.get('error') or 'failed'} |")
    return "\n".join(lines) + "\n"


def _ratio(x: Any) -> str:
    return "n/a" if x is None else f"{x:.2f}x" if x < 100 else f"{x:,.0f}x"


def drill_rows(d: dict[str, Any], label: str) -> list[str]:
    ref = (d.get("tokens_per_s") or {}).get("reference") or {}
    flush = (d.get("flush_ms") or {}).get("all") or {}
    lines: list[str] = [
        f"| {label} | {d.get('total_steps')} steps, {d.get('evictions')} evictions, seq {d.get('seq_len')}, "
        f"{d.get('tokens_per_step')} tokens/step |",
        f"| {label}: tokens/s (reference, median; 3 runs share the GPU) | {_fmt(ref.get('median'))} |",
        f"| checkpoint size | {_fmt(d.get('checkpoint_gb'))} GB |",
        f"| flush (save_ms, all saves) | median {_fmt(flush.get('median'))} ms, max {_fmt(flush.get('max'))} ms "
        f"({flush.get('n', 0)} saves) |",
    ]
    for p in d.get("preemptions", []):
        lines.append(
            f"| eviction at step {p['step']} ({p['outcome']}) | SIGTERM to commit {_fmt(p['sigterm_to_commit_s'])} s: "
            + ", ".join(f"headroom {_fmt(p[f'headroom_{g}s'])} s of {g} s" for g in GRACES)
            + " |"
        )
    if d.get("restart_s"):
        lines.append(
            f"| restart (preempt record to resumed) | {', '.join(_fmt(x) for x in d['restart_s'])} s |"
        )
    lines += [
        f"| floor (reference vs replay, max abs diff) | {_fmt(d.get('floor'))} ({d.get('floor_differing')} tensors differ) |",
        f"| trial vs reference | max abs diff {_fmt(d.get('max_abs_diff'))}; L2 distance {_fmt(d.get('l2_diff'))}, "
        f"{_ratio(d.get('diff_over_floor'))} the floor's {_fmt(d.get('floor_l2'))}; "
        f"{d.get('equal_tensors')}/{d.get('tensors')} tensors equal |",
        f"| equivalence (tier {d.get('tier')}) | {'within the floor' if d.get('equivalent') else 'NOT within the floor'}; "
        f"drill {'PASSED' if d.get('passed') else 'FAILED'} |",
    ]
    return lines


def console(result: dict[str, Any]) -> str:
    return markdown(result).replace("| what | value |\n|---|---|\n", "").replace("`", "")
