"""The `vitfast` command line (also `python -m vitfast`): convert, train, fuse, verify, bench, export, demo,
select-heads, usdc, distill-demo.

Every subcommand explains itself with `vitfast <command> --help`.  Errors in what was asked for (a missing
file, θ outside [0, 1], an unknown timm model, ...) end with one line on stderr naming the argument, what was
expected and what was given, and exit status 2; a failed check (`verify`, `demo`) exits with 1.  An error of the
system (a full disk, a read-only or missing directory, no permission) ends with one line `vitfast COMMAND: error:
PATH: REASON` and exit status 1; what was at PATH is left as it was and no temporary file stays behind
(vitfast.io.atomic).  Set VITFAST_DEBUG=1 to see the Python traceback of an error instead.

One module per subcommand, each with `add_parser(subparsers)` (its options, `func=run` as the default) and
`run(args)` (the command; returns the exit status).  Options several commands share live in the `_*_args`
modules, one per method; `_common` holds the error type, exit statuses and argument types.
"""
from __future__ import annotations

import argparse
import os
import sys
import textwrap
from typing import Optional, Sequence

from vitfast.cli import bench
from vitfast.cli import convert
from vitfast.cli import demo
from vitfast.cli import distill_demo
from vitfast.cli import export
from vitfast.cli import fuse
from vitfast.cli import quantize
from vitfast.cli import select_heads
from vitfast.cli import train
from vitfast.cli import usdc
from vitfast.cli import verify
from vitfast.cli._common import EXIT_CHECK_FAILED
from vitfast.cli._common import EXIT_INTERRUPTED
from vitfast.cli._common import EXIT_OK
from vitfast.cli._common import EXIT_SYSTEM_ERROR
from vitfast.cli._common import EXIT_USAGE
from vitfast.cli._common import CLIError
from vitfast.cli._common import Formatter
from vitfast.cli._common import Parser
from vitfast.cli._common import forget_created_dirs
from vitfast.cli._common import os_error_line
from vitfast.cli._common import remove_created_dirs

# OSErrors without an errno that vitfast's own checks raise about the request (any other is the system's)
_REQUEST_ERRORS = (FileNotFoundError, FileExistsError, NotADirectoryError, PermissionError, IsADirectoryError)

# in the order `vitfast --help` lists them
COMMANDS = (convert, train, fuse, quantize, verify, bench, export, demo, select_heads, usdc, distill_demo)


def _version() -> str:
    """vitfast's version and the torch (and CUDA) it runs on: what a bug report needs first."""
    import torch

    from vitfast._version import __version__

    cuda = f", CUDA {torch.version.cuda}" if torch.version.cuda else ""
    return f"vitfast {__version__} (torch {torch.__version__}{cuda})"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="vitfast",
        formatter_class=Formatter,
        description=textwrap.dedent("""\
            Train Vision Transformers in reparameterizable shapes, fuse them exactly, run them on fused kernels.

            The path:  timm model --convert--> train-time model --train--> --fuse--> fused .safetensors
            (each step is a subcommand; `vitfast demo` runs all of them on the scikit-learn digits)."""),
        epilog=textwrap.dedent("""\
            examples:
              vitfast demo                                          # the whole path in ~2 minutes
              vitfast convert deit_tiny_patch16_224 --img-size 32 --num-classes 10 --channel-idle 0.75 -o tiny.safetensors
              vitfast train tiny.safetensors --steps 500 --out run/
              vitfast fuse run/model.safetensors -o fused.safetensors
              vitfast verify fused.safetensors --source run/model.safetensors --inputs digits
              vitfast bench fused.safetensors --batch-sizes 1,64"""),
    )
    parser.add_argument("--version", action="version", version=_version(), help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def _run(args) -> int:
    """The command; output directories it created are removed again when it fails and leaves them empty."""
    forget_created_dirs()
    try:
        return int(args.func(args) or 0)
    except BaseException:
        remove_created_dirs()
        raise
    finally:
        forget_created_dirs()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point (`vitfast`, `python -m vitfast`); returns the exit status (0 ok, 1 check failed or the system
    refused, 2 bad request)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a bad argument (already reported): a status, not an exception
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    debug = os.environ.get("VITFAST_DEBUG", "") not in ("", "0")
    try:
        return _run(args)
    except KeyboardInterrupt:
        print(f"vitfast {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except FloatingPointError as exc:  # a diverging run (the Trainer refuses a non-finite loss): no traceback
        if debug:
            raise
        print(f"vitfast {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    except BrokenPipeError:  # `vitfast ... | head`: the reader left; not an error worth a traceback
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_OK
    except (CLIError, ValueError, TypeError, OSError) as exc:
        if debug:
            raise
        if isinstance(exc, OSError) and exc.errno is not None:
            # The system refused (a full disk, a read-only file system): the request itself may be fine.
            print(f"vitfast {args.command}: error: {os_error_line(exc)}", file=sys.stderr)
            return EXIT_SYSTEM_ERROR
        # Errors in what was asked for: vitfast's own checks raise these (FileNotFoundError, IsADirectoryError, ...
        # without an errno) with the argument named.
        print(f"vitfast {args.command}: error: {exc}", file=sys.stderr)
        if isinstance(exc, CLIError):
            return getattr(exc, "status", EXIT_USAGE)
        if isinstance(exc, OSError) and not isinstance(exc, _REQUEST_ERRORS):  # a library's OSError("...")
            return EXIT_SYSTEM_ERROR
        return EXIT_USAGE
