"""Evict the trial at computed points: on a cluster through the Eviction API (what a node drain does),
locally through the local runner's pod registry (steps/lib/local_pods.py), which can also end the pod the
way a GKE Spot node shutdown, a lost VM or a Kueue preemption does (--how).

    python -m steps.evict --evidence URI --total-steps T --evictions N --seed S [--jitter]
                          --workflow NAME [--task trial] [--how evict] [--out URI]

The result (--out) is rewritten before every eviction (the eviction, with its pod, as pending: `ended`
null) and after it, and a restarted evict (its own retry) resumes from it instead of evicting again: a
pending eviction is finished on the same pod (asking again to evict a pod being evicted is one eviction),
or taken as done if that pod has already ended, so one planned point never evicts twice even when evict
itself is deleted between its request and its record. It is written on every exit, a failed one included, so verify and
compare can report what happened.

Eviction points: the first 80% of the run is cut into N equal bands; by default each point is the end
of its band (evenly spaced), with --jitter true it is drawn uniformly inside its band under the seed.
--jitter edges draws the same way, then puts the first point at step 1 and the second at a checkpoint
step (a multiple of --every-steps inside its band, drawn under the seed), the edges a soak must reach.
No point lies past 80% of the run, every point is a distinct step, and the trial must make progress in
a new attempt after each eviction before the next one, so each eviction has work behind it. Step 1 and
a point on a checkpoint step are evicted as soon as the step record is seen (polled every 10 ms): the
periodic save follows that record, so the signal can land inside the save (the trial's `preempt` record
says where it landed: `during`). A trial whose measured step rate predicts that it finishes before
evict could look again is evicted at once, before its point (the record says `early`): within
FINISH_GUARD_S seconds, or within LOOKS_AHEAD looks where one look (the evidence read, the pod listing)
takes longer, as it does on a loaded machine or a slow store. A signal that reaches a finished trainer
says nothing about it (verify calls such an eviction missed, and the drill inconclusive).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import deque
from pathlib import Path

from steps.lib.contract import BOUNDS, NODE_NAME_ANNOTATION, SERVICE_ACCOUNT_NAMESPACE, WORKFLOW_LABEL
from steps.lib.evidence import read_evidence, read_json, write_json
from steps.lib.local_pods import ENV as LOCAL_PODS_ENV
from steps.lib.local_pods import HOW, LocalPods
from trainer import env as baton_env
from trainer.bounded import ArgParser, Bound, flag_type, parse
from trainer.redaction import redact

MAX_FRACTION = 0.8
# A trainer predicted to finish within this many seconds (from its measured step rate) is evicted at
# once, before its point: the signal takes a while to reach it (evidence, the request, the forwarding),
# and one that lands after `done` says nothing about the trainer (verify calls it missed).
FINISH_GUARD_S = 1.0
# ... or within this many looks at the evidence, where a look is slower than that: on a loaded 2-core
# machine (make e2e, nodes=2) a trainer at 5 steps/s went from its point (38) to its end (48) between two
# looks, and the drill was inconclusive.
LOOKS_AHEAD = 2
MAX_LAG_S = 30.0
MAX_WAIT_S = 604_800.0  # a week: every wait of evict is far shorter than its drill's deadline


JITTER_MODES = ("false", "true", "edges")


def eviction_points(
    total_steps: int, evictions: int, seed: int = 0, jitter: bool | str = False, every_steps: int = 0
) -> list[int]:
    """The steps after which the trial is evicted: sorted, distinct, in [1, 0.8*total_steps]. `jitter`:
    False/"false", True/"true" or "edges" (the module docstring)."""
    mode = str(jitter).lower()
    if mode not in JITTER_MODES:
        raise ValueError(f"jitter must be one of {', '.join(JITTER_MODES)}, got {jitter!r}")
    if total_steps < 2:
        raise ValueError(f"total_steps must be >= 2, got {total_steps}")
    if evictions < 0:
        raise ValueError(f"evictions must be >= 0, got {evictions}")
    last = int(total_steps * MAX_FRACTION)
    if evictions > last:
        raise ValueError(
            f"{evictions} evictions do not fit in the first 80% of {total_steps} steps "
            f"(at most {last}: one distinct step each)"
        )
    edges = [i * last // evictions for i in range(evictions + 1)] if evictions else [0]
    rng = random.Random(seed)
    points = []
    for lo, hi in zip(edges, edges[1:], strict=False):
        points.append(rng.randint(lo + 1, hi) if mode != "false" else hi)
    if mode == "edges" and points:
        points[0] = 1
        if len(points) > 1 and every_steps > 0:
            lo, hi = edges[1] + 1, edges[2]
            on_checkpoint = [k for k in range(lo, hi + 1) if k % every_steps == 0]
            if on_checkpoint:
                points[1] = rng.choice(on_checkpoint)
    return points


def eviction_nodes(evictions: int, nodes: int, seed: int = 0, pinned: int | None = None) -> list[int | None]:
    """Which node of the trial's group each eviction ends: `pinned`, or drawn under the seed (its own
    stream, so the points stay what they are at one node); None for a job of one pod."""
    if nodes <= 1:
        return [None] * evictions
    if pinned is not None:
        return [pinned] * evictions
    rng = random.Random(f"evict-nodes-{seed}")
    return [rng.randrange(nodes) for _ in range(evictions)]


def bands(total_steps: int, evictions: int) -> list[tuple[int, int]]:
    last = int(total_steps * MAX_FRACTION)
    edges = [i * last // evictions for i in range(evictions + 1)]
    return [(lo + 1, hi) for lo, hi in zip(edges, edges[1:], strict=False)]


class ClusterPods:
    """The workflow's own pods, through the Kubernetes API with the pod's service account."""

    def __init__(self, workflow: str, task: str) -> None:
        from kubernetes import client, config

        config.load_incluster_config()
        self.v1 = client.CoreV1Api()
        self.client = client
        self.namespace = Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip()
        self.workflow, self.task = workflow, task

    def running(self, node: int | None = None) -> str | None:
        """A running pod of the task; with `node`, of that node of the group: Argo names a withSequence
        item's attempts `<workflow>.<task>(<i>:<i>)(<attempt>)` (generateNodeName)."""
        pods = self.v1.list_namespaced_pod(self.namespace, label_selector=f"{WORKFLOW_LABEL}={self.workflow}")
        prefix = f"{self.workflow}.{self.task}(" + ("" if node is None else f"{node}:{node})(")
        for pod in pods.items:
            name = (pod.metadata.annotations or {}).get(NODE_NAME_ANNOTATION, "")
            if name.startswith(prefix) and pod.status.phase == "Running":
                return pod.metadata.name
        return None

    def alive(self) -> bool:
        pods = self.v1.list_namespaced_pod(self.namespace, label_selector=f"{WORKFLOW_LABEL}={self.workflow}")
        return any(
            (pod.metadata.annotations or {})
            .get(NODE_NAME_ANNOTATION, "")
            .startswith(f"{self.workflow}.{self.task}(")
            and pod.status.phase in ("Pending", "Running")
            for pod in pods.items
        )

    def evict(self, name: str, how: str = "evict") -> None:
        if how != "evict":  # resolve_params refuses it before submit; a hand-made workflow lands here
            raise ValueError(f"--how {how}: only evict is possible through the Kubernetes API")
        body = self.client.V1Eviction(metadata=self.client.V1ObjectMeta(name=name, namespace=self.namespace))
        self.v1.create_namespaced_pod_eviction(name, self.namespace, body)

    def gone(self, name: str) -> bool:
        try:
            return self.v1.read_namespaced_pod(name, self.namespace).status.phase != "Running"
        except self.client.ApiException as e:
            return e.status == 404

    def ended(self, name: str) -> dict:
        """The pod's phase and its main container's exit code and reason (none once the pod is gone)."""
        try:
            pod = self.v1.read_namespaced_pod(name, self.namespace)
        except self.client.ApiException:
            return {"phase": None, "status": None, "exit_code": None, "message": "pod gone"}
        code = reason = None
        for c in pod.status.container_statuses or []:
            if c.name == "main" and c.state and c.state.terminated:
                code, reason = c.state.terminated.exit_code, c.state.terminated.reason
        return {
            "phase": pod.status.phase,
            "status": None,
            "exit_code": code,
            "message": pod.status.message or reason,
        }


def latest(records: list[dict]) -> tuple[int, int, bool]:
    """(highest step seen, attempt that reached it, whether the run is done)."""
    step, attempt, done = 0, 0, False
    for r in records:
        if r.get("event") == "step" and r["step"] >= step:
            step, attempt = r["step"], r["attempt"]
        done |= r.get("event") == "done"
    return step, attempt, done


def _step_times(records: list[dict], attempt: int) -> list[tuple[int, float]]:
    """(step, time) of each of `attempt`'s step records that carries a time, in step order."""
    return sorted(
        (r["step"], r["time"])
        for r in records
        if r.get("event") == "step"
        and r.get("attempt") == attempt
        and isinstance(r.get("time"), (int, float))
    )


def step_rate(records: list[dict], attempt: int, last: int = 20) -> float | None:
    """Steps per second of `attempt`, from the times of its newest `last` step records (None: too few)."""
    times = _step_times(records, attempt)[-last:]
    if len(times) < 3 or times[-1][1] <= times[0][1]:
        return None
    return (times[-1][0] - times[0][0]) / (times[-1][1] - times[0][1])


def early_reason(
    step: int, point: int, total_steps: int, rate: float | None, look_s: float, lag_s: float = 0.0
) -> str | None:
    """Why a trainer last seen at `step` (before its `point`), `lag_s` seconds ago, must be evicted now rather
    than at its point: it is predicted, at `rate` steps/s, to finish within FINISH_GUARD_S or within
    LOOKS_AHEAD looks of `look_s` seconds each. None: it can wait for its point (or its rate is not known)."""
    if step >= point or rate is None or rate <= 0:
        return None
    guard = max(FINISH_GUARD_S, LOOKS_AHEAD * look_s)
    if (total_steps - step) / rate - lag_s >= guard:
        return None
    why = f"{rate:.0f} steps/s: predicted to finish within {guard:.3g} s"
    if guard > FINISH_GUARD_S:
        why += f" ({LOOKS_AHEAD} looks of {look_s:.2g} s)"
    return why + (f", seen {lag_s:.2g} s late" if lag_s >= 0.05 else "")


def evidence_lag(records: list[dict], attempt: int, now: float) -> float:
    """How long ago (by the wall clock `now`) `attempt` wrote its newest step record that is seen: what the
    trainer's throttled flush to a store and the read add to evict's view. Clamped to 0 .. MAX_LAG_S, since
    a record's time is the trainer's word and clocks differ."""
    times = [t for _, t in _step_times(records, attempt)]
    return min(max(now - max(times), 0.0), MAX_LAG_S) if times else 0.0


def say(event: dict) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    baton_env.check_or_exit()
    ap = ArgParser(
        prog="python -m steps.evict",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--evidence", required=True, help="the trial's evidence folder (record lines)")
    ap.add_argument("--total-steps", type=flag_type(BOUNDS["total_steps"]), required=True)
    ap.add_argument("--evictions", type=flag_type(BOUNDS["evictions"]), required=True)
    ap.add_argument("--seed", type=flag_type(BOUNDS["seed"]), default=0)
    ap.add_argument(
        "--jitter",
        default="false",
        choices=JITTER_MODES,
        help="true: jitter points inside their bands; edges: that, with step 1 and a checkpoint step",
    )
    ap.add_argument(
        "--every-steps",
        type=flag_type(BOUNDS["every_steps"]),
        default=0,
        help="the trial's periodic checkpoint interval (checkpoint steps: --jitter edges, fast polling)",
    )
    ap.add_argument("--workflow", default="", help="the workflow's name (to find its pods)")
    ap.add_argument("--task", default="trial")
    ap.add_argument(
        "--nodes",
        type=flag_type(BOUNDS["nodes"]),
        default=1,
        help="pods in the trial's group (one node each)",
    )
    ap.add_argument(
        "--node",
        default="",
        help="with --nodes > 1: the node whose pod each eviction ends; "
        "empty: drawn under --seed at each eviction",
    )
    ap.add_argument("--out", help="where to write the evictions as JSON")
    ap.add_argument("--poll", type=flag_type(Bound(0, 60, above=True)), default=0.1)
    ap.add_argument("--timeout", type=flag_type(Bound(0, MAX_WAIT_S, above=True)), default=3600.0)
    ap.add_argument(
        "--how",
        default="evict",
        choices=HOW,
        help="how to end the trial's pod: evict (Eviction API); locally also delete, kueue, "
        "node-shutdown, lost-vm (steps/lib/local_pods.py)",
    )
    ap.add_argument(
        "--gone-timeout",
        type=flag_type(Bound(0, MAX_WAIT_S, above=True)),
        default=None,
        help="give up when the task has had no pending or running pod this long and has not finished "
        "(it failed for good: Argo waits for this step before it ends the workflow); default 90 s "
        "on a cluster, 10 s locally, where a retry's pod appears at once",
    )
    args = ap.parse_args(argv)
    try:
        points = eviction_points(args.total_steps, args.evictions, args.seed, args.jitter, args.every_steps)
        pinned = (
            int(parse(args.node, "--node (empty, or)", Bound(0, args.nodes - 1, integer=True)))
            if args.node
            else None
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    targets = eviction_nodes(len(points), args.nodes, args.seed, pinned)
    pods_dir = baton_env.text(LOCAL_PODS_ENV) or None  # the local runner sets it; a cluster does not
    pods = (
        LocalPods(pods_dir, args.workflow, args.task) if pods_dir else ClusterPods(args.workflow, args.task)
    )
    gone_timeout = args.gone_timeout if args.gone_timeout is not None else (10.0 if pods_dir else 90.0)
    print(
        f"[evict] points {points} of {args.total_steps} steps ({'local' if pods_dir else 'cluster'}, "
        f"{args.how})" + (f", nodes {targets}" if args.nodes > 1 else ""),
        file=sys.stderr,
    )
    done_evictions = _resume(args.out, points)
    result = {
        "points": points,
        "evictions": done_evictions,
        "planned": len(points),
        "how": args.how,
        **({"nodes": args.nodes, "targets": targets} if args.nodes > 1 else {}),
        "bands": bands(args.total_steps, args.evictions) if args.evictions else [],
        "problem": None,
    }
    try:
        rc = _evict_all(args, pods, points, done_evictions, gone_timeout, result, targets)
    finally:
        if args.out:
            write_json(args.out, result)
    print(f"[evict] {len(done_evictions)} of {len(points)} evictions done", file=sys.stderr)
    return rc


def _resume(out: str | None, points: list[int]) -> list[dict]:
    """The evictions an earlier run of this step recorded for the same points (its retry resumes them)."""
    if not out:
        return []
    try:
        earlier = read_json(out)
    except (OSError, ValueError):
        return []
    evs = earlier.get("evictions")
    if (
        earlier.get("points") != points
        or not isinstance(evs, list)
        or not all(isinstance(e, dict) for e in evs)
    ):
        return []  # another plan, or a file that is not this step's (read as untrusted: steps/lib/evidence.py)
    print(
        f"[evict] resuming after {len(earlier['evictions'])} evictions recorded by an earlier attempt",
        file=sys.stderr,
    )
    return list(earlier["evictions"])


def _finish_pending(args: argparse.Namespace, pods, ev: dict, deadline: float) -> None:
    """An eviction an earlier attempt of this step requested (or was about to) but did not see end."""
    name = ev["pod"]
    if not pods.gone(name):
        print(
            f"[evict] finishing the eviction of {name} (point {ev['point']}) that an earlier attempt began",
            file=sys.stderr,
        )
        try:
            pods.evict(name, ev.get("how", args.how))
        except FileNotFoundError:
            pass  # gone meanwhile
        while not pods.gone(name) and time.monotonic() < deadline:
            time.sleep(args.poll)
    ev["ended"] = pods.ended(name)


def _evict_all(
    args: argparse.Namespace,
    pods,
    points: list[int],
    done_evictions: list[dict],
    gone_timeout: float,
    result: dict,
    targets: list[int | None] | None = None,
) -> int:
    """Evict at each point not done yet; `targets`: the node of the group each one ends (None: any pod)."""
    targets = targets or [None] * len(points)
    deadline = time.monotonic() + args.timeout
    if done_evictions and "ended" in done_evictions[-1] and done_evictions[-1]["ended"] is None:  # pending
        _finish_pending(args, pods, done_evictions[-1], deadline)
        if args.out:
            write_json(args.out, result)
    last_attempt = done_evictions[-1]["attempt"] if done_evictions else -1
    seen_alive = time.monotonic()
    looks: deque[float] = deque(maxlen=5)  # what the newest looks took
    for point in points[len(done_evictions) :]:
        # At an edge (step 1, a checkpoint step) evict as soon as the record is there: before step 2, or
        # inside the save that follows a checkpoint step's record.
        edge = point == 1 or (args.every_steps and point % args.every_steps == 0)
        poll = min(args.poll, 0.01) if edge else args.poll
        while True:
            now = time.monotonic()
            if now > deadline:
                result["problem"] = f"timed out waiting for step {point}"
                print(f"error: {result['problem']}", file=sys.stderr)
                return 1
            try:
                records = read_evidence(args.evidence)
            except OSError as e:  # the store failed this once: the deadline bounds how long it may go on
                print(
                    f"[evict] reading the trial's evidence failed ({redact(str(e))}); polling again",
                    file=sys.stderr,
                )
                time.sleep(max(poll, 1.0))
                continue
            step, attempt, done = latest(records)
            if done:
                break
            if pods.alive():
                seen_alive = now
            elif now - seen_alive > gone_timeout:
                result["problem"] = (
                    f"the {args.task} has had no pod for {gone_timeout:g} s and has not finished "
                    f"(last step {step}): it failed for good"
                )
                print(
                    f"error: {result['problem']}; {len(done_evictions)} of {len(points)} evictions done",
                    file=sys.stderr,
                )
                return 1
            looks.append(time.monotonic() - now)  # what one look costs: the evidence read and the pod listing
            # Work behind each eviction: a newer attempt must have trained since the last one. A trainer
            # about to finish is evicted now rather than at its point (early_reason).
            rate = step_rate(records, attempt) if step < point else None
            early = (
                None
                if rate is None
                else early_reason(
                    step,
                    point,
                    args.total_steps,
                    rate,
                    max(looks),
                    evidence_lag(records, attempt, time.time()),
                )
            )
            if (step >= point or early) and attempt > last_attempt:
                target = targets[len(done_evictions)]
                name = pods.running(target)
                if name:
                    ev = {
                        "event": "evict",
                        "point": point,
                        "observed_step": step,
                        "attempt": attempt,
                        "pod": name,
                        **({"node": target} if target is not None else {}),
                        "how": args.how,
                        "time": time.time(),
                        "look_s": round(looks[-1], 3),
                        "ended": None,
                        **({"early": early} if early else {}),
                    }
                    done_evictions.append(ev)
                    if args.out:  # the intent first: a retry of this step finishes it, never repeats it
                        write_json(args.out, result)
                    try:
                        pods.evict(name, args.how)
                    except FileNotFoundError:  # the pod went between the look and the request
                        done_evictions.pop()
                        if args.out:
                            write_json(args.out, result)
                        continue
                    say(ev)
                    last_attempt = attempt
                    while not pods.gone(name) and time.monotonic() < deadline:
                        time.sleep(args.poll)
                    ev["ended"] = pods.ended(name)  # how the attempt ended: the verdict needs it
                    # The wait for its end (a whole preemption save) is not time without a pod: the retry's
                    # pod comes after it, and a loaded machine can take longer than the gone-timeout here.
                    seen_alive = time.monotonic()
                    if args.out:
                        write_json(args.out, result)
                    break
            time.sleep(poll)
        if done:
            print(f"[evict] the trial finished before point {point}", file=sys.stderr)
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
