"""`python -m engine COMMAND`: the command line lives in engine/tools/cli.py (above the runtime)."""
import sys

from engine.tools.cli import COMMANDS, main  # noqa: F401  (COMMANDS: what `python -m engine --help` lists)

if __name__ == "__main__":
    sys.exit(main())
