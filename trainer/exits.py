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
