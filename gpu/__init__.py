"""GPU checks: `python gpu/check.py` (`make gpu-check`). See gpu/README.md."""
