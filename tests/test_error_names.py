"""Every `vitfast.…` name the package's text gives — error messages, notes, docstrings — exists.  A message
that sends the reader to a function that is not there (`vitfast.save_trainable` for `vitfast.io.save_trainable`)
is worse than none.  The walk reads the source (ast), so it sees the messages of branches no test reaches."""
from __future__ import annotations

import ast
import importlib
import pathlib
import re
from typing import Iterator, Tuple

ROOT = pathlib.Path(__file__).resolve().parent.parent
# a dotted vitfast name, not the tail of another (torch.ops.vitfast.batch_gate is an op, not a Python name)
NAME = re.compile(r"(?<![\w./])vitfast(?:\.[A-Za-z_]\w*)+")


def _format_tags() -> set:
    """The files' format tags ("vitfast.fused", ...): dotted like names, but values of a metadata field."""
    from vitfast.io.fused import FORMAT
    from vitfast.io.head_ranking import RANKING_FORMAT
    from vitfast.io.trainable import TRAINABLE_FORMAT

    return {FORMAT, RANKING_FORMAT, TRAINABLE_FORMAT}


def _names() -> Iterator[Tuple[str, str]]:
    """(where, dotted name) for each vitfast name inside a string literal (messages, docstrings) of the package."""
    tags = _format_tags()
    for path in sorted((ROOT / "vitfast").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            for match in NAME.finditer(node.value):
                if match.group(0) not in tags:
                    yield f"{path.relative_to(ROOT)}:{node.lineno}", match.group(0)


def _resolve(dotted: str) -> object:
    """The object `dotted` names: the longest importable module prefix, then attributes (lazy ones included)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_the_walk_finds_the_names_messages_give():
    names = {name for _, name in _names()}
    assert {"vitfast.io.load_trainable", "vitfast.io.load_trainer_checkpoint", "vitfast.convert.from_timm"} <= names


# Names the package's text gives before they exist, each with the reason; a name here is still checked once it
# resolves (only its absence is excused).
PENDING: dict = {}  # names a change in flight may excuse (none now)


def test_every_vitfast_name_in_the_package_text_exists():
    missing = []
    for where, name in _names():
        try:
            _resolve(name)
        except (ImportError, AttributeError) as exc:
            if name in PENDING:
                continue
            missing.append(f"{where}: {name} ({type(exc).__name__})")
    assert not missing, "names that do not exist:\n" + "\n".join(missing)
