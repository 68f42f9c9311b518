"""The drill's pods on GKE act, through Workload Identity, as a Google service account whose only storage
grant is a custom role on the bucket (infra/gke/main.tf). Its permissions must be exactly what the code
calls: the requests of every kind of store access (checkpoint save, commit, claims, listing, verify,
load, retention, DCP's rename, the evidence, the report copy, the compare step's glob) are logged by a
loopback proxy in front of fake-gcs-server, mapped to Cloud Storage's documented permission per
JSON-API method (tests/gcsserver.py), and compared with the role. A new kind of call the role lacks,
or a permission the role grants that nothing uses, fails here. The drill test on gs://
(tests/workflow/test_drill_gcs.py) makes the same comparison over a whole drill.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.gcsserver import permissions_needed
from tests.helpers import REPO
from tests.s3server import FaultProxy

GKE = REPO / "infra" / "gke"
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _tf() -> dict:
    import hcl2

    opts = hcl2.SerializationOptions(with_comments=False, explicit_blocks=False, strip_string_quotes=True)
    merged: dict = {}
    for path in sorted(GKE.glob("*.tf")):
        with open(path) as f:
            for key, value in hcl2.load(f, serialization_options=opts).items():
                merged.setdefault(key, []).extend(value if isinstance(value, list) else [value])
    return merged


def _resources(tf: dict, rtype: str) -> dict[str, dict]:
    return {
        name: body
        for entry in tf.get("resource", [])
        for t, named in entry.items()
        if t == rtype
        for name, body in named.items()
    }


def granted_permissions() -> set[str]:
    """The permissions the drill's service account holds on the bucket, read from the Terraform."""
    tf = _tf()
    grants = _resources(tf, "google_storage_bucket_iam_member")
    roles = _resources(tf, "google_project_iam_custom_role")
    # drill_objects: the drill's pods; ui_reader: the Argo UI's read-only account (its own test, test_infra.py)
    assert sorted(grants) == ["drill_objects", "ui_reader"], grants
    assert grants["ui_reader"]["role"] == "roles/storage.objectViewer"
    grant = grants["drill_objects"]
    assert grant["member"] == "serviceAccount:${google_service_account.drill.email}"
    assert grant["bucket"] == "${google_storage_bucket.drills.name}"
    name = grant["role"].removeprefix("${google_project_iam_custom_role.").removesuffix(".id}")
    assert name in roles, f"the bucket grant must be the custom role, not {grant['role']}"
    return set(roles[name]["permissions"])


def test_the_drill_role_is_bound_on_the_bucket_only_and_never_project_wide():
    tf = _tf()
    for rtype in (
        "google_storage_bucket_iam_member",
        "google_storage_bucket_iam_binding",
        "google_project_iam_member",
    ):
        # No predefined storage role, but the UI reader's read-only one, on the bucket
        assert all(
            not r["role"].startswith("roles/storage.")
            or (name, r["role"]) == ("ui_reader", "roles/storage.objectViewer")
            and rtype == "google_storage_bucket_iam_member"
            for name, r in _resources(tf, rtype).items()
        ), rtype
    for member in _resources(tf, "google_project_iam_member").values():
        assert "drill" not in member["member"] and "storage" not in member["role"], member
    assert granted_permissions()


def _every_kind_of_store_access(root: str, tmp_path: Path) -> None:
    from steps.compare import final_checkpoint
    from steps.lib.evidence import read_evidence, read_json, write_json
    from steps.train import Evidence
    from trainer.checkpoint.resolve import resolve_and_load
    from trainer.checkpoint.store import Store
    from trainer.storage import url_to_fs

    store = Store(root, "run")
    attempt = store.claim_attempt({})
    for step, loss in ((1, 3.0), (2, 1.0), (3, 2.0), (4, 4.0)):
        store.save(
            step,
            {"w": torch.full((4,), float(step))},
            {"metrics": {"loss": loss}, "fingerprint": "f"},
            attempt,
            read_back=step != 4,
        )
        store.retain(1, step, "loss")
    store.attempt_start_times()
    got = resolve_and_load(Store(root, "run"), "f", lambda s, m: {"w": torch.zeros(4)}, lambda s, r: None)
    assert got is not None and got[0] == 4
    assert final_checkpoint(f"{root}")[1]["step"] == 4

    evidence = Evidence(f"{root}/evidence/trial", "pod-1")
    evidence.add('{"event": "step", "step": 1, "attempt": 1}')
    evidence.flush()
    evidence.add('{"event": "step", "step": 2, "attempt": 1}')
    evidence.flush()  # an overwrite of the same object
    assert [r["step"] for r in read_evidence(f"{root}/evidence/trial")] == [1, 2]
    write_json(f"{root}/verify.json", {"ok": True})
    assert read_json(f"{root}/verify.json") == {"ok": True}
    (tmp_path / "report.md").write_text("report")
    fs, base = url_to_fs(f"{root}/report")
    fs.put_file(str(tmp_path / "report.md"), f"{base}/report.md")  # what steps.lib.report's copy does


def test_the_drill_role_grants_exactly_what_the_store_calls(gcs, monkeypatch, tmp_path):
    proxy = FaultProxy(gcs.url).start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        _every_kind_of_store_access(gcs.new_prefix("iam"), tmp_path)
        needed, methods = permissions_needed(proxy.requests())
    finally:
        proxy.stop()
    assert {
        "objects.insert",
        "objects.get",
        "objects.list",
        "objects.delete",
        "objects.rewrite",
    } <= methods, methods
    assert "objects.move" not in methods, "moveTo needs storage.objects.move: the store copies and deletes"
    assert needed == granted_permissions(), (
        f"missing from the role: {sorted(needed - granted_permissions())}; "
        f"granted but unused: {sorted(granted_permissions() - needed)}"
    )
