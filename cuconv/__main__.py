"""``python -m cuconv {bench,info,profile,warmup}`` (also the ``cuconv`` console script)."""

import argparse
import sys

# Each command's own parser (in its tool) reads the arguments after the command's name.
_COMMANDS = {
    "bench": "time cuconv against cuDNN on the docs/problems.md shapes, or whole torchvision models (--models)",
    "info": "versions, device, compute capability, kernel cache location",
    "profile": "each side's kernels, layer by layer, of torchvision models",
    "warmup": "compile ahead of time what converted torchvision models need",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cuconv", description="cuconv's command-line tools; "
                                     "`python -m cuconv COMMAND --help` lists a command's options.")
    commands = parser.add_subparsers(dest="command", metavar="{bench,info,profile,warmup}", required=True)
    for name, text in _COMMANDS.items():
        commands.add_parser(name, help=text, add_help=False)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    if not argv or argv[0] not in _COMMANDS:  # (no command, an unknown one, or the top-level --help)
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            return int(exc.code or 0)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "bench":
        from .tools.bench import main as tool
    elif command == "warmup":
        from .tools.bench_models import warmup_main as tool
    elif command == "profile":
        from .tools.profile import main as tool
    else:
        from .tools.info import main as tool
    try:
        return tool(rest)
    except SystemExit as exc:  # (a tool's argparse: --help, or a usage error)
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2


if __name__ == "__main__":
    sys.exit(main())
