"""Weights fetched once, never from the hub, known by their manifest (trainer/weights.py).

Through s3:// (moto) and gs:// (fake-gcs-server) on loopback: the same weights in a bucket and in a
local folder (an image's) are one run; a run from a bucket copies them once per machine and resumes
from a run of the local twin; and a bucket's manifest is untrusted: a path, a pickle, a file that does
not match, or malformed JSON is refused with one line, with controls that show each attack lands
without its check.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

import trainer.weights as weights
from tests.helpers import PY, REPO, records, run_and_sigterm, trainer_cmd
from trainer.storage import url_to_fs
from trainer.weights import MANIFEST, WeightsRefused, identity, materialize, stage, write_manifest

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@pytest.fixture
def model(tiny_model, tmp_path) -> Path:
    """A private copy of the tiny model, with its manifest."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    write_manifest(folder)
    return folder


def _run_id(model_path: str, env: dict[str, str], tmp_path: Path) -> str:
    p = subprocess.run(
        [*trainer_cmd(model_path, tmp_path / "ckpt"), "--print-config"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["run_id"]


def test_the_same_weights_are_one_run_wherever_they_lie(model, store_server, tmp_path):
    env = store_server.env()
    uri = store_server.new_prefix("weights")
    stage(model, uri)
    assert _run_id(uri, env, tmp_path) == _run_id(str(model), env, tmp_path)
    # Controls: without a manifest the folder's path stands for the weights (as before manifests), and
    # other weights (one byte of the tensors changed, the manifest rewritten) are another run.
    bare = tmp_path / "bare"
    shutil.copytree(model, bare)
    (bare / MANIFEST).unlink()
    assert _run_id(str(bare), env, tmp_path) != _run_id(str(model), env, tmp_path)
    other = tmp_path / "other"
    shutil.copytree(model, other)
    blob = bytearray((other / "model.safetensors").read_bytes())
    blob[-1] ^= 1
    (other / "model.safetensors").write_bytes(bytes(blob))
    write_manifest(other)
    assert _run_id(str(other), env, tmp_path) != _run_id(str(model), env, tmp_path)


def test_a_run_from_a_bucket_copies_once_and_its_image_twin_resumes_it(model, store_server, tmp_path):
    env = store_server.env()
    uri = store_server.new_prefix("weights")
    stage(model, uri)
    ckpt, cache = store_server.new_prefix("ckpt"), tmp_path / "cache"
    sets = (f"model.weights_cache={cache}", "checkpoint.every_steps=100")
    # Attempt 1 copies the weights from the bucket; attempt 2 on the same machine finds the copy.
    for attempt, at_step in ((1, 3), (2, 6)):
        code, recs, err = run_and_sigterm(trainer_cmd(uri, ckpt, *sets), at_step=at_step, env=env)
        assert code == 75, err[-2000:]
        (w,) = [r for r in recs if r["event"] == "weights"]
        assert w["source"] == uri and w["hub"] is False and w["identity"] == identity(str(model))
        assert (w["cached"], w["copied_bytes"] > 0) == ((False, True) if attempt == 1 else (True, False))
    # The local twin (an image's baked copy) is the same run: it resumes the bucket's checkpoint.
    code, recs, err = subprocess_run(trainer_cmd(str(model), ckpt, *sets), env)
    assert code == 0, err[-2000:]
    resume = next(r for r in recs if r["event"] == "resume")
    assert resume["from_step"] >= 6 and not resume.get("fresh")
    assert not list(cache.glob(".*-*")), "a partial copy was left behind"


def subprocess_run(cmd: list[str], env: dict[str, str]) -> tuple[int, list[dict], str]:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    return p.returncode, records(p.stdout), p.stderr


def test_two_ranks_on_one_machine_make_one_copy(model, s3, tmp_path):
    uri = s3.new_prefix("weights")
    stage(model, uri)
    got: list[weights.Weights] = []
    threads = [
        threading.Thread(target=lambda: got.append(materialize(uri, str(tmp_path / "cache"))))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(w.cached for w in got) == [False, True] and got[0].path == got[1].path
    assert sorted(p.name for p in got[0].path.iterdir()) == sorted(
        [*json.loads((model / MANIFEST).read_text())["files"], MANIFEST]
    )


# ---- a hostile manifest -------------------------------------------------------------------------------


def _plant(s3, model: Path, files: dict[str, bytes], manifest: dict | bytes) -> str:
    """A bucket folder holding `files` and `manifest` as given (an attacker's)."""
    uri = s3.new_prefix("hostile")
    fs, base = url_to_fs(uri)
    for name, body in {"config.json": (model / "config.json").read_bytes(), **files}.items():
        fs.pipe_file(f"{base}/{name}", body)
    fs.pipe_file(
        f"{base}/{MANIFEST}", manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    )
    return uri


def _entry(body: bytes) -> dict:
    import hashlib

    return {"bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}


def _manifest(model: Path, files: dict[str, bytes]) -> dict:
    cfg = (model / "config.json").read_bytes()
    return {
        "format": "baton-weights/1",
        "files": {"config.json": _entry(cfg), **{n: _entry(b) for n, b in files.items()}},
    }


def test_a_name_that_is_a_path_is_refused_and_writes_nothing_outside(model, s3, tmp_path, monkeypatch):
    body = b"owned"
    cache = tmp_path / "cache"
    escaped = cache / "evil.json"  # out of the copy's own folder, beside the other copies
    uri = _plant(s3, model, {"../evil.json": body}, _manifest(model, {"../evil.json": body}))
    with pytest.raises(WeightsRefused, match="not a plain file name"):
        materialize(uri, str(cache))
    assert not escaped.exists() and not (
        cache.exists() and [p for p in cache.iterdir() if ".lock" not in p.name]
    )
    # Control: without the name check the copy lands outside its folder.
    monkeypatch.setattr(weights, "check_name", lambda name: name)
    weights._REMOTE_IDENTITIES.clear()
    try:
        materialize(uri, str(cache))
    except (WeightsRefused, OSError):
        pass
    assert escaped.read_bytes() == body


def test_a_pickle_is_never_fetched_and_code_is_never_named(model, s3, tmp_path, monkeypatch):
    for name in ("pytorch_model.bin", "model.pt", "modeling_evil.py", "state.pkl"):
        uri = _plant(s3, model, {name: b"\x80\x04."}, _manifest(model, {name: b"\x80\x04."}))
        with pytest.raises(WeightsRefused, match="format is not accepted"):
            materialize(uri, str(tmp_path / "cache"))
    # Control: the suffix list is what refuses it; with .bin allowed, the pickle would be copied for loading.
    monkeypatch.setattr(weights, "SAFE_SUFFIXES", (*weights.SAFE_SUFFIXES, ".bin"))
    uri = _plant(
        s3, model, {"pytorch_model.bin": b"\x80\x04."}, _manifest(model, {"pytorch_model.bin": b"\x80\x04."})
    )
    assert (materialize(uri, str(tmp_path / "cache2")).path / "pytorch_model.bin").exists()


@pytest.mark.parametrize("tamper", ["flipped", "longer", "shorter"])
def test_a_file_that_does_not_match_its_manifest_is_refused_and_no_copy_is_kept(model, s3, tmp_path, tamper):
    good = b"x" * 1000
    bad = {"flipped": b"y" + good[1:], "longer": good + b"!", "shorter": good[:-1]}[tamper]
    cache = tmp_path / "cache"
    uri = _plant(s3, model, {"tokenizer.json": bad}, _manifest(model, {"tokenizer.json": good}))
    with pytest.raises(WeightsRefused, match="tokenizer.json does not match"):
        materialize(uri, str(cache))
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []
    # Control: the same manifest over the true bytes is copied.
    ok = _plant(s3, model, {"tokenizer.json": good}, _manifest(model, {"tokenizer.json": good}))
    assert (materialize(ok, str(cache)).path / "tokenizer.json").read_bytes() == good


@pytest.mark.parametrize(
    "manifest, message",
    [
        (b"\xff\xfe not json", "is not JSON"),
        (
            b'{"format": "baton-weights/1", "files": {"config.json": {"bytes": NaN, "sha256": "0"}}}',
            "is not JSON",
        ),
        (json.dumps({"format": "other", "files": {}}).encode(), "is not a baton-weights/1 manifest"),
        (
            json.dumps(
                {"format": "baton-weights/1", "files": {"config.json": {"bytes": -1, "sha256": "0" * 64}}}
            ).encode(),
            "must be",
        ),
        (
            json.dumps(
                {
                    "format": "baton-weights/1",
                    "files": {"model.safetensors": {"bytes": 1, "sha256": "0" * 64}},
                }
            ).encode(),
            "lists no config.json",
        ),
        (b" " * (weights.MAX_MANIFEST_BYTES + 1), "larger than"),
    ],
)
def test_a_malformed_manifest_is_one_line_from_the_trainer_and_exit_1(model, s3, tmp_path, manifest, message):
    uri = _plant(s3, model, {}, manifest)
    code, _, err = subprocess_run(
        trainer_cmd(uri, tmp_path / "ckpt", f"model.weights_cache={tmp_path}/c"), s3.env()
    )
    assert code == 1 and "Traceback" not in err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert line.startswith("error: config key 'model.path': ") and message in line


def test_a_bucket_without_a_manifest_says_how_to_stage(s3, tmp_path):
    uri = s3.new_prefix("empty")
    code, _, err = subprocess_run(trainer_cmd(uri, tmp_path / "ckpt"), s3.env())
    assert code == 1 and "Traceback" not in err and "python -m trainer.weights stage" in err


def test_a_folder_with_a_pickle_or_a_changed_file_is_not_staged(model, s3, tmp_path):
    (model / "pytorch_model.bin").write_bytes(b"\x80\x04.")
    with pytest.raises(WeightsRefused, match="format is not accepted"):
        write_manifest(model)
    (model / "pytorch_model.bin").unlink()
    write_manifest(model)
    (model / "tokenizer.json").write_text("{}")  # changed after its manifest: staging it would lie
    p = subprocess.run(
        [PY, "-m", "trainer.weights", "stage", str(model), s3.new_prefix("w")],
        capture_output=True,
        text=True,
        env=s3.env(),
        cwd=REPO,
        timeout=120,
    )
    assert p.returncode == 1 and "does not match" in p.stderr and "Traceback" not in p.stderr


def test_the_identity_of_fixed_files_is_pinned(tmp_path):
    """The identity enters the run fingerprint: a change to how the files or their list are hashed would
    move every run_id. Two fixed files, hashed by write_manifest, give this value (computed before the
    file checksum moved to trainer/checkpoint/digest.py); one byte more in a file gives another."""
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}\n')
    (tmp_path / "model.safetensors").write_bytes(bytes(range(256)) * 40)
    files = write_manifest(tmp_path)
    assert (
        files["model.safetensors"]["sha256"]
        == "e96760a87768717bcebcfd25ddc7d46b4dbc95a4b0014def080c08539f7d90d0"
    )
    assert (
        identity(str(tmp_path)) == "sha256:bb9dc3ec7d557a95e735fa3d87056879e373d5fddb998393dba60bc6fda2c212"
    )
    (tmp_path / "model.safetensors").write_bytes(bytes(range(256)) * 40 + b"\0")  # the control
    write_manifest(tmp_path)
    assert (
        identity(str(tmp_path)) != "sha256:bb9dc3ec7d557a95e735fa3d87056879e373d5fddb998393dba60bc6fda2c212"
    )
