"""Release the Kueue quota that a drill's pod groups hold: the exit handler of a drill at nodes > 1 with a queue.

    python -m steps.release --workflow NAME [--status STATUS] [--kubeconfig FILE --namespace NS]

Why. Above one node, each training role's pods are one Kueue pod group. Kueue v0.19.2 finishes a group's
Workload, and frees its quota, only when all its pods have succeeded, or when none is active and one of them
carries `kueue.x-k8s.io/retriable-in-group: "false"` (pkg/controller/jobs/pod/pod_controller.go, Finished).
A drill that fails, is stopped or passes its deadline leaves its groups admitted: the quota is held for ever,
and the pods keep Kueue's finalizer after they are deleted.

What. Every pod of the workflow that is in a Kueue pod group and a queue gets that annotation (Kueue's
webhook lets it go from retriable to not, never back), and every one still pending or running is evicted
(the Eviction API, as steps.evict does). Kueue then finishes each Workload, frees its quota and removes its
pods' finalizers. A group whose pods all succeeded is finished already; marking it again changes nothing.

Argo runs the handler after a success, a failure, a stop and a passed deadline (an onExit pod ignores the
workflow's deadline, as long as the handler has no retryStrategy: workflows/params.py, release_template),
but not after `argo terminate`: then run this by hand with your own kubeconfig. The
drill's Role grants what it needs: list pods, patch pods, create pods/eviction (templates/base/rbac.yaml).

Exit: 0 done (or nothing to do), 1 the API refused or could not be reached, after --attempts tries (the
message names the verb; a 403 is not tried again), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from steps.lib.contract import (
    POD_GROUP_LABEL,
    QUEUE_LABEL,
    RETRIABLE_IN_GROUP,
    SERVICE_ACCOUNT_NAMESPACE,
    WORKFLOW_LABEL,
)
from trainer import env as baton_env
from trainer.bounded import ArgParser, Bound, flag_type

ACTIVE = ("Pending", "Running")
REQUEST_TIMEOUT_S = 30  # each API call: the client's default is none, and an exit handler must not hang
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def _workflow_name(value: str) -> str:
    if not _DNS_NAME.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a workflow name")
    return value


def plan(pods: list[Any]) -> tuple[list[str], list[str], list[str]]:
    """(groups, pods to mark unretriable, pods to evict) among the workflow's `pods` (V1Pod objects): only
    pods in a pod group and in a queue are Kueue's to hold quota for."""
    groups: set[str] = set()
    mark, evict = [], []
    for pod in pods:
        labels = pod.metadata.labels or {}
        if not labels.get(POD_GROUP_LABEL) or not labels.get(QUEUE_LABEL):
            continue
        groups.add(labels[POD_GROUP_LABEL])
        if (pod.metadata.annotations or {}).get(RETRIABLE_IN_GROUP) != "false":
            mark.append(pod.metadata.name)
        if pod.status and pod.status.phase in ACTIVE and pod.metadata.deletion_timestamp is None:
            evict.append(pod.metadata.name)
    return sorted(groups), mark, evict


def main(argv: list[str] | None = None) -> int:
    baton_env.check_or_exit()
    ap = ArgParser(
        prog="python -m steps.release",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--workflow", required=True, type=_workflow_name, help="the drill's workflow name")
    ap.add_argument(
        "--status", default="", help="the workflow's status ({{workflow.status}}), for the record"
    )
    ap.add_argument("--kubeconfig", help="run by hand: this kubeconfig instead of the pod's service account")
    ap.add_argument("--namespace", help="with --kubeconfig: the drill's namespace (default: baton)")
    ap.add_argument(
        "--attempts",
        type=flag_type(Bound(1, 100, integer=True)),
        default=4,
        help="tries when the API refuses (not 403) or does not answer: the handler has no Argo "
        "retryStrategy (workflows/params.py, release_template, says why)",
    )
    ap.add_argument("--retry-wait", type=flag_type(Bound(0, 3600)), default=5.0, help="seconds between tries")
    args = ap.parse_args(argv)

    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        if args.kubeconfig:
            config.load_kube_config(args.kubeconfig)
            namespace = args.namespace or "baton"
        else:
            config.load_incluster_config()
            namespace = Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip()
    except (ConfigException, OSError) as e:
        where = args.kubeconfig or "the pod's service account"
        print(f"error: no Kubernetes API configuration from {where}: {e}", file=sys.stderr)
        return 1
    v1 = client.CoreV1Api()
    for attempt in range(1, args.attempts):
        rc, retriable = _release(v1, namespace, args)
        if rc == 0 or not retriable:
            return rc
        print(
            f"[release] try {attempt} of {args.attempts} failed; trying again in {args.retry_wait:g} s",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(args.retry_wait)
    return _release(v1, namespace, args)[0]


def _release(v1: Any, namespace: str, args: argparse.Namespace) -> tuple[int, bool]:
    """One try: (exit code, whether another try could help: not after a 403, which the Role decides)."""
    from kubernetes import client
    from urllib3.exceptions import HTTPError

    def refused(verb: str, e: Exception) -> tuple[int, bool]:
        status = getattr(e, "status", None)
        why = f"the API answered {status}: {getattr(e, 'reason', e)}" if status else f"no answer: {e}"
        print(
            f"error: {verb}: {why}"
            + (" (the drill's Role in templates/base/rbac.yaml grants it)" if status == 403 else ""),
            file=sys.stderr,
        )
        return 1, status != 403

    try:
        pods = v1.list_namespaced_pod(
            namespace,
            label_selector=f"{WORKFLOW_LABEL}={args.workflow},{POD_GROUP_LABEL}",
            _request_timeout=REQUEST_TIMEOUT_S,
        )
    except (client.ApiException, HTTPError) as e:
        return refused("list pods", e)
    groups, mark, evict = plan(pods.items)
    for name in mark:
        try:
            v1.patch_namespaced_pod(
                name,
                namespace,
                {"metadata": {"annotations": {RETRIABLE_IN_GROUP: "false"}}},
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        except (client.ApiException, HTTPError) as e:
            if getattr(e, "status", None) != 404:  # a pod already gone holds nothing
                return refused(f"patch pod {name}", e)
    evicted = []
    for name in evict:
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
        try:
            v1.create_namespaced_pod_eviction(name, namespace, body, _request_timeout=REQUEST_TIMEOUT_S)
            evicted.append(name)
        except (client.ApiException, HTTPError) as e:
            if getattr(e, "status", None) != 404:
                return refused(f"evict pod {name}", e)
    print(
        json.dumps(
            {
                "event": "released",
                "workflow": args.workflow,
                "status": args.status,
                "groups": groups,
                "marked": len(mark),
                "evicted": evicted,
            }
        ),
        flush=True,
    )
    return 0, False


if __name__ == "__main__":
    sys.exit(main())
