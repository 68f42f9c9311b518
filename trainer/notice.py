"""Warnings before SIGTERM: the podinfo annotations and GCP's metadata server.

SIGTERM (trainer/preemption.py) is the last word; this module hears the earlier ones:
- pod annotations that the Kubernetes downward API projects into a folder (`BATON_PODINFO`, default
  /etc/podinfo). For each key, the first non-empty source of these wins:
    <dir>/<key>                      an item whose `path` is the bare key
    <dir>/baton.dev/<key>            an item whose `path` is the prefixed key (Kubernetes makes the subfolder)
    <dir>/annotations                the whole map (`fieldPath: metadata.annotations`), `key="value"` lines,
                                     where the key is `<key>` or `baton.dev/<key>`
  with <key> `termination-warning-at` and `guaranteed-until`; values are RFC3339 or unix seconds;
- GCP's metadata server (`instance/preempted` answers TRUE), when enabled.
Every poll re-reads every source: an annotation can be set, moved or withdrawn at any time.

`NoticeWatcher.poll(now)` is the decision, with the clock passed in so tests pin `now` instead of
sleeping. `Debounce` turns "a warning is active" into one trigger per episode. `NoticeThread` polls off
the training thread; the loop reads `pending()` (an Event, never blocks) at a step boundary and
OR-reduces it over the ranks itself.

The checkpoint cadence these feed is trainer/cadence.py.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from trainer import env
from trainer.records import log
from trainer.validation import require as _require

TERMINATION, GUARANTEED, GCP_PREEMPTED = "termination-warning-at", "guaranteed-until", "gcp-preempted"
REASONS = (TERMINATION, GUARANTEED, GCP_PREEMPTED)
ANNOTATION_PREFIX = "baton.dev/"
ANNOTATIONS_FILE = "annotations"
DEFAULT_PODINFO = "/etc/podinfo"
DEFAULT_GCP_ENDPOINT = "http://metadata.google.internal"
GCP_PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"


@dataclass
class NoticeConfig:
    enabled: bool = True
    """Watch for warnings at all. Off: only SIGTERM stops the run."""
    podinfo_dir: str = ""
    """Folder of downward-API annotation files. Empty: `$BATON_PODINFO`, else /etc/podinfo."""
    poll_s: float = 20.0
    """Seconds between polls, 1..300. Every poll re-reads the files (and asks the metadata server)."""
    stale_after_s: float = 600.0
    """A termination-warning-at older than this while the pod still runs is stale and ignored. Younger
    ones in the past stay live: warnings reach the pod late."""
    policy: str = "continue"
    """On a warning: 'continue' saves a checkpoint (reason warning) at the next step boundary and trains
    on until SIGTERM; 'stop' saves there and exits 75."""
    gcp_metadata: bool = False
    """Also ask GCP's metadata server whether this VM is preempted. Off unless on GCE and wanted."""
    gcp_endpoint: str = DEFAULT_GCP_ENDPOINT
    """Base URL of the metadata server (tests point it at a loopback stand-in)."""
    gcp_timeout_s: float = 1.0
    """Timeout of one metadata request; a hung server must not hold up the next poll."""

    def __post_init__(self) -> None:
        _require(1 <= self.poll_s <= 300, "notice.poll_s", f"must be in [1, 300] seconds, got {self.poll_s}")
        _require(self.stale_after_s > 0, "notice.stale_after_s", f"must be > 0, got {self.stale_after_s}")
        _require(
            self.policy in ("continue", "stop"),
            "notice.policy",
            f"must be 'continue' or 'stop', got {self.policy!r}",
        )
        _require(
            self.gcp_endpoint.startswith(("http://", "https://")),
            "notice.gcp_endpoint",
            f"must be an http:// or https:// URL, got {self.gcp_endpoint!r}",
        )
        _require(
            0 < self.gcp_timeout_s <= 30,
            "notice.gcp_timeout_s",
            f"must be in (0, 30] seconds, got {self.gcp_timeout_s}",
        )

    def podinfo_path(self) -> Path:
        return Path(self.podinfo_dir or env.text("BATON_PODINFO") or DEFAULT_PODINFO)


@dataclass(frozen=True)
class Notice:
    reason: str
    """One of REASONS."""
    at: float
    """The warning's timestamp (unix seconds); for gcp-preempted, the poll that saw it."""
    source: str
    """The file or URL it came from."""


class WarnOnce:
    """A problem is logged once per (source, kind): a misconfigured folder must not flood every poll."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str]] = set()

    def __call__(self, source: str, kind: str, msg: str) -> None:
        if (source, kind) not in self.seen:
            self.seen.add((source, kind))
            log(f"notice: {msg}")


def parse_timestamp(text: str) -> float | None:
    """RFC3339 (`2026-11-29T23:05:00Z`, offsets, fractions) or unix seconds; None for anything else."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        return value if math.isfinite(value) else None
    try:
        dt = datetime.fromisoformat(text.upper())  # RFC3339 allows a lowercase 't' and 'z'
    except ValueError:
        return None
    return dt.timestamp() if dt.tzinfo is not None else None  # a time without an offset is ambiguous


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


class GcpMetadata:
    """Asks GCP's metadata server whether this VM is preempted. Any failure reads as "not preempted"."""

    def __init__(
        self, endpoint: str = DEFAULT_GCP_ENDPOINT, timeout_s: float = 1.0, warn: WarnOnce | None = None
    ) -> None:
        self.url = endpoint.rstrip("/") + GCP_PREEMPTED_PATH
        self.timeout_s = timeout_s
        self.warn = warn or WarnOnce()
        # The metadata server is link-local: an HTTP(S)_PROXY from the environment must not see it.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def preempted(self) -> bool:
        req = urllib.request.Request(self.url, headers={"Metadata-Flavor": "Google"})
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                flavor = resp.headers.get("Metadata-Flavor")
                body = resp.read(64).decode("ascii", "replace").strip()
        except urllib.error.HTTPError as e:
            self.warn(self.url, "http-error", f"{self.url} answered HTTP {e.code}; read as not preempted")
            return False
        except (OSError, http.client.HTTPException) as e:
            self.warn(self.url, "unreachable", f"{self.url} unreachable ({e}); read as not preempted")
            return False
        if flavor != "Google" or body not in ("TRUE", "FALSE"):
            # Something answered that is not the metadata server (a captive portal, a proxy page).
            self.warn(
                self.url,
                "unexpected",
                f"{self.url} answered {body[:20]!r} (Metadata-Flavor "
                f"{flavor!r}), not the metadata server's TRUE/FALSE; read as not preempted",
            )
            return False
        return body == "TRUE"


class NoticeWatcher:
    """Reads the warning sources on every `poll(now)` and says whether one is live."""

    def __init__(
        self,
        podinfo_dir: str | Path,
        stale_after_s: float = 600.0,
        lead_s: float = 0.0,
        gcp: GcpMetadata | None = None,
        warn: WarnOnce | None = None,
    ) -> None:
        self.dir = Path(podinfo_dir)
        self.stale_after_s = stale_after_s
        self.lead_s = lead_s  # guaranteed-until this close is a cue; the caller updates it as saves are timed
        self.warn = warn or (gcp.warn if gcp else WarnOnce())
        self.gcp = gcp

    @classmethod
    def from_config(cls, cfg: NoticeConfig, lead_s: float = 0.0) -> NoticeWatcher:
        warn = WarnOnce()
        gcp = GcpMetadata(cfg.gcp_endpoint, cfg.gcp_timeout_s, warn) if cfg.gcp_metadata else None
        return cls(cfg.podinfo_path(), cfg.stale_after_s, lead_s, gcp, warn)

    def _read(self, path: Path) -> str | None:
        try:
            return path.read_text().strip()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, UnicodeDecodeError) as e:
            self.warn(str(path), "unreadable", f"cannot read {path} ({e}); ignored")
            return ""

    def _annotation(self, key: str, whole: dict[str, str] | None) -> tuple[float, str] | None:
        """(timestamp, source) of `key`, or None when it is absent, missing or unparseable."""
        candidates = [(self._read(self.dir / p), str(self.dir / p)) for p in (key, ANNOTATION_PREFIX + key)]
        if whole is not None:
            source = str(self.dir / ANNOTATIONS_FILE)
            candidates += [(whole.get(key, ""), source), (whole.get(ANNOTATION_PREFIX + key, ""), source)]
        if all(text is None for text, _ in candidates):
            self.warn(
                str(self.dir / key),
                "missing",
                f"{self.dir / key} is missing (nor under "
                f"{ANNOTATION_PREFIX} nor in {ANNOTATIONS_FILE}); {key} is not watched",
            )
            return None
        for text, source in candidates:
            if text:  # an empty file is an annotation that is not set
                at = parse_timestamp(text)
                if at is None:
                    self.warn(
                        source,
                        f"unparseable {key}",
                        f"{source}: {key} {text[:40]!r} is neither RFC3339 nor unix seconds; ignored",
                    )
                return None if at is None else (at, source)
        return None

    def _annotations_map(self) -> dict[str, str] | None:
        text = self._read(self.dir / ANNOTATIONS_FILE)
        if text is None:
            return None
        out: dict[str, str] = {}
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            value = value.strip()
            if sep and len(value) >= 2 and value[0] == value[-1] == '"':
                try:
                    value = json.loads(value)  # Go's %q, as the kubelet writes it, is JSON for ASCII
                except ValueError:
                    value = value[1:-1]
            if sep:
                out[key.strip()] = str(value)
        return out

    def poll(self, now: float) -> Notice | None:
        """The live warning at `now` (unix seconds), most urgent first, or None."""
        if not self.dir.is_dir():
            self.warn(
                str(self.dir), "missing", f"podinfo folder {self.dir} is missing; annotations not watched"
            )
            hits: dict[str, tuple[float, str] | None] = {TERMINATION: None, GUARANTEED: None}
        else:
            whole = self._annotations_map()
            hits = {key: self._annotation(key, whole) for key in (TERMINATION, GUARANTEED)}
        if (hit := hits[TERMINATION]) is not None:
            at, source = hit
            if now - at <= self.stale_after_s:
                return Notice(TERMINATION, at, source)
            self.warn(
                source,
                "stale",
                f"{source}: termination warning at {_iso(at)} is older than "
                f"{self.stale_after_s:g}s and the pod still runs; ignored as stale",
            )
        if self.gcp is not None and self.gcp.preempted():
            return Notice(GCP_PREEMPTED, now, self.gcp.url)
        if (hit := hits[GUARANTEED]) is not None and hit[0] - now <= self.lead_s:
            return Notice(GUARANTEED, hit[0], hit[1])
        return None


class Debounce:
    """True exactly once per warning episode: on the first active poll; a poll without one re-arms it."""

    def __init__(self) -> None:
        self.active = False

    def update(self, active: bool) -> bool:
        fire = active and not self.active
        self.active = active
        return fire


class NoticeThread:
    """Polls a watcher every `poll_s` on a daemon thread, so the training step never waits on a file or
    on the network. The loop calls `pending()` (cheap, never blocks) at step boundaries, OR-reduces it
    over the ranks, and `take()`s the notice when it acts on it."""

    def __init__(self, watcher: NoticeWatcher, poll_s: float, clock: Callable[[], float] = time.time) -> None:
        self.watcher, self.poll_s, self.clock = watcher, poll_s, clock
        self.debounce = Debounce()
        self.fired = threading.Event()
        self.notice: Notice | None = None
        self.episodes = 0
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="baton-notice", daemon=True)

    def start(self) -> NoticeThread:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                notice = self.watcher.poll(self.clock())
            except Exception as e:  # a broken poll must end neither the watch nor the run
                self.watcher.warn("poll", type(e).__name__, f"poll failed ({e!r}); still watching")
                notice = None
            if self.debounce.update(notice is not None):
                self.notice = notice
                self.episodes += 1
                self.fired.set()
            self.polls += 1
            self._stop.wait(self.poll_s)

    def pending(self) -> bool:
        return self.fired.is_set()

    def take(self) -> Notice | None:
        """The notice that fired, once; clears the flag so that the next episode can set it again."""
        if not self.fired.is_set():
            return None
        self.fired.clear()
        return self.notice

    def stop(self, timeout: float = 5.0) -> bool:
        """Ends the thread; True if it has ended (a poll in flight may take up to the GCP timeout)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()
