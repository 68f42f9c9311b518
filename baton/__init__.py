"""baton's public name for a user's own training script: `from baton.hf import BatonCallback, baton_args`.

The implementation lives in the package `trainer`, a name a user's script may well have too (a
`trainer.py` beside it comes first on `sys.path` and would shadow baton's). Importing `baton` first
binds `trainer` to the package installed beside this one, so every later `import trainer...`, baton's
own included, gets baton's whatever the script's folder holds (tests/unit/test_user_script.py shows both: a
script beside its own `trainer.py` imports that one without `baton`, and baton's with it).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent.parent / "trainer" / "__init__.py"
_loaded = sys.modules.get("trainer")
if _loaded is None or Path(getattr(_loaded, "__file__", "") or "").resolve() != _HERE:
    _spec = importlib.util.spec_from_file_location(
        "trainer", _HERE, submodule_search_locations=[str(_HERE.parent)]
    )
    assert _spec is not None and _spec.loader is not None
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["trainer"] = _module
    _spec.loader.exec_module(_module)
