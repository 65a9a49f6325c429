"""The `frnccl` command."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


def _add_native_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    from . import live_dump

    live_dump.register(sub)
    from . import status

    status.register(sub)
    try:
        from . import demo

        demo.register(sub)
    except ImportError:
        pass
    config_cmd = sub.add_parser("config", help="show the FRNCCL_* settings in effect and check them")
    config_cmd.set_defaults(func=_show_config)


def _show_config(args: argparse.Namespace) -> int:
    import os

    from .config import SETTINGS, adopted_torch_settings, validate_environment

    adopted = {a.name: a for a in adopted_torch_settings()[0]}
    for setting in SETTINGS:
        value = os.environ.get(setting.name)
        if setting.name in adopted:
            shown = f"{adopted[setting.name].value} (from {adopted[setting.name].source})"
        else:
            shown = value if value is not None else f"(default {setting.default})"
        print(f"{setting.name}={shown}")
    print(_build_line())
    problems = validate_environment()
    for problem in problems:
        print(f"frnccl: {problem}", file=sys.stderr)
    return 2 if problems else 0


def _build_line() -> str:
    """What this install was built with: the torch it runs on and whether the CUDA parts are in."""
    try:
        import torch

        from ._native import native

        C = native()
        skipped = C.cuda_parts_skipped()
    except Exception as err:  # a broken install must still show its settings
        return f"build: the native library does not load ({type(err).__name__}: {err})"
    cuda = f"not built ({skipped})" if skipped else "built"
    return f"build: torch {torch.__version__}; CUDA parts {cuda}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="frnccl",
        description="Flight recorder for torch.distributed: analyze dumps, request live dumps, run the demo.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    from .analyzer import cli as analyzer_cli

    analyzer_cli.register(sub)
    from . import export

    export.register(sub)
    _add_native_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("frnccl: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - exit 1 means findings: a crash is 2, in one line
        from .analyzer.cli import one_line

        print(f"frnccl {args.command}: internal error: {one_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
