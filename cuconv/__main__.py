"""``python -m cuconv {bench,info,profile,warmup}``."""

import sys


def _usage(status: int = 2) -> int:
    print("usage: python -m cuconv {bench,info,profile,warmup} [options]\n"
          "  bench    time cuconv against cuDNN on the docs/problems.md shapes (--help for options)\n"
          "  info     versions, device, compute capability, kernel cache location\n"
          "  profile  each side's kernels, layer by layer, of torchvision models (--help for options)\n"
          "  warmup   compile ahead of time what converted torchvision models need (--help for options)",
          file=sys.stderr if status else sys.stdout)
    return status


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        return _usage()
    if argv[0] in ("-h", "--help"):
        return _usage(0)
    command, rest = argv[0], argv[1:]
    if command == "bench":
        from .tools.bench import main as bench_main

        return bench_main(rest)
    if command == "warmup":
        from .tools.bench_models import warmup_main

        return warmup_main(rest)
    if command == "profile":
        from .tools.profile import main as profile_main

        return profile_main(rest)
    if command == "info":
        from .tools.info import main as info_main

        return info_main(rest)
    print(f"python -m cuconv: unknown command {command!r}", file=sys.stderr)
    return _usage()


if __name__ == "__main__":
    sys.exit(main())
