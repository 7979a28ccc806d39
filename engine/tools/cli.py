"""`python -m engine COMMAND`: each command lives in its own module, imported only when used.

Every option is checked before any work (engine/tools/cli_args.py): a bad value prints one `error: ...`
line naming the option, the value and the allowed range, and the command exits with status 2.
"""
import importlib
import sys

from engine.tools.cli_args import Parser

# command -> (module with add_arguments(parser) and main(args), one-line help)
COMMANDS = {
    "generate": ("engine.tools.generate_cli", "generate text with the tiny model or a Hugging Face checkpoint"),
    "paged": ("engine.tools.demos.paged", "static slots vs paged blocks: how much reserved KV memory holds tokens"),
    "fork": ("engine.tools.demos.fork", "fork a prompt 4 ways: blocks shared, then copied on write"),
    "beam": ("engine.tools.demos.beam", "beam search of width 4: beams are forks, the prompt is stored once"),
    "prefix": ("engine.tools.demos.prefix", "8 requests sharing a system prompt: prefill and blocks saved"),
    "bench-alloc": ("engine.tools.demos.bench_alloc", "allocator cost per operation from 1k to 1M blocks"),
    "bench-prefix": ("engine.tools.demos.bench_prefix", "prefix-cache eviction cost per block from 1k to 1M entries"),
    "bench": ("engine.tools.bench", "continuous batching: paged vs static slots under one KV budget"),
    "bench-peer": ("engine.tools.peer_bench", "the engine against transformers' generate on the same weights"),
}


def main(argv=None) -> int:
    """Parse, check and run one command; returns its exit status (2: a refused input, one line on stderr)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = Parser(prog="python -m engine", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        if argv[:1] == [name]:             # only the chosen command's module is imported
            importlib.import_module(module_name).add_arguments(command)
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:            # --help (0), or an option refused in one 'error:' line (2)
        return stop.code
    from engine.cache.errors import CacheFull
    from engine.errors import InputError
    try:
        return importlib.import_module(COMMANDS[args.command][0]).main(args) or 0
    except (InputError, CacheFull) as exc:     # the user's input, not a bug: one line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
