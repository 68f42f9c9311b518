"""PID 1 of a local pod, as `argoexec emissary` is PID 1 of an Argo container.

    python workflows/local/pod_init.py COMMAND [ARG ...]

It runs COMMAND in a process group of its own, forwards every signal it is sent to that whole group
(as the emissary does, so a wrapper and the torchrun it starts both get SIGTERM), and exits with the
command's code (128+N when a signal N ended it). It makes itself a child subreaper (prctl
PR_SET_CHILD_SUBREAPER), so that every process the command starts stays below it even after its parent
dies, including torchrun's workers, which call setsid and leave the command's group: the runner's
SIGKILL (`kill_tree` in workflows/local/runner.py) reaches them all, as a container's processes all die with
it. When the command exits, whatever it left running is killed, as it would be in a container.

Standard library only, run by path: it must start before anything else is importable.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def children_map() -> dict[int, list[int]]:
    """ppid -> pids, from /proc (psutil is not a dependency)."""
    out: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue  # exited while we looked
        fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses
        if fields[0] != "Z":  # a zombie is already dead; its parent reaps it
            out.setdefault(int(fields[1]), []).append(int(entry.name))
    return out


def descendants(root: int) -> list[int]:
    kids, out, todo = children_map(), [], [root]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_descendants(root: int, rounds: int = 50) -> None:
    """SIGKILL everything below `root`, again until nothing is left (a process forking meanwhile, or an
    orphan reparented to a subreaper `root`, is caught by the next round)."""
    for _ in range(rounds):
        pids = descendants(root)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if root == os.getpid():
            _reap()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: pod_init.py COMMAND [ARG ...]", file=sys.stderr)
        return 2
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(
            f"pod_init: prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}",
            file=sys.stderr,
        )
        return 1
    child: subprocess.Popen | None = None
    pending: list[int] = []  # signals that came before the command started

    def forward(signum: int, _frame: object) -> None:
        if child is None:
            pending.append(signum)
            return
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:  # before the command starts: no signal may end this process and orphan it
        signal.signal(sig, forward)
    try:
        child = subprocess.Popen(argv, process_group=0)
    except OSError as e:  # what a container runtime reports for a missing executable
        print(f"pod_init: cannot start {argv[0]!r}: {e}", file=sys.stderr)
        return 127
    for signum in pending:
        forward(signum, None)
    status = None
    while status is None:  # reap orphans as they come, until the command itself exits
        pid, st = os.wait()
        if pid == child.pid:
            status = st
    kill_descendants(os.getpid())
    code = os.waitstatus_to_exitcode(status)
    # trainer/exits.py's signal_exit, spelled again here: this file is standard library only, run by path.
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
