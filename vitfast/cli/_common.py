"""What every subcommand shares: the error type and exit statuses, argparse types, output-path checks, the parser
and help formatter classes."""
from __future__ import annotations

import argparse
import json
import os
from typing import Any, Callable, Dict, List, Optional

import torch

from vitfast import _threads

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
# The system refused (full disk, read-only, permission): like a failed check, the command did not do its job; the
# request itself was fine, so not the 2 of a bad request.
EXIT_SYSTEM_ERROR = 1


class CLIError(Exception):
    """An error in the user's request: printed as one line, exit status 2."""


class OutputPathError(CLIError):
    """An output path the file system cannot take as it stands (its directory is missing, it is a directory): the
    same class of fault as a read-only or full disk, so the same form, `PATH: REASON`, and exit status 1."""

    status = EXIT_SYSTEM_ERROR


# ---------------------------------------------------------------------------------------------- argument types
def checked(text: str, convert: Callable[[str], Any], expected: str, ok: Callable[[Any], bool]) -> Any:
    """`convert(text)` if it parses and passes `ok` (NaN fails every range), else "expected ..., got TEXT"."""
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text}")
    return value


def unit_float(text: str) -> float:
    return checked(text, float, "a number in [0, 1]", lambda v: 0.0 <= v <= 1.0)


def positive_int(text: str) -> int:
    return checked(text, int, "a positive integer", lambda v: v >= 1)


def nonneg_float(text: str) -> float:
    # finite: `--lr inf` once passed and failed at step 1 with a NaN loss
    return checked(text, float, "a finite number >= 0", lambda v: 0 <= v < float("inf"))


def smoothing(text: str) -> float:
    # checked here, so the message names the option (the Trainer's said "label_smoothing: ...")
    return checked(text, float, "a number in [0, 1)", lambda v: 0 <= v < 1)


def positive_float(text: str) -> float:
    return checked(text, float, "a finite number > 0", lambda v: 0 < v < float("inf"))


def existing_file(text: str) -> str:
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"expected an existing file, got {text!r} (no such file)")
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"expected a file, got {text!r} (a directory or special file)")
    return text


def json_object(text: str) -> Dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"depth\": 4}}', got {text!r} ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"depth\": 4}}', got {text!r}")
    return value


def comma_list(cast: Callable[[str], Any], expected: str, valid: Callable[[List[Any]], bool] = lambda values: True,
               *, skip_empty: bool = True) -> Callable[[str], List[Any]]:
    """An argparse type for a comma-separated list: each item `cast` (empty items skipped, or with
    `skip_empty=False` refused: a number pair or stage depths must not lose a position), the whole list passing
    `valid`, else "expected EXPECTED, got 'TEXT'" (one message for every failure, so it says what a good value
    looks like)."""
    def parse(text: str) -> List[Any]:
        try:
            values = [cast(v) for v in text.split(",") if v.strip() or not skip_empty]
        except ValueError:
            values = []
        if not values or not valid(values):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return values

    return parse


def positive_ints(example: str) -> Callable[[str], List[int]]:
    """Comma-separated positive integers (batch sizes, thread counts); `example` is shown in the error."""
    return comma_list(int, f"comma-separated positive integers such as {example}", lambda v: all(x >= 1 for x in v))


batch_list = positive_ints("1,64")
thread_list = positive_ints("1,2")


# ---------------------------------------------------------------------------------------------- outputs
# Directories `output_dir` created during the current command, deepest first: `main` removes those still empty
# when the command fails (a full disk once left an empty run/ behind).
_created_dirs: List[str] = []


def output_dir(path: str, flag: str = "--out", *, create: bool = True) -> str:
    """A directory for outputs, created if missing (a file there once raised FileExistsError's traceback).
    `create=False` only checks: a run that fails its later checks must not leave an empty directory behind."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise CLIError(f"{flag}: expected a directory (created if missing), got the file {path!r}")
    if create:
        missing, p = [], os.path.abspath(path)
        while not os.path.lexists(p) and os.path.dirname(p) != p:
            missing.append(p)
            p = os.path.dirname(p)
        _created_dirs[:0] = missing  # before: a makedirs failing half-way leaves its parents
        os.makedirs(path, exist_ok=True)
    return path


def remove_created_dirs() -> None:
    """Remove the directories this command created that are still empty (after a failure: nothing left behind)."""
    for path in _created_dirs:
        try:
            os.rmdir(path)
        except OSError:  # not empty (a checkpoint was written before the failure), or already gone
            pass
    _created_dirs.clear()


def forget_created_dirs() -> None:
    """A new command starts (or one ended well): the directories created so far are its outputs, to keep."""
    _created_dirs.clear()


def output_path(path: str, flag: str = "-o/--output") -> str:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise OutputPathError(f"{path}: No such file or directory (the directory {directory} does not exist; {flag} "
                              f"expects a path in an existing directory)")
    if os.path.isdir(path):
        raise OutputPathError(f"{path}: Is a directory ({flag} expects a file path)")
    return path


def not_the_input(out: str, source: str, flag: str = "-o/--output", what: str = "SOURCE") -> None:
    """The output must not be the input file: it was replaced without a word (fuse: the train-time model by the
    fused one; export: the fused model by ONNX)."""
    if os.path.exists(out) and os.path.exists(source) and os.path.samefile(out, source):
        raise CLIError(f"{flag}: expected another path than {what} {source!r} (writing would replace it)")


def os_error_line(exc: OSError) -> str:
    """"PATH: REASON" for an error of the system ("run/trainer.pt: No space left on device"): the file first, as
    shells and compilers say it, and the reason without Python's "[Errno 28]"."""
    reason = exc.strerror or str(exc)
    names = [n for n in (exc.filename, exc.filename2) if n is not None]
    return ": ".join([*(os.fsdecode(n) if isinstance(n, bytes) else str(n) for n in names), reason])


# ---------------------------------------------------------------------------------------------- runtime
def parse_device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise CLIError(f"--device: expected a torch device such as cpu or cuda, got {name!r}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CLIError(f"--device: {name!r} asked for, but torch sees no CUDA device here")
    if device.type not in ("cpu", "cuda"):  # meta holds no data; others have no vitfast kernels
        raise CLIError(f"--device: expected cpu or cuda, got {name!r}")
    return device


THREADS_HELP = ("CPU threads (torch.set_num_threads) [default: torch's, one per core]; idle OpenMP threads sleep "
                "(OMP_WAIT_POLICY=PASSIVE) unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set")
# `demo` times inference too, so it keeps OpenMP's default wait policy (vitfast._threads.TRAINING_COMMANDS).
THREADS_HELP_TIMED = ("CPU threads (torch.set_num_threads) [default: torch's, one per core]; OpenMP's default wait "
                      "policy (on shared cores start with OMP_WAIT_POLICY=PASSIVE)")


def add_threads_arg(p: argparse.ArgumentParser, *, passive: bool = True) -> None:
    """The one `--threads N` of the commands that train; `passive=False` for one that also times inference and so
    keeps OpenMP's default wait policy (vitfast._threads.TRAINING_COMMANDS)."""
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help=THREADS_HELP if passive else THREADS_HELP_TIMED)


def set_threads(threads: Optional[int]) -> None:
    # the wait policy was chosen at `import vitfast`, from the command (vitfast._threads.TRAINING_COMMANDS)
    _threads.set_threads(threads, name="--threads")


# ---------------------------------------------------------------------------------------------- parser
class Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action):
        # "(default: None)" says nothing: those options state their real default in their help text
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, the command named, exit 2 (argparse's default minus the usage dump)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n(see `{self.prog} --help`)\n")
