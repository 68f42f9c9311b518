"""The rendered drill: valid against Argo's CRDs, kept current in templates/, one grace everywhere,
the retry strategy of DESIGN.md, and CLI parameter checks."""

from __future__ import annotations

import json
import subprocess

import jsonschema
import pytest
import yaml

from infra.local.pins import ARGO_VERSION
from tests.crd import FORWARD, validate
from tests.helpers import PY, REPO, base_env
from workflows import equivalence as eq


def _templates(obj):
    spec = obj["spec"].get("workflowSpec", obj["spec"])
    return {t["name"]: t for t in spec["templates"]}


@pytest.mark.parametrize("version", [FORWARD, ARGO_VERSION])
@pytest.mark.parametrize("index", [0, 1], ids=["Workflow", "CronWorkflow"])
def test_rendered_objects_validate_against_argo_crds(index, version):
    validate(eq.rendered()[index], version)


@pytest.mark.parametrize("version", [FORWARD, ARGO_VERSION])
def test_the_crd_check_rejects_unknown_fields_and_bad_types(version):
    wf = eq.rendered()[0]
    bad = json.loads(json.dumps(wf))
    bad["spec"]["templates"][0]["container"]["argz"] = ["typo"]
    with pytest.raises(jsonschema.ValidationError):
        validate(bad, version)
    bad = json.loads(json.dumps(wf))
    bad["spec"]["templates"][1]["retryStrategy"]["limit"] = [3]
    with pytest.raises(jsonschema.ValidationError):
        validate(bad, version)


def test_the_two_releases_schemas_differ_where_argo_changed():
    """v3.7 still has a CronWorkflow's singular `schedule`, which v4 removed (shared facts, ARGO-FACTS): the
    same object passes one release's schema and fails the other's, so each test above reads its own."""
    cron = json.loads(json.dumps(eq.rendered()[1]))
    cron["spec"]["schedule"] = cron["spec"].pop("schedules")[0]
    validate(cron, ARGO_VERSION)
    with pytest.raises(jsonschema.ValidationError):
        validate(cron, FORWARD)


def test_templates_folder_matches_a_fresh_render(tmp_path):
    written = eq.write_templates(tmp_path)
    assert sorted(str(p.relative_to(tmp_path)) for p in written) == sorted(eq.TEMPLATE_FILES.values())
    for path in written:
        rel = path.relative_to(tmp_path)
        committed = REPO / "templates" / rel
        assert committed.exists(), f"templates/{rel} missing: run `make templates`"
        assert committed.read_text() == path.read_text(), f"templates/{rel} is stale: run `make templates`"
    # The kustomize base lists the CronWorkflow where write-templates puts it.
    base = yaml.safe_load((REPO / "templates" / "base" / "kustomization.yaml").read_text())
    assert "cronworkflow-equivalence.yaml" in base["resources"]
    assert eq.TEMPLATE_FILES["CronWorkflow"] == "base/cronworkflow-equivalence.yaml"


def test_render_prints_every_object_as_a_yaml_stream():
    p = subprocess.run(
        [PY, "workflows/equivalence.py", "render"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=base_env(),
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    docs = list(yaml.safe_load_all(p.stdout))
    assert [d["kind"] for d in docs] == ["Workflow", "CronWorkflow"]
    for d in docs:
        validate(d)


def test_grace_agrees_in_pod_spec_patch_env_and_torchrun_shutdown_timeout():
    for obj in eq.rendered():
        t = _templates(obj)
        for name in ("train", "trial"):
            patch = json.loads(t[name]["podSpecPatch"].replace("{{workflow.parameters.grace}}", "17"))
            env = {e["name"]: e.get("value") for e in t[name]["container"]["env"]}
            args = t[name]["container"]["args"]
            timeout = args[args.index("--shutdown-timeout") + 1]
            assert patch == {"terminationGracePeriodSeconds": 17}
            assert env["BATON_GRACE"] == timeout == "{{workflow.parameters.grace}}"


def test_every_step_that_can_meet_an_eviction_has_a_retry_strategy():
    for obj in eq.rendered():
        t = _templates(obj)
        for name in ("train", "trial"):  # reference, reference-replay and trial: all on the Spot pool on GKE
            rs = t[name]["retryStrategy"]
            assert rs == {
                "retryPolicy": "Always",
                "limit": "{{workflow.parameters.retry_limit}}",
                "expression": eq.RETRY_EXPRESSION,
            }
        assert eq.RETRY_EXPRESSION == (
            "asInt(lastRetry.exitCode) == 75 || asInt(lastRetry.exitCode) == 143 || "
            "(asInt(lastRetry.exitCode) == 137 && !(lastRetry.message matches 'OOMKilled')) || "
            "lastRetry.message matches 'imminent node shutdown|pod deleted|"
            "neither main nor wait container completed successfully|The node was low on resource'"
        )
        for name in ("evict", "verify", "compare"):  # idempotent helpers (evict resumes from its own record)
            assert t[name]["retryStrategy"]["expression"] == eq.HELPER_RETRY_EXPRESSION
        # No retried template carries metrics (Argo evaluates them on every attempt, outputs or not): compare's
        # numbers are published by `publish`, a suspend template of duration 0 (no pod, no retry), as inputs.
        for name, tmpl in t.items():
            assert not ("retryStrategy" in tmpl and tmpl.get("metrics")), name
        assert "suspend" in t["publish"] and "retryStrategy" not in t["publish"]


def test_trial_and_evict_continue_on_failure_so_that_the_report_is_still_written():
    tasks = {task["name"]: task for task in _templates(eq.rendered()[0])["drill"]["dag"]["tasks"]}
    for name in ("reference", "reference-replay", "trial", "evict"):  # compare names the role that broke
        assert tasks[name]["continueOn"] == {"failed": True, "error": True}, name
    assert not any("continueOn" in tasks[n] for n in ("verify", "compare"))


def test_cron_workflow_is_scheduled_and_never_overlaps():
    cron = eq.rendered()[1]["spec"]
    assert cron["schedules"] and cron["concurrencyPolicy"] == "Forbid"
    assert cron["successfulJobsHistoryLimit"] >= 1 and cron["failedJobsHistoryLimit"] >= 1
    assert cron["workflowSpec"]["entrypoint"] == "drill"


def test_dag_shape():
    dag = _templates(eq.rendered()[0])["drill"]["dag"]["tasks"]
    deps = {t["name"]: set(t.get("dependencies", [])) for t in dag}
    assert deps == {
        "reference": set(),
        "reference-replay": set(),
        "trial": set(),
        "evict": set(),
        "verify": {"trial", "evict"},
        "compare": {"reference", "reference-replay", "verify"},
        "publish": {"compare"},
    }


@pytest.mark.parametrize("nodes", [1, 2])
def test_the_dags_tasks_are_the_one_list_the_command_line_reads(nodes):
    """steps/lib/contract.py's TASKS, in the DAG's order, are the tasks with a pod (`run -p chaos` and
    `-p unschedulable` choose among them), and TRAINING_TASKS those that run the trainer."""
    from steps.lib.contract import TASKS, TRAINING_TASKS

    templates = _templates(eq.rendered(nodes)[0])
    dag = templates["drill"]["dag"]["tasks"]
    assert [t["name"] for t in dag if "container" in templates[t["template"]]] == list(TASKS)
    assert [t["name"] for t in dag if t["template"] in ("train", "trial")] == list(TRAINING_TASKS)


def test_no_step_runs_a_shell():
    for t in _templates(eq.rendered()[0]).values():
        if "container" in t:
            assert t["container"]["command"] == ["python"]
            assert "-c" not in t["container"]["args"]


@pytest.mark.parametrize(
    "params, message",
    [
        ({"evictions": "x"}, "evictions must be an integer >= 0 and <= 10000, got 'x'"),
        ({"eviction": "drain"}, "eviction must be one of evict, delete"),
        ({"evictions": "5", "retry_limit": "5"}, "must exceed evictions"),
        ({"evictions": "50", "total_steps": "40"}, "do not fit"),
        ({"ranks": "0"}, "ranks must be an integer >= 1 and <= 1024"),
        ({"grace": "0"}, "grace must be an integer >= 1 and <= 86400"),
        ({"grace": "1e300"}, "grace must be an integer >= 1 and <= 86400"),
        ({"grace": "99999999999"}, "grace must be an integer >= 1 and <= 86400"),
        ({"total_steps": "9" * 5000}, "total_steps must be an integer >= 2 and <= 10000000, got '9999"),
        ({"seed": "9" * 5000}, "seed must be an integer >= 0 and <= 9223372036854775807"),
        ({"store_port": "70000"}, "store_port must be an integer >= 0 and <= 65535"),
        ({"deadline": "1" + "0" * 30}, "deadline must be an integer >= 0 and <= 315360000"),
        ({"dropout": "abc"}, r"dropout must be a finite number >= 0 and < 1"),
        ({"dropout": "1.5"}, r"dropout must be a finite number >= 0 and < 1"),
        ({"dropout": "nan"}, r"dropout must be a finite number >= 0 and < 1"),
        ({"dropout": "1"}, r"dropout must be a finite number >= 0 and < 1"),
        ({"disable_sigterm_handler": "yes"}, "must be true, false, 1 or 0"),
        ({"nodes": "0"}, "nodes must be an integer >= 1 and <= 1024"),
        ({"nodes": "²"}, "nodes must be an integer >= 1"),
        ({"nodes": "2", "evict_node": "2"}, r"evict_node must be an integer >= 0 and <= 1"),
        ({"nodes": "2", "evict_node": "¹"}, "evict_node must be an integer >= 0 and <= 1"),
        ({"nodes": "2", "rendezvous_timeout": "0"}, "rendezvous_timeout must be an integer >= 1"),
        ({"nodes": "2", "rendezvous_timeout": "10m"}, "rendezvous_timeout must be an integer >= 1"),
        ({"nodes": "2", "rendezvous_timeout": "-5"}, "rendezvous_timeout must be an integer >= 1"),
    ],
)
def test_bad_parameters_are_refused_before_anything_runs(params, message):
    with pytest.raises(SystemExit, match=message):
        eq.resolve_params(params)


def test_local_only_eviction_modes_are_refused_for_a_cluster():
    assert eq.resolve_params({"eviction": "kueue"})["eviction"] == "kueue"
    with pytest.raises(SystemExit, match="eviction must be one of evict on a cluster"):
        eq.resolve_params({"eviction": "kueue"}, cluster=True)


def test_retry_limit_follows_evictions():
    assert eq.resolve_params({"evictions": "20"})["retry_limit"] == "25"
    with pytest.raises(SystemExit, match="unknown parameter"):
        eq.parse_params(["evictionz=3"])


@pytest.mark.parametrize(
    "given, pod_reads", [("true", "1"), ("TRUE", "1"), ("1", "1"), ("false", "0"), ("0", "0")]
)
def test_a_negative_control_asked_for_is_what_the_pod_reads(given, pod_reads):
    """`true` used to reach the pod as `true`, which only `1` switched on: the control ran as a normal
    trial and passed. The value is normalised before render, run and submit."""
    params = eq.resolve_params({"disable_sigterm_handler": given})
    assert params["disable_sigterm_handler"] == pod_reads
    rendered = eq.with_params(eq.rendered()[0], params)
    (prm,) = [
        p for p in rendered["spec"]["arguments"]["parameters"] if p["name"] == "disable_sigterm_handler"
    ]
    assert prm["value"] == pod_reads


def test_the_render_command_refuses_a_bad_parameter_with_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        eq.main(["render", "-p", "ranks=0"])
    assert "ranks must be an integer >= 1 and <= 1024, got '0'" in str(e.value)


def test_a_file_rendered_for_one_shape_refuses_another_nodes_at_submit():
    from workflows.argo import ArgoError, apply_parameters

    wf = eq.rendered(1)[0]
    with pytest.raises(ArgoError, match="rendered for 1 node"):
        apply_parameters(wf, {"nodes": "2"})
    two = eq.rendered(2)[0]
    assert apply_parameters(two, {"nodes": "2", "evict_node": "1"})["evict_node"] == "1"  # the control


@pytest.mark.parametrize("version", [FORWARD, ARGO_VERSION])
@pytest.mark.parametrize("index", [0, 1])
def test_the_two_node_rendering_validates_against_argo_crds(index, version):
    validate(eq.rendered(2)[index], version)


@pytest.mark.parametrize("nodes", [1, 2])
def test_one_parameter_sets_every_training_pods_rendezvous_timeout(nodes):
    """`rendezvous_timeout` reaches each training step's `steps.train --rendezvous-timeout` (which sets both the
    wait for node 0's round file and torchrun's static rendezvous) above one node; the control: at one node no
    step carries the flag, and the containers are what they were."""
    wf = eq.rendered(nodes)[0]
    templates = _templates(wf)
    wanted = ["--rendezvous-timeout", "{{workflow.parameters.rendezvous_timeout}}"]
    for name in ("train", "trial"):
        args = templates[name]["container"]["args"]
        pairs = [args[i : i + 2] for i in range(len(args) - 1)]
        assert (wanted in pairs) == (nodes > 1), (name, args)
    for name in ("evict", "verify", "compare"):
        assert "--rendezvous-timeout" not in templates[name]["container"]["args"]
    (prm,) = [p for p in wf["spec"]["arguments"]["parameters"] if p["name"] == "rendezvous_timeout"]
    assert prm["value"] == eq.PARAMETERS["rendezvous_timeout"][0] == "1200"
    params = eq.resolve_params({"nodes": str(nodes), "rendezvous_timeout": "1500"})
    (prm,) = [
        p
        for p in eq.with_params(wf, params)["spec"]["arguments"]["parameters"]
        if p["name"] == "rendezvous_timeout"
    ]
    assert prm["value"] == "1500"


def test_steps_train_takes_the_rendered_rendezvous_timeout_for_both_waits():
    """What the parameter becomes in the pod: steps.train's --rendezvous-timeout, which is also torchrun's
    static rendezvous `timeout` (its own default would be 600 s)."""
    from steps import train

    nodes = train.Nodes(2, 1, "10.0.0.1", 29500, "r1", timeout_s=float("1200"))
    assert "--rdzv-conf=timeout=1200" in nodes.torchrun_args()
    assert "--rdzv-conf=timeout=600" in train.Nodes(2, 1, "10.0.0.1", 29500, "r1").torchrun_args()  # control
