"""The drill's steps. Each module here is a command that runs in a pod of its own (`python -m steps.NAME`):
train (the trainer's PID 1), evict, verify, compare, release. What they share (the contract with Argo and the
trainer, the evidence, the judgment, the report) is in `steps.lib`, which no pod runs on its own."""

import baton  # noqa: F401 - binds `trainer` to baton's own package, whatever the working folder holds
