"""The local runner: a rendered Argo Workflow run on this machine, with no cluster (``run_workflow``).

- ``runner.py`` runs the plan: pods, retries, deadlines, the pod registry, signals (its docstring lists
  what is supported and how Argo's records are reproduced);
- ``spec.py`` reads the rendered Workflow: the checks that refuse what is not supported, the plan, and the
  substitution of parameters into argv, env, paths and the grace;
- ``argo_expr.py`` evaluates ``retryStrategy.expression``;
- ``chaos.py`` plans the random pod deletions of ``run -p chaos=N``;
- ``pod_init.py`` is a local pod's PID 1, run by path (standard library only).
"""

from workflows.local.chaos import Chaos
from workflows.local.runner import NodeResult, RunResult, run_workflow
from workflows.local.spec import ACCEPTED_WITHOUT_EFFECT, UnsupportedSpec

__all__ = ["ACCEPTED_WITHOUT_EFFECT", "Chaos", "NodeResult", "RunResult", "UnsupportedSpec", "run_workflow"]
