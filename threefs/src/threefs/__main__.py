"""`python -m threefs`: the demo (local cluster, write, kill, read, recover) and the CLI."""
import sys

from . import __version__


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--version"]:
        print(f"threefs {__version__}")
        return 0
    from .cli import main as cli_main
    if argv:
        return cli_main(argv)
    from .demo import run_demo
    return run_demo()


if __name__ == "__main__":
    sys.exit(main())
