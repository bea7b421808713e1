"""Integrity record of a fused checkpoint (private to `vitfast.io`): CRC-32 of the config text and of every stored
tensor's bytes, kept in the safetensors metadata under "checksum" and verified by `vitfast.load`.

safetensors itself has no checksum: 29 of 32 single bit flips in a file's data loaded silently with other outputs.
CRC-32 detects every single-bit and every burst error up to 32 bits, and any other corruption with probability
1 - 2^-32 per tensor; it is not a signature (whoever edits a file can recompute it).  zlib's CRC-32 (standard
library, no new dependency) measured 7 GB/s against 2 GB/s for SHA-256 on the same 344 MB buffer; what
verifying adds to a DeiT-B load is the table `checkpoint_checksum` in benchmarks/results/ (bench_checkpoint_load.py).
Per tensor, not per file: a mismatch names the corrupt tensors.

Record (JSON text): {"algorithm": "crc32", "config": "<8 hex>", "tensors": {"<name>": "<8 hex>", ...}}.
"""
from __future__ import annotations

import json
import warnings
import zlib
from typing import Dict, Optional

import torch

from ._rebuild import listing

KEY = "checksum"
ALGORITHM = "crc32"


def _crc(data) -> str:
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def tensor_crc(t: torch.Tensor) -> str:
    """CRC-32 of a contiguous CPU tensor's bytes as stored by safetensors (little-endian, row-major)."""
    if t.numel() == 0:
        return _crc(b"")
    return _crc(t.detach().reshape(-1).view(torch.uint8).numpy())


def record(tensors: Dict[str, torch.Tensor], config_text: str) -> str:
    """The metadata value `vitfast.save` writes for these (contiguous CPU) tensors and this config text."""
    return json.dumps({
        "algorithm": ALGORITHM,
        "config": _crc(config_text.encode("utf-8")),
        "tensors": {name: tensor_crc(t) for name, t in sorted(tensors.items())},
    }, sort_keys=True)


def parse(path: str, metadata: Dict[str, str], stored: set) -> Optional[dict]:
    """The file's record, validated against its own header; None for files written before records existed."""
    raw = metadata.get(KEY)
    if raw is None:
        warnings.warn(
            f"{path}: written without checksums (by a vitfast before they were recorded): its data is not "
            f"verified; vitfast.save it again to add them", stacklevel=3,
        )
        return None
    try:
        rec = json.loads(raw)
    except ValueError as e:  # JSONDecodeError, and the integer-digits limit
        raise ValueError(f"{path}: metadata {KEY!r} is not valid JSON ({e})") from None
    hex8 = lambda v: isinstance(v, str) and len(v) == 8 and all(c in "0123456789abcdef" for c in v)
    if (not isinstance(rec, dict) or rec.get("algorithm") != ALGORITHM or not hex8(rec.get("config"))
            or not isinstance(rec.get("tensors"), dict) or not all(hex8(v) for v in rec["tensors"].values())):
        raise ValueError(f"{path}: metadata {KEY!r} expected {{'algorithm': {ALGORITHM!r}, 'config': <8 hex>, "
                         f"'tensors': {{name: <8 hex>}}}}, got {raw[:120]!r}")
    if set(rec["tensors"]) != stored:
        missing, extra = sorted(stored - set(rec["tensors"])), sorted(set(rec["tensors"]) - stored)
        raise ValueError(f"{path}: metadata {KEY!r} lists other tensors than the file stores (not recorded: "
                         f"{missing[:5]}, recorded but absent: {extra[:5]}): the header is corrupt")
    return rec


def verify_config(path: str, rec: Optional[dict], config_text: str) -> None:
    if rec is not None and _crc(config_text.encode("utf-8")) != rec["config"]:
        raise ValueError(f"{path}: checksum mismatch in the config (metadata 'config'): the file is corrupt "
                         f"(pass verify=False to load it anyway)")


def verify_tensors(path: str, rec: Optional[dict], tensors: Dict[str, torch.Tensor]) -> None:
    if rec is None:
        return
    bad = [name for name, t in tensors.items() if tensor_crc(t) != rec["tensors"][name]]
    if bad:
        shown = listing(sorted(bad))
        raise ValueError(f"{path}: checksum mismatch in {len(bad)} tensors: {shown}: the file is corrupt "
                         f"(pass verify=False to load it anyway)")
