"""tests/gpu: every module carries `pytestmark = GPU_MARKS` (skipped without CUDA, with the reason).

cuBLAS reads CUBLAS_WORKSPACE_CONFIG once, when this process first uses it, and the in-process tests
here run under `torch.use_deterministic_algorithms(True)`: so it is set before any test runs (the
trainer sets the same value for its own processes).
"""

from __future__ import annotations

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def pytest_report_header(config) -> str:
    import torch

    if not torch.cuda.is_available():
        return "baton gpu: no CUDA device, tests/gpu will be skipped"
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    return (
        f"baton gpu: {torch.cuda.device_count()} device(s): {names}; torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}, NCCL {torch.cuda.nccl.version()}"
    )
