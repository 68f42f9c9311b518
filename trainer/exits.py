"""The exit-code rule (README, "Exit codes"), defined once for every entry point. Torch-free: the pod's
PID 1 (steps.train) reads it before it starts the ranks."""

EXIT_OK = 0
"""Training finished and its final checkpoint is committed."""
EXIT_FAIL = 1
"""A retry cannot help: a bad config, a missing bucket or credentials, a refused or foreign checkpoint, a
fenced-out writer, a loss that is not finite, a bug."""
EXIT_PREEMPTED = 75
"""Retry: preempted with the current step committed, or ended by a fault a retry can mend (a
`retry_later` record says which); the last commit stands."""


# The codes a container runtime reports for a process ended by a signal: 128 + the signal's number. Torch-free
# and signal-module-free on purpose: the retry expression and the local runner spell them from here.
SIGNAL_EXIT_BASE = 128
EXIT_SIGTERM = SIGNAL_EXIT_BASE + 15
"""Ended by SIGTERM without handling it (143): a pod deleted before steps.train's handler existed, or a helper
step (evict, verify, compare) that does not handle it; nothing was trained."""
EXIT_SIGKILL = SIGNAL_EXIT_BASE + 9
"""SIGKILLed (137): after its grace, when the preemption save did not finish in time, or by the OOM killer."""


def signal_exit(returncode: int | None) -> int:
    """A `subprocess` return code as a container runtime reports it: a signal N is 128 + N; None (still
    running, or never seen to end) is -1."""
    if returncode is None:
        return -1
    return SIGNAL_EXIT_BASE - returncode if returncode < 0 else returncode
