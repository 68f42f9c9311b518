"""The drill on a gs:// bucket: `python workflows/equivalence.py run -p bucket=gs://...` against
fake-gcs-server on loopback, through the same steps as on file:// (train, a trial evicted twice, evict,
verify, compare, report). Every pod reaches the server through STORAGE_EMULATOR_HOST (the local runner
passes the environment on), here pointed at a logging proxy, so the test also sees every request the
whole drill made and checks that the GKE role (infra/gke) grants exactly the permissions they need.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.gcsserver import permissions_needed
from tests.helpers import PY, REPO
from tests.s3server import FaultProxy
from tests.unit.test_gcs_iam import granted_permissions

pytestmark = pytest.mark.slow


def test_the_drill_passes_on_a_gs_bucket(gcs, tmp_path):
    out = tmp_path / "drill"
    bucket = f"gs://{gcs.bucket}"
    proxy = FaultProxy(gcs.url, lifetime_s=900).start()
    try:
        # On an object store the evidence that evict watches is rewritten every BATON_EVIDENCE_FLUSH_S
        # (default 2 s): at that lag, and the tiny model's 10-25 steps/s, a resumed trial twice finished
        # before evict saw its second point (at 80 and at 160 steps). Flushed every 0.2 s here.
        p = subprocess.run(
            [
                PY,
                "workflows/equivalence.py",
                "run",
                "--out",
                str(out),
                "-p",
                f"bucket={bucket}",
                "-p",
                "prefix=gcs-drills",
                "-p",
                "total_steps=120",
                "-p",
                "evictions=2",
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=gcs.env(proxy.url, BATON_EVIDENCE_FLUSH_S="0.2"),
            timeout=900,
        )
        requests = proxy.requests()
    finally:
        proxy.stop()
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert "drill PASSED" in p.stdout and "bit-identical: " in p.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["equivalent"] is True and report["tier"] == 1 and report["max_abs_diff"] == 0.0
    s = report["steps"]
    assert (s["total"], s["distinct"], s["replayed"], s["preemptions"]) == (120, 120, 0, 2)
    assert len(s["resumed_from"]) == 2

    # Everything the steps share went through the bucket: checkpoints, evidence, evictions, report.
    keys = gcs.keys(f"{bucket}/gcs-drills")
    names = {k.split("/", 1)[1] for k in keys}
    for role in ("reference", "replay", "trial"):
        assert any(n.startswith(f"{role}/runs/") and n.endswith("/_COMMIT") for n in names), role
    assert any(n.startswith("evidence/trial/") and n.endswith(".jsonl") for n in names), names
    assert {"evictions.json", "verify.json", "report/report.json", "report/report.md"} <= names, names
    assert any("/attempts/00000003.json" in n for n in names if n.startswith("trial/")), "3 trial attempts"

    needed, _ = permissions_needed(requests)
    assert needed == granted_permissions(), (
        f"missing from the role: {sorted(needed - granted_permissions())}; "
        f"granted but unused: {sorted(granted_permissions() - needed)}"
    )
