"""Python's cyclic garbage collector during the start: paused while the start imports, frozen after.

A restart imports torch, transformers, DCP and the model's module: about 650,000 objects that live as long
as the process. With the collector on, those allocations set off six full collections, each walking a
larger heap than the last. Paused, a 17 M-parameter restart reached its first step 0.58 s and 0.84 s
sooner (medians of 4 and 5 interleaved pairs, docs/results.md, 2026-12-05).

`python -m trainer` pauses the collector before its first import. Once the model's class is imported and
before the model is built (trainer/loop.py), `settle` moves everything that exists into the permanent
generation (`gc.freeze`) and turns the collector back on: later collections skip those objects (one full
collection over them took 0.3 s), and the build, the load and the steps run with the collector as usual.

The cost: whatever became cyclic garbage before the settle is never collected. That is the imports' own
leftovers (about 11,000 objects, a few MB) and, on a first start, the corpus packing's; the model and
the checkpoint are allocated after it. A process that did not pause the collector (a test calling
`train()`, a user's script) is left alone."""

from __future__ import annotations

import gc

_paused = False


def pause() -> None:
    """Stop automatic collection until `settle`. Call before the first heavy import."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def settle() -> int:
    """Freeze what exists now and turn the collector back on, if `pause` turned it off; the number of
    objects in the permanent generation (0 when the start did not pause it)."""
    global _paused
    if not _paused:
        return 0
    gc.freeze()
    gc.enable()
    _paused = False
    return gc.get_freeze_count()
