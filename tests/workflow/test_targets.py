"""`render` and `submit` for the cluster BATON_TARGET (or --target) names (workflows/targets.py): the overlay's
Workflow, at any -p nodes, with one line saying which; a bare submit without one says its pods get no bucket
credentials. Against the loopback Argo Server of tests/workflow/test_argo.py."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.overlays import CLUSTER_IMAGE, generated_templates
from tests.workflow.test_argo import CREATE, KUBECTL, argo, fixture, params_of, templates_of  # noqa: F401
from workflows import equivalence as eq
from workflows import targets

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (kubectl kustomize)")
S3_ENV = {"BATON_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"}


def _env_names(template: dict) -> set[str]:
    return {e["name"] for e in template["container"].get("env", [])}


def _render(capsys, *argv: str) -> list[dict]:
    assert eq.main(["render", *argv]) == 0
    return list(yaml.safe_load_all(capsys.readouterr().out))


@pytest.mark.parametrize("nodes", [1, 2])
def test_render_for_the_local_target_gives_every_step_the_bucket(capsys, monkeypatch, nodes):
    monkeypatch.delenv(targets.TARGET_ENV, raising=False)
    base = _render(capsys, "-p", f"nodes={nodes}")
    local = _render(capsys, "--target", "local", "-p", f"nodes={nodes}")
    assert [d["kind"] for d in local] == ["Workflow", "CronWorkflow"]
    wf, cron = local
    assert (
        wf["spec"] == cron["spec"]["workflowSpec"] and wf["metadata"]["generateName"] == "baton-equivalence-"
    )
    for name, t in templates_of(wf).items():
        if "container" in t:
            assert S3_ENV <= _env_names(t), name
    assert (params_of(wf)["bucket"], params_of(wf)["image"], params_of(wf)["store_port"]) == (
        "s3://baton",
        "baton:local",
        "0",
    )
    # The drill's shape is the one -p nodes asks for, as the base has it.
    assert [t["name"] for t in templates_of(wf).values()] == [
        t["name"] for t in templates_of(base[0]).values()
    ]
    assert params_of(wf)["nodes"] == str(nodes)
    # The control: the base gives no step the bucket's credentials.
    assert not any(S3_ENV & _env_names(t) for t in templates_of(base[0]).values() if "container" in t)


def test_the_environment_names_the_target_as_the_flag_does(capsys, monkeypatch):
    monkeypatch.setenv(targets.TARGET_ENV, "local")
    by_env = _render(capsys)
    monkeypatch.delenv(targets.TARGET_ENV)
    assert by_env == _render(capsys, "--target", "local")
    assert by_env != _render(capsys)


@pytest.mark.parametrize(
    ("env", "argv", "message"),
    [
        ("nope", [], "BATON_TARGET 'nope' is not a target"),
        ("", ["--target", "../../etc"], "--target '../../etc' is not a target"),
        ("", ["--target", "base"], "--target 'base' is not a target"),
    ],
)
def test_a_name_that_is_no_overlay_is_one_line_naming_where_it_came_from(monkeypatch, env, argv, message):
    monkeypatch.setenv(targets.TARGET_ENV, env)
    with pytest.raises(SystemExit) as ei:
        eq.main(["render", *argv])
    assert str(ei.value.code).startswith(
        f"error: {message}"
    ) and "gke, gke-kueue, kind, local, local-kueue" in str(ei.value.code)


def test_a_gke_target_without_make_gke_ups_values_says_what_writes_them(monkeypatch, tmp_path):
    copy = tmp_path / "templates"
    import shutil

    shutil.copytree(generated_templates(), copy)
    shutil.rmtree(copy / "overlays" / "gke" / "generated-by-make-gke-up")
    monkeypatch.setattr(targets, "TEMPLATES", copy)
    monkeypatch.setattr(targets, "OVERLAYS", copy / "overlays")
    monkeypatch.setattr(targets, "REPO", tmp_path)
    for target in ("gke", "gke-kueue"):
        with pytest.raises(
            SystemExit, match=r"templates/overlays/gke/generated-by-make-gke-up is missing .*make gke-up"
        ):
            eq.rendered_for(target)


def test_a_gke_target_renders_the_clusters_values(monkeypatch):
    monkeypatch.setattr(targets, "TEMPLATES", generated_templates())
    monkeypatch.setattr(targets, "OVERLAYS", generated_templates() / "overlays")
    wf, cron = eq.rendered_for("gke", 2)
    assert params_of(wf)["image"] == CLUSTER_IMAGE and params_of(wf)["grace"] == "15"
    assert templates_of(wf)["trial"]["nodeSelector"] == {"baton.dev/pool": "gpu-spot"}
    assert params_of(wf)["nodes"] == "2"


def test_a_bare_submit_says_which_target_and_sends_its_workflow(argo, capsys, monkeypatch):  # noqa: F811
    argo.routes[("POST", CREATE)] = (200, fixture("created.json"))
    monkeypatch.setenv(targets.TARGET_ENV, "local")
    assert eq.main(["submit", "-p", "evictions=2"]) == 0
    assert "target: local (BATON_TARGET): templates/overlays/local" in capsys.readouterr().err
    wf = json.loads(argo.requests[-1]["body"])["workflow"]
    assert S3_ENV <= _env_names(templates_of(wf)["train"]) and params_of(wf)["evictions"] == "2"
    assert params_of(wf)["bucket"] == "s3://baton"
    # The control: unset, the base Workflow goes, and the line says its steps get no bucket credentials.
    monkeypatch.delenv(targets.TARGET_ENV)
    assert eq.main(["submit"]) == 0
    assert "target: none (BATON_TARGET unset)" in capsys.readouterr().err
    wf = json.loads(argo.requests[-1]["body"])["workflow"]
    assert not S3_ENV & _env_names(templates_of(wf)["train"])


def test_a_target_and_a_file_are_refused_together(argo, tmp_path):  # noqa: F811
    path = tmp_path / "wf.yaml"
    path.write_text(yaml.safe_dump(eq.rendered()[0]))
    with pytest.raises(SystemExit, match="--target and --from-file: give one"):
        eq.main(["submit", "--from-file", str(path), "--target", "local"])
    assert argo.requests == []
