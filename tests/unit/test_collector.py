"""The start's pause of the cyclic garbage collector (trainer/collector.py), in fresh interpreters: the
test process's own collector is left alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import gc, json
from trainer import collector
if {pause}:
    collector.pause()
during = gc.isenabled()
made = [[i] for i in range(50_000)]  # tracked objects that exist when the start settles
frozen = collector.settle()
print(json.dumps({{"during": during, "frozen": frozen, "count": gc.get_freeze_count(), "after": gc.isenabled(),
                   "again": collector.settle()}}))
"""


def probe(pause: bool) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(pause=pause)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_paused_start_freezes_what_it_made_and_turns_the_collector_back_on():
    got = probe(pause=True)
    assert got["during"] is False  # paused while the start imports
    assert got["after"] is True  # the steps run with the collector on
    assert got["frozen"] == got["count"] >= 50_000  # the start's objects sit in the permanent generation
    assert got["again"] == 0  # settling twice freezes nothing more


def test_an_unpaused_process_is_left_alone():
    """Control: where the start did not pause it (a test calling train(), a user's script), settle freezes
    nothing and the collector was never off."""
    got = probe(pause=False)
    assert got == {"during": True, "frozen": 0, "count": 0, "after": True, "again": 0}


def test_python_m_trainer_pauses_before_torch_is_imported():
    """The pause must come before the first heavy import: importing torch with the collector on sets off
    full collections (six, for a restart's imports), with it paused none."""
    code = (
        "import gc, sys; import trainer.__main__; "
        "print(gc.isenabled(), 'torch' in sys.modules, gc.get_stats()[2]['collections'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.stdout.split() == ["False", "True", "0"], (out.stdout, out.stderr[-2000:])
    # Control: the same import with the pause taken out collects in full at least once.
    code = code.replace(
        "import trainer.__main__",
        "import trainer.collector as c; c.pause = lambda: None; import trainer.__main__",
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    enabled, torch_in, full = out.stdout.split()
    assert (enabled, torch_in) == ("True", "True") and int(full) > 0, out.stderr[-2000:]
