"""Preemption warnings (podinfo annotations, GCP metadata), the debounce, the polling thread, and the
checkpoint cadence. Real files under tmp_path, a real loopback HTTP server, and a fixed `now`."""

from __future__ import annotations

import http.server
import math
import socket
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime

import pytest

from trainer.cadence import Cadence, CadenceConfig, estimate_mtbf_s, young_daly_interval_s
from trainer.config import ConfigError, _build
from trainer.notice import (
    GCP_PREEMPTED,
    GCP_PREEMPTED_PATH,
    GUARANTEED,
    TERMINATION,
    Debounce,
    GcpMetadata,
    Notice,
    NoticeConfig,
    NoticeThread,
    NoticeWatcher,
    parse_timestamp,
)

NOW = datetime(2026, 11, 29, 23, 5, tzinfo=UTC).timestamp()


def podinfo(tmp_path, **files: str):
    """A downward-API folder holding `files` (names spelled with '_' for '-')."""
    d = tmp_path / "podinfo"
    d.mkdir(exist_ok=True)
    for name, text in files.items():
        (d / name.replace("_", "-")).write_text(text)
    return d


def warnings_in(err: str, needle: str) -> int:
    return sum(1 for line in err.splitlines() if "notice:" in line and needle in line)


# ---- timestamps ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2026-11-29T23:05:00Z", NOW),
        ("2026-11-30T00:05:00+01:00", NOW),
        ("2026-11-29T23:05:00.250Z", NOW + 0.25),
        ("2026-11-29t23:05:00z", NOW),
        (f"{int(NOW)}", NOW),
        (f"{NOW + 0.5}\n", NOW + 0.5),
    ],
)
def test_rfc3339_and_unix_seconds_parse(text, expected):
    assert parse_timestamp(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["soon", "2026-11-29T23:05:00", "2026-11-29", "nan", "inf", "", "12:00Z"])
def test_what_is_not_a_timestamp_is_refused(text):
    assert parse_timestamp(text) is None


# ---- podinfo annotations --------------------------------------------------------------------------------


def test_empty_files_mean_absent_and_are_not_a_problem(tmp_path, capsys):
    w = NoticeWatcher(podinfo(tmp_path, termination_warning_at="", guaranteed_until="\n"), lead_s=1e9)
    assert w.poll(NOW) is None
    assert "notice:" not in capsys.readouterr().err


def test_missing_file_is_ignored_and_warned_once(tmp_path, capsys):
    w = NoticeWatcher(podinfo(tmp_path, guaranteed_until=""))
    assert [w.poll(NOW + i) for i in range(3)] == [None, None, None]
    err = capsys.readouterr().err
    assert warnings_in(err, "termination-warning-at is missing") == 1
    assert "guaranteed-until" not in err


def test_missing_folder_is_ignored_and_warned_once(tmp_path, capsys):
    w = NoticeWatcher(tmp_path / "absent")
    assert [w.poll(NOW), w.poll(NOW + 20)] == [None, None]
    assert warnings_in(capsys.readouterr().err, "podinfo folder") == 1


def test_unparseable_value_is_ignored_and_warned_once(tmp_path, capsys):
    d = podinfo(tmp_path, termination_warning_at="in five minutes", guaranteed_until="")
    w = NoticeWatcher(d)
    assert [w.poll(NOW + i) for i in range(3)] == [None, None, None]
    assert warnings_in(capsys.readouterr().err, "neither RFC3339 nor unix seconds") == 1
    (d / "termination-warning-at").write_text("2026-11-29T23:04:00Z")  # fixed: it counts at once
    assert w.poll(NOW) == Notice(TERMINATION, NOW - 60, str(d / "termination-warning-at"))


@pytest.mark.parametrize("age_s", [0.0, 100.0, 600.0, -300.0])
def test_a_warning_that_passed_recently_or_lies_ahead_is_live(tmp_path, age_s):
    d = podinfo(tmp_path, termination_warning_at=str(NOW - age_s), guaranteed_until="")
    assert NoticeWatcher(d, stale_after_s=600).poll(NOW) == Notice(
        TERMINATION, NOW - age_s, str(d / "termination-warning-at")
    )


def test_a_stale_warning_is_ignored_and_warned_once(tmp_path, capsys):
    d = podinfo(tmp_path, termination_warning_at=str(NOW - 601), guaranteed_until="")
    w = NoticeWatcher(d, stale_after_s=600)
    assert [w.poll(NOW), w.poll(NOW + 20)] == [None, None]
    assert warnings_in(capsys.readouterr().err, "ignored as stale") == 1
    assert NoticeWatcher(d, stale_after_s=3600).poll(NOW) is not None  # the window is the configured one


def test_prefixed_key_in_a_subfolder(tmp_path):
    d = podinfo(tmp_path)
    (d / "baton.dev").mkdir()
    (d / "baton.dev" / "termination-warning-at").write_text("2026-11-29T23:00:00Z")
    (d / "baton.dev" / "guaranteed-until").write_text("")
    assert NoticeWatcher(d).poll(NOW) == Notice(
        TERMINATION, NOW - 300, str(d / "baton.dev/termination-warning-at")
    )


def test_whole_annotations_file(tmp_path, capsys):
    d = podinfo(
        tmp_path,
        annotations='kubectl.kubernetes.io/restartedAt="x"\n'
        'baton.dev/termination-warning-at="2026-11-29T23:00:00Z"\n',
    )
    assert NoticeWatcher(d).poll(NOW) == Notice(TERMINATION, NOW - 300, str(d / "annotations"))
    # guaranteed-until is absent from the map: an unset annotation, not a missing projection
    assert "missing" not in capsys.readouterr().err


def test_files_are_reread_on_every_poll(tmp_path):
    d = podinfo(tmp_path, termination_warning_at="", guaranteed_until="")
    w = NoticeWatcher(d)
    f = d / "termination-warning-at"
    assert w.poll(NOW) is None
    f.write_text(str(NOW - 5))
    assert w.poll(NOW).at == NOW - 5
    f.write_text("2026-11-29T23:06:00Z")
    assert w.poll(NOW).at == NOW + 60
    f.write_text("")
    assert w.poll(NOW) is None


def test_guaranteed_until_within_the_lead_time_is_a_cue(tmp_path):
    d = podinfo(tmp_path, termination_warning_at="", guaranteed_until=str(NOW + 120))
    w = NoticeWatcher(d, lead_s=60)
    assert w.poll(NOW) is None  # 120 s away, lead 60 s
    assert w.poll(NOW + 60) == Notice(GUARANTEED, NOW + 120, str(d / "guaranteed-until"))
    w.lead_s = 150  # the caller measured a slower save
    assert w.poll(NOW) == Notice(GUARANTEED, NOW + 120, str(d / "guaranteed-until"))


def test_a_termination_warning_outranks_guaranteed_until(tmp_path):
    d = podinfo(tmp_path, termination_warning_at=str(NOW), guaranteed_until=str(NOW))
    assert NoticeWatcher(d).poll(NOW).reason == TERMINATION


# ---- debounce ----------------------------------------------------------------------------------------


def test_debounce_fires_once_per_episode_and_rearms_when_withdrawn():
    deb = Debounce()
    fired = [deb.update(a) for a in [False, True, True, True, False, False, True, True]]
    assert fired == [False, True, False, False, False, False, True, False]


def test_debounce_over_real_polls_two_episodes(tmp_path):
    d = podinfo(tmp_path, termination_warning_at="", guaranteed_until="")
    w, deb, f = NoticeWatcher(d), Debounce(), d / "termination-warning-at"
    fires = 0
    for text in ["", str(NOW), str(NOW), "", str(NOW + 10), str(NOW + 10), str(NOW + 10)]:
        f.write_text(text)
        fires += deb.update(w.poll(NOW) is not None)
    assert fires == 2


# ---- GCP metadata, against a loopback stand-in -----------------------------------------------------------


class _Metadata(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the stdlib's name)
        srv = self.server
        srv.entered.set()
        srv.gate.wait(5)
        if self.path != GCP_PREEMPTED_PATH:
            self.send_error(404)
            return
        if self.headers.get("Metadata-Flavor") != srv.flavor:
            self.send_error(403, "Missing Metadata-Flavor:Google header.")
            return
        body = srv.body.encode()
        self.send_response(200)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/text")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def metadata():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    srv.body, srv.flavor = "FALSE", "Google"
    srv.entered, srv.gate = threading.Event(), threading.Event()
    srv.gate.set()
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    srv.endpoint = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.gate.set()
    srv.shutdown()
    srv.server_close()
    t.join(5)


def test_the_stand_in_refuses_a_request_without_the_header(metadata):
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
            metadata.endpoint + GCP_PREEMPTED_PATH, timeout=2
        )
    assert e.value.code == 403


def test_gcp_true_is_a_notice_false_is_none(tmp_path, metadata):
    gcp = GcpMetadata(metadata.endpoint, timeout_s=2)
    w = NoticeWatcher(podinfo(tmp_path, termination_warning_at="", guaranteed_until=""), gcp=gcp)
    assert w.poll(NOW) is None
    metadata.body = "TRUE"
    assert w.poll(NOW) == Notice(GCP_PREEMPTED, NOW, metadata.endpoint + GCP_PREEMPTED_PATH)


def test_gcp_refused_is_no_notice_warned_once(metadata, capsys):
    metadata.body, metadata.flavor = "TRUE", "not-what-we-send"  # refuses us as if the header were missing
    gcp = GcpMetadata(metadata.endpoint, timeout_s=2)
    assert [gcp.preempted(), gcp.preempted()] == [False, False]
    assert warnings_in(capsys.readouterr().err, "answered HTTP 403") == 1


def test_gcp_server_down_is_no_notice_warned_once(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gcp = GcpMetadata(f"http://127.0.0.1:{port}", timeout_s=1)
    assert [gcp.preempted(), gcp.preempted()] == [False, False]
    assert warnings_in(capsys.readouterr().err, "unreachable") == 1


def test_something_that_is_not_the_metadata_server_is_no_notice(metadata, capsys):
    metadata.body = "<html>TRUE</html>"
    assert GcpMetadata(metadata.endpoint, timeout_s=2).preempted() is False
    assert warnings_in(capsys.readouterr().err, "not the metadata server") == 1


# ---- the polling thread ------------------------------------------------------------------------------


def wait_for(cond, timeout=5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return False


def test_thread_sets_its_flag_and_stops_cleanly(tmp_path):
    d = podinfo(tmp_path, termination_warning_at=str(NOW), guaranteed_until="")
    th = NoticeThread(NoticeWatcher(d), poll_s=0.01, clock=lambda: NOW).start()
    try:
        assert th.fired.wait(5)
        assert th.pending() and th.take() == Notice(TERMINATION, NOW, str(d / "termination-warning-at"))
        assert not th.pending() and th.take() is None  # taken once
        polls = th.polls
        assert wait_for(lambda: th.polls > polls + 3)
        assert not th.pending()  # the same episode does not fire again
    finally:
        assert th.stop(timeout=5)
    assert not th._thread.is_alive() and th._thread.daemon


def test_thread_fires_again_for_a_second_episode(tmp_path):
    d = podinfo(tmp_path, termination_warning_at=str(NOW), guaranteed_until="")
    th = NoticeThread(NoticeWatcher(d), poll_s=0.01, clock=lambda: NOW).start()
    try:
        assert th.fired.wait(5) and th.take() is not None
        (d / "termination-warning-at").write_text("")
        assert wait_for(lambda: not th.debounce.active)
        (d / "termination-warning-at").write_text(str(NOW + 1))
        assert th.fired.wait(5) and th.take().at == NOW + 1
        assert th.episodes == 2
    finally:
        assert th.stop()


def test_reading_the_flag_never_waits_on_a_poll_in_flight(tmp_path, metadata):
    metadata.gate.clear()  # the server holds the request: a poll hangs in the network
    gcp = GcpMetadata(metadata.endpoint, timeout_s=5)
    th = NoticeThread(
        NoticeWatcher(podinfo(tmp_path, termination_warning_at="", guaranteed_until=""), gcp=gcp),
        poll_s=0.01,
        clock=lambda: NOW,
    ).start()
    try:
        assert metadata.entered.wait(5)
        t0 = time.perf_counter()
        for _ in range(1000):
            th.pending()
            th.take()
        assert time.perf_counter() - t0 < 0.5
        assert th.polls == 0  # the poll really is still in flight
    finally:
        metadata.gate.set()
        assert th.stop(timeout=5)


# ---- cadence -----------------------------------------------------------------------------------------


def test_young_daly_on_known_numbers():
    assert (
        young_daly_interval_s(10, 3600) == pytest.approx(math.sqrt(72000)) == pytest.approx(268.328, abs=1e-3)
    )
    assert young_daly_interval_s(30, 6 * 3600) == pytest.approx(1138.42, abs=1e-2)
    assert young_daly_interval_s(0, 3600) == 0
    with pytest.raises(ValueError):
        young_daly_interval_s(10, 0)


def test_mtbf_without_history_is_the_prior():
    assert estimate_mtbf_s([], prior_mtbf_s=21600, prior_weight=1) == 21600
    assert estimate_mtbf_s([], prior_mtbf_s=21600, prior_weight=0) == math.inf


def test_mtbf_with_history_shrinks_towards_the_data():
    history = [(0.0, True, 1000.0), (1100.0, True, 2000.0), (3200.0, False, 500.0)]
    # (3600 * 1 + 3500) / (1 + 2)
    assert estimate_mtbf_s(history, prior_mtbf_s=3600, prior_weight=1) == pytest.approx(7100 / 3)
    assert estimate_mtbf_s(history, prior_mtbf_s=3600, prior_weight=0) == pytest.approx(1750)
    assert estimate_mtbf_s(history[2:], prior_mtbf_s=3600, prior_weight=2) == pytest.approx(3850)


def test_cadence_modes():
    steps = Cadence(CadenceConfig(mode="steps"))
    assert steps.interval_s is None and not steps.due(NOW + 1e6, NOW)
    wall = Cadence(CadenceConfig(mode="wall", every_s=300))
    wall.update(save_cost_s=10)
    assert wall.interval_s == 300 and not wall.due(NOW + 299, NOW) and wall.due(NOW + 300, NOW)


def test_cadence_auto_uses_young_daly_clamped():
    c = Cadence(
        CadenceConfig(
            mode="auto",
            every_s=900,
            mtbf_prior_s=3600,
            mtbf_prior_weight=1,
            min_interval_s=60,
            max_interval_s=1800,
        )
    )
    assert c.interval_s == 900  # no save measured yet
    c.update(save_cost_s=10)
    assert c.interval_s == pytest.approx(268.328, abs=1e-3)
    assert not c.due(NOW + 268, NOW) and c.due(NOW + 269, NOW)
    c.update(save_cost_s=0.01)
    assert c.interval_s == 60
    c2 = Cadence(CadenceConfig(mode="auto", mtbf_prior_weight=0, max_interval_s=1800))
    c2.update(save_cost_s=10)
    assert c2.interval_s == 1800  # no evidence of preemption: the longest interval
    c.update(save_cost_s=10, history=[(0.0, True, 600.0), (700.0, True, 200.0)])
    assert c.mtbf_s == pytest.approx((3600 + 800) / 3)
    assert c.interval_s == pytest.approx(math.sqrt(2 * 10 * 4400 / 3))


def test_cadence_reports_changes_and_not_jitter():
    c = Cadence(CadenceConfig(mode="auto", every_s=900, mtbf_prior_s=3600, min_interval_s=60), rel_tol=0.1)
    first = c.update()
    assert first is not None and first.interval_s == 900 and first.previous_s is None
    assert c.update() is None
    change = c.update(save_cost_s=10)
    assert change.previous_s == 900 and change.interval_s == pytest.approx(268.328, abs=1e-3)
    assert change.save_cost_s == 10 and change.mtbf_s == 3600
    assert c.update(save_cost_s=10.5) is None  # 5% jitter in the save is not news
    assert c.update(save_cost_s=20) is not None
    assert c.update(history=[(0.0, True, 100.0)]) is not None  # the MTBF moved


# ---- config ------------------------------------------------------------------------------------------


def test_defaults_are_valid_and_loader_compatible():
    n, c = NoticeConfig(), CadenceConfig()
    assert (n.poll_s, n.stale_after_s, n.policy, n.gcp_metadata) == (20, 600, "continue", False)
    assert (c.mode, c.mtbf_prior_s, c.mtbf_prior_weight) == ("steps", 21600, 1.0)
    # config.py's loader builds these from YAML: every field must be one of its plain types
    assert _build(NoticeConfig, {"poll_s": 1, "policy": "stop"}, "notice").poll_s == 1.0
    assert _build(CadenceConfig, {"mode": "auto", "every_s": 300}, "cadence").every_s == 300.0
    with pytest.raises(ConfigError, match="'notice.poll_s'"):
        _build(NoticeConfig, {"poll_s": "often"}, "notice")


def test_podinfo_folder_resolution(monkeypatch):
    monkeypatch.delenv("BATON_PODINFO", raising=False)
    assert str(NoticeConfig().podinfo_path()) == "/etc/podinfo"
    monkeypatch.setenv("BATON_PODINFO", "/run/podinfo")
    assert str(NoticeConfig().podinfo_path()) == "/run/podinfo"
    assert str(NoticeConfig(podinfo_dir="/x").podinfo_path()) == "/x"


@pytest.mark.parametrize(
    "cls, field, value",
    [
        (NoticeConfig, "poll_s", 0.5),
        (NoticeConfig, "poll_s", 301),
        (NoticeConfig, "stale_after_s", 0),
        (NoticeConfig, "policy", "pause"),
        (NoticeConfig, "gcp_endpoint", "metadata.google.internal"),
        (NoticeConfig, "gcp_timeout_s", 0),
        (CadenceConfig, "mode", "hourly"),
        (CadenceConfig, "every_s", 0),
        (CadenceConfig, "mtbf_prior_s", -1),
        (CadenceConfig, "mtbf_prior_weight", -0.5),
        (CadenceConfig, "min_interval_s", 0),
        (CadenceConfig, "max_interval_s", 30),
    ],
)
def test_bad_values_name_the_key(cls, field, value):
    prefix = "notice" if cls is NoticeConfig else "cadence"
    with pytest.raises(ConfigError, match=f"'{prefix}.{field}'"):
        cls(**{field: value})


@pytest.mark.parametrize("poll_s", [1, 300])
def test_poll_interval_bounds_are_inclusive(poll_s):
    assert NoticeConfig(poll_s=poll_s).poll_s == poll_s
