"""GPU checks: `python -m gpu.check` (`make gpu-check`). See gpu/README.md."""
