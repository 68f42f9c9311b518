"""steps/release.py's choice of pods: which a failed drill's exit handler marks unretriable and which it
evicts, so that Kueue frees the groups' quota (the real controller: tests/e2e/test_kueue_groups.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from steps.lib.contract import POD_GROUP_LABEL, QUEUE_LABEL, RETRIABLE_IN_GROUP
from steps.release import main, plan


def _pod(
    name: str,
    phase: str,
    group: str | None = "wf-trial",
    queue: str | None = "baton",
    marked: bool = False,
    deleting: bool = False,
) -> SimpleNamespace:
    labels = {k: v for k, v in ((POD_GROUP_LABEL, group), (QUEUE_LABEL, queue)) if v is not None}
    return SimpleNamespace(
        metadata=SimpleNamespace(
            name=name,
            labels=labels,
            annotations={RETRIABLE_IN_GROUP: "false"} if marked else {},
            deletion_timestamp="2026-12-04T21:00:00Z" if deleting else None,
        ),
        status=SimpleNamespace(phase=phase),
    )


def test_every_queued_group_pod_is_marked_and_the_active_ones_evicted():
    pods = [
        _pod("a", "Failed"),
        _pod("b", "Running"),
        _pod("c", "Pending", group="wf-reference"),
        _pod("d", "Succeeded", group="wf-reference"),
    ]
    assert plan(pods) == (["wf-reference", "wf-trial"], ["a", "b", "c", "d"], ["b", "c"])


def test_what_holds_no_quota_or_is_already_done_is_left_alone():
    pods = [
        _pod("unqueued", "Running", queue=None),
        _pod("empty-queue", "Running", queue=""),
        _pod("no-group", "Running", group=None),
        _pod("marked", "Failed", marked=True),
        _pod("going", "Running", deleting=True),
    ]
    groups, mark, evict = plan(pods)
    assert groups == ["wf-trial"] and mark == ["going"] and evict == []
    # Control: the same pods, queued and unmarked, are all acted on.
    pods = [_pod(n, "Running") for n in ("unqueued", "empty-queue", "no-group", "marked")]
    assert plan(pods)[1:] == (["unqueued", "empty-queue", "no-group", "marked"],) * 2


@pytest.mark.parametrize("name", ["", "Bad_Name", "a/b", "x" * 300, "$(id)"])
def test_a_bad_workflow_name_is_refused_before_any_request(name, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--workflow", name])
    assert e.value.code == 1 and "is not a workflow name" in capsys.readouterr().err


def test_no_api_configuration_is_a_clear_error_not_a_traceback(tmp_path, capsys):
    """Run by hand with a kubeconfig that is not there: exit 1 and a message naming it (control: a kubeconfig
    that parses but points at a closed loopback port fails on the request, also with a message)."""
    missing = tmp_path / "nope.kubeconfig"
    assert main(["--workflow", "wf", "--kubeconfig", str(missing)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no Kubernetes API configuration") and str(missing) in err
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "closed.kubeconfig"
    cfg.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    assert main(["--workflow", "wf", "--kubeconfig", str(cfg), "--attempts", "2", "--retry-wait", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: list pods: no answer:"), err
    assert "Traceback" not in err
    # It tried again (the handler has no Argo retryStrategy), and said so; with one try, it does not.
    assert err.count("error: list pods") == 2 and "try 1 of 2 failed; trying again" in err, err
    assert main(["--workflow", "wf", "--kubeconfig", str(cfg), "--attempts", "1"]) == 1
    assert capsys.readouterr().err.count("error: list pods") == 1


@pytest.mark.parametrize(
    "bad", [["--attempts", "0"], ["--retry-wait", "-1"], ["--retry-wait", "nan"], ["--retry-wait", "1e300"]]
)
def test_bad_retry_arguments_are_refused(bad, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--workflow", "wf", *bad])
    err = capsys.readouterr().err
    assert (
        e.value.code == 1 and f"argument {bad[0]}: must be" in err and len(err.strip().splitlines()) == 1
    ), err
