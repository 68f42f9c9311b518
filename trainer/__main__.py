"""python -m trainer --config FILE [--set dotted.key=value ...]

Exit codes: 0 reached total_steps with the final checkpoint committed; 75 preempted after committing
the current step; 1 anything else (a crash, a bad config, a refused checkpoint).
"""

from __future__ import annotations

import argparse
import os
import sys

from trainer import collector, env

# Before torch's import: the start's imports run without the cyclic collector (trainer/collector.py).
collector.pause()

from trainer.bounded import ArgParser  # noqa: E402
from trainer.preemption import Preemption  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    # cuBLAS reads this once, at its first use: set it before anything can touch CUDA.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # Weights come from model.path (a folder, or a bucket's copy): a hub download from a training pod would
    # depend on the hub at every attempt and could change the weights between the reference and the trial.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # The handler goes in before the slow imports: a SIGTERM during start-up still ends in a clean 75. Every
    # BATON_ variable is read first: a bad one is one line and exit 1, never a traceback later.
    try:
        env.check()
        preempt = Preemption()
        preempt.install()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    ap = ArgParser(
        prog="python -m trainer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", required=True, help="YAML config file")
    ap.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set model.dropout=0.1 (repeatable)",
    )
    ap.add_argument(
        "--print-config", action="store_true", help="print the resolved config and run_id, then exit"
    )
    args = ap.parse_args(argv)

    from trainer.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.overrides)
        cfg.fingerprint  # noqa: B018 - reads the weights' manifest where model.path has one: its errors are config errors
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.print_config:
        import json

        print(
            json.dumps(
                {"run_id": cfg.run_id, "fingerprint": cfg.fingerprint, "config": cfg.to_dict()}, indent=1
            )
        )
        return 0

    from trainer.checkpoint import CheckpointRefused
    from trainer.loop import train

    try:
        return train(cfg, preempt)
    except (ConfigError, CheckpointRefused, env.EnvError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Exception:
        import traceback

        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
