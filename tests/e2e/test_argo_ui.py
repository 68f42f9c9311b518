"""The drill watched in Argo's own web UI, as a user watches it: the UI built from Argo's sources
(infra/local/build-ui.sh) and served by the local cluster's Argo Server, opened in headless Chromium from
Debian's packages, driven by Playwright from PyPI (no browser is downloaded).

Against the session's drill (conftest.py: submitted through the Argo Server, one eviction, retried by Argo),
the test logs in with the submitter's token (`client` auth mode, the UI's login page) and asserts on what the
pages show: the trial in the graph (unfolded where the UI folds it) with one node per attempt, the evicted one marked
failed and the last one succeeded, as Argo recorded them; a line the trainer wrote in that attempt's logs;
the verdict in report.md opened from compare's artifacts; the nightly CronWorkflow and its schedule in the
Cron Workflows list. A missing element fails the test with the page's screenshot saved (out/e2e-ui/).
Skipped, with the reason, where Chromium, Playwright or a cached build with the UI is missing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.localcluster import REPO, Drill, Local, why_skip

CHROMIUM = "/usr/bin/chromium"
SHOTS = REPO / "out" / "e2e-ui"
# What the machine's probe starts Chromium with: without the background-networking flags it keeps trying to
# reach hosts this closed network refuses.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def why_no_browser() -> str:
    if why_skip():
        return why_skip()
    if not Path(CHROMIUM).is_file():
        return f"no Chromium at {CHROMIUM} (Debian's package `chromium`: apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (pip install playwright; it drives Debian's Chromium, downloads none)"
    import subprocess

    built = subprocess.run(
        ["bash", str(REPO / "infra" / "local" / "build.sh"), "--print-dir"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if "ui (dist/app)" not in (Path(built) / "build-figures.txt").read_text():
        return "the cached cluster build has no UI (infra/local/build-ui.sh)"
    return ""


_SKIP = why_no_browser()
pytestmark = [pytest.mark.skipif(bool(_SKIP), reason=_SKIP), pytest.mark.slow, pytest.mark.e2e]


class UI:
    """One browser page on the Argo Server, and what a failed look saves."""

    def __init__(self, page: Any, server: str) -> None:
        self.page, self.server = page, server

    def shot(self, name: str) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{name}.png"
        self.page.screenshot(path=str(path))
        return path

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            raise AssertionError(
                f"{what}; the page: {self.shot('failure-' + what.split(':')[0].replace(' ', '-'))}"
            )

    def open(self, path: str) -> None:
        self.page.goto(f"https://{self.server}/{path}")
        self.page.wait_for_load_state("networkidle")
        for _ in range(3):  # Argo's first-time and what's-new modals, one after the other
            close = self.page.locator(".modal-close")
            try:
                close.first.wait_for(timeout=2500)
            except Exception:  # noqa: BLE001 - no modal (Playwright's TimeoutError)
                break
            close.first.click()

    def node(self, label: str) -> Any:
        """The graph's node whose label is `label` (the clickable shape beside its label)."""
        return self.page.locator(
            "xpath=//*[local-name()='g'][*[local-name()='g']/*[local-name()='text' and contains(@class, 'node-label') "
            f"and normalize-space()='{label}']]/*[local-name()='g' and contains(@class, 'node')]"
        )

    def unfold(self, label: str) -> dict[str, str]:
        """The graph's labels, with the folded group opened when `label` is not in view: the UI folds the children
        of a node with more than three between its first and its last, and the drill has four first tasks, created
        in an order the controller draws (docs/cluster-local.md). The fold comes back at each page load."""
        self.page.wait_for_selector("g.node")
        shown = self.labels()
        if label not in shown:
            folded = [lb for lb in shown if lb.endswith("hidden nodes")]
            self.expect(bool(folded), f"graph: no {label} and nothing folded, got {sorted(shown)}")
            self.node(folded[0]).click()
            self.page.wait_for_timeout(500)
            shown = self.labels()
        return shown

    def labels(self) -> dict[str, str]:
        """Every node of the graph: its label -> its classes (the phase among them)."""
        pairs = self.page.eval_on_selector_all(
            "g.node",
            "els => els.map(e => [e.parentNode.querySelector('text.node-label').textContent, "
            "e.getAttribute('class')])",
        )
        return {label.strip(): classes for label, classes in pairs}


@pytest.fixture(scope="module")
def ui(cluster: Local, drill: Drill) -> Iterator[UI]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            # The Argo Server's certificate is self-signed, made at its start (docs/cluster-local.md).
            page = browser.new_context(
                ignore_https_errors=True, viewport={"width": 1600, "height": 1000}
            ).new_page()
            page.set_default_timeout(30_000)
            view = UI(page, drill.env["ARGO_SERVER"])
            view.open("login")
            try:
                page.locator("textarea#token").wait_for()
            except Exception:  # noqa: BLE001 - Playwright's TimeoutError: the UI's login page is not there
                view.expect(
                    False,
                    "login: no token box on the login page (is the UI the built one, not the placeholder?)",
                )
            page.fill("textarea#token", drill.env["ARGO_TOKEN"])  # the whole "Bearer ..." value
            page.locator(".columns", has=page.locator("textarea#token")).locator("a.argo-button").click()
            page.wait_for_load_state("networkidle")
            yield view
        finally:
            browser.close()


def _attempts(cluster: Local, name: str) -> list[dict[str, Any]]:
    wf = cluster.get("workflow", name)
    nodes = wf["status"]["nodes"]
    (trial,) = [n for n in nodes.values() if n.get("type") == "Retry" and n["displayName"] == "trial"]
    return [nodes[c] for c in trial["children"]]


def test_the_trial_and_its_attempts_are_in_the_graph_as_argo_recorded_them(
    ui: UI, cluster: Local, drill: Drill
):
    assert drill.phase == "Succeeded", drill.status.stdout
    ui.open(f"workflows/baton/{drill.name}")
    attempts = _attempts(cluster, drill.name)
    shown = ui.unfold("trial")
    ui.expect(
        "trial" in shown and all(a["displayName"] in shown for a in attempts),
        f"graph: the trial and its attempts {[a['displayName'] for a in attempts]} in view, got {sorted(shown)}",
    )
    evicted, last = attempts[0], attempts[-1]
    ui.expect(
        len(attempts) == 2 and last["phase"] == "Succeeded",
        f"attempts: {json.dumps([a['phase'] for a in attempts])}",
    )
    ui.expect(
        "Succeeded" in shown[last["displayName"]].split(),
        f"last attempt: shown as {shown[last['displayName']]}",
    )
    ui.expect(
        evicted["phase"] in shown[evicted["displayName"]].split() and evicted["phase"] in ("Failed", "Error"),
        f"evicted attempt: {evicted['phase']} in Argo, shown as {shown[evicted['displayName']]}",
    )
    ui.shot("graph")
    # Its summary says why it ended, as Argo recorded it: exit 75 where the controller read the container's
    # status, "pod deleted" where the pod was gone first (Argo's default; docs/cluster-local.md).
    ui.node(evicted["displayName"]).click()
    panel = ui.page.locator(".workflow-details__attribute-grid").filter(has_text=evicted["name"])
    panel.wait_for()
    message = panel.inner_text()
    ui.expect(
        evicted["message"] in message and evicted["message"] in ("pod deleted", "main: Error (exit code 75)"),
        f"evicted attempt's message: Argo says {evicted['message']!r}, the panel {message!r}",
    )
    ui.shot("attempt")


def test_an_attempts_logs_show_the_trainers_lines(ui: UI, cluster: Local, drill: Drill):
    last = _attempts(cluster, drill.name)[-1]
    ui.open(f"workflows/baton/{drill.name}")
    ui.unfold(last["displayName"])
    ui.node(last["displayName"]).click()
    # The logs viewer draws into a canvas (xterm.js), so what it was given is read from the response it asked
    # for: the attempt's archived log (its pod is gone: podGC OnPodSuccess) or the live stream.
    with ui.page.expect_response(lambda r: "/outputs/main-logs" in r.url or "/log?" in r.url) as got:
        ui.page.get_by_role("button", name="LOGS").last.click()
    body = got.value.text()
    for line in (
        re.compile(r"\[baton [0-9:]+\] done: \d+ steps"),
        re.compile(r"\[steps\.train\] .* -> exit 0"),
    ):
        ui.expect(
            bool(line.search(body)),
            f"logs: no line like {line.pattern!r} in what the viewer got from {got.value.url}",
        )
    ui.page.locator(".logs-viewer .xterm").wait_for()
    ui.shot("logs")


def test_report_md_opens_from_compares_artifacts_and_shows_the_verdict(ui: UI, drill: Drill):
    ui.open(f"workflows/baton/{drill.name}")
    ui.node("report.md").click()
    go_on = ui.page.locator("text=Continue")
    if go_on.count():  # the artifact panel's first-use notice
        go_on.first.click()
    anyway = ui.page.locator("text=show anyway")
    anyway.wait_for()  # the panel shows gif, jpg, json, html, png and txt unasked; .md on a click
    anyway.click()
    frame = ui.page.frame_locator("iframe").first
    body = frame.locator("body")
    try:
        body.get_by_text("verdict").first.wait_for(timeout=30_000)
    except Exception:  # noqa: BLE001
        ui.expect(False, "report: no verdict in report.md")
    text = body.inner_text()
    ui.expect("preemption-safe in this drill" in text, f"report: the verdict, got {text[:500]!r}")
    ui.shot("report")


def test_the_nightly_cronworkflow_is_listed_with_its_schedule(ui: UI, cluster: Local):
    cron = cluster.get("cronworkflow", "baton-equivalence-nightly")
    schedule = cron["spec"].get("schedule") or cron["spec"]["schedules"][0]
    ui.open("cron-workflows/baton")
    row = ui.page.locator("text=baton-equivalence-nightly")
    try:
        row.first.wait_for(timeout=30_000)
    except Exception:  # noqa: BLE001
        ui.expect(False, "cron: no baton-equivalence-nightly in the Cron Workflows list")
    ui.expect(schedule in ui.page.inner_text("body"), f"cron: its schedule {schedule!r}")
    ui.shot("cron")
