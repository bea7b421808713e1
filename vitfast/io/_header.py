"""The safetensors header of a file, parsed by vitfast itself (private to `vitfast.io`): precise one-line messages
for truncated, corrupt or foreign files, and no tensor data read.  Shared by the fused and the train-time readers."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Tuple

from ._sniff import foreign_file

# safetensors limits the header to 100 MB; anything larger is corruption, not a model.
_MAX_HEADER = 100 * 1024 * 1024


def read_header(path: str) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """Parse the safetensors header ourselves: precise messages for truncated/corrupt files, no data read.  A file
    of another kind (a trainer checkpoint, a torch zip or pickle) is named as such, not as a corrupt header."""
    try:
        return _parse_header(path)
    except ValueError:
        what = foreign_file(path)
        if what is None:
            raise
        raise ValueError(what) from None


def _parse_header(path: str) -> Tuple[Dict[str, Any], Dict[str, str]]:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: not a safetensors file (truncated: {size} bytes, the header length alone needs 8)")
        n = int.from_bytes(head, "little")
        if n > _MAX_HEADER:
            raise ValueError(f"{path}: corrupt safetensors header (declared header length {n} bytes exceeds 100 MB)")
        if 8 + n > size:
            raise ValueError(f"{path}: truncated safetensors file (header needs {8 + n} bytes, file has {size})")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    # ValueError: UnicodeDecodeError, JSONDecodeError, an int of more than 4300 digits; RecursionError: a nesting bomb
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{path}: corrupt safetensors header (not valid JSON: {e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: corrupt safetensors header (expected a JSON object, got {type(header).__name__})")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise ValueError(f"{path}: corrupt safetensors header (__metadata__ is not an object)")
    data_len = size - 8 - n
    for key, info in header.items():
        def whole(v):  # a non-negative int (JSON true/false are ints to Python)
            return isinstance(v, int) and not isinstance(v, bool) and v >= 0

        if not (isinstance(info, dict) and isinstance(info.get("shape"), list) and isinstance(info.get("data_offsets"), list)
                and len(info["data_offsets"]) == 2 and isinstance(info.get("dtype"), str)
                and all(whole(v) for v in info["shape"]) and all(whole(v) for v in info["data_offsets"])):
            raise ValueError(f"{path}: corrupt safetensors header (bad entry for tensor {key!r}: {info!r:.200})")
        end = info["data_offsets"][1]
        if end > data_len:
            raise ValueError(
                f"{path}: truncated safetensors file (tensor {key!r} ends at data byte {end}, the file holds {data_len})"
            )
    return header, metadata
