"""The ``daisychain`` command line: one sub-command per part.

Each sub-command lives in the part that owns it, as a module with ``add_arguments(parser)``
and ``run(args) -> int``; this file only routes. A part that is not installed yet is left
out of ``--help`` rather than breaking it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: sub-command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "export-luts": ("daisychain.exporter.cli", "train, verify and write the INT8 unit tables"),
    "train": ("daisychain.engine.cli", "single-process reference trainer"),
    "serve": ("daisychain.server.cli", "serve the page and do signaling"),
    "demo": ("daisychain.peer.demo", "server + N headless peers training in one room"),
    "desktop": ("daisychain.desktop.cli", "a desktop window around the local server"),
    "cluster": ("daisychain.cluster", "train over torch.distributed (Gloo), started by torchrun"),
    "export": ("daisychain.export", "a checkpoint as .safetensors or .onnx"),
    "sample": ("daisychain.sample", "text from a trained text model's checkpoint"),
}


def build_parser() -> argparse.ArgumentParser:
    from daisychain.engine.settings import ArgumentParser  # one-line usage errors

    parser = ArgumentParser(
        prog="daisychain",
        description="Train one small neural network together on the devices you already have.",
    )
    from daisychain.meta import __version__

    parser.add_argument("--version", action="version", version=f"daisychain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and (exc.name == module_name or module_name.startswith(exc.name + ".")):
                continue  # that part is not built yet
            raise
        p = sub.add_parser(name, help=help_text, description=module.__doc__.split("\n\n")[0]
                           if module.__doc__ else help_text)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
