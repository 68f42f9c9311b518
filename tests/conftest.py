from __future__ import annotations

import pytest

from tests.helpers import CORPUS


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny Qwen2 built from a config and saved with save_pretrained, once per session."""
    from trainer.data import read_documents
    from trainer.tiny import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("model") / "tiny-qwen2", read_documents(str(CORPUS)))
