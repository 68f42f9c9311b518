"""The drill's steps: each a small command that runs in a pod of its own."""

import baton  # noqa: F401 - binds `trainer` to baton's own package, whatever the working folder holds
