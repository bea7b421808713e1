"""What a file that is not a .safetensors is, from its first bytes and (for a zip) its entry names — nothing is
unpickled.  A torch file handed to `vitfast.load` used to be read as a safetensors header: its zip signature became
a header length of some 10^17 bytes, and the message said "corrupt" about a file that was fine, only of another
kind."""
from __future__ import annotations

import zipfile
from typing import Optional

_ZIP_MAGIC = b"PK\x03\x04"
# torch.save's legacy (non-zip) format starts with a pickled magic number: protocol 2 opcode, then a LONG1.
_LEGACY_TORCH_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
# The Trainer checkpoint's format tag (vitfast.io.trainer_checkpoint.CHECKPOINT_FORMAT) is a pickled string in
# the archive's data.pkl; reading those bytes tells the two torch zips apart without unpickling anything.
_TRAINER_TAG = b"vitfast-trainer"
_MAX_PICKLE_SCAN = 64 << 20  # a data.pkl larger than this is not read (a checkpoint's holds keys, not tensors)


def _is_trainer_checkpoint(path: str) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.filename.endswith("/data.pkl") or info.filename == "data.pkl":
                    if info.file_size > _MAX_PICKLE_SCAN:
                        return False
                    return _TRAINER_TAG in archive.read(info)
    except (zipfile.BadZipFile, OSError, RuntimeError, NotImplementedError):
        # not a readable zip (or one with an unsupported compression): not a trainer checkpoint, which is the answer
        return False
    return False


def foreign_file(path: str) -> Optional[str]:
    """One line saying what `path` is and which function opens it, when its first bytes show a torch file or a
    pickle; None otherwise.  Ask only once `path` failed to parse as a .safetensors: a real header length can start
    with the bytes of a pickle's PROTO opcode (0x80 0x02 is a 640-byte header)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_LEGACY_TORCH_MAGIC))
    except OSError:
        return None
    if head.startswith(_ZIP_MAGIC):
        if _is_trainer_checkpoint(path):
            return (f"{path}: a vitfast trainer checkpoint (a torch zip archive), not a .safetensors model; open it "
                    f"with vitfast.io.load_trainer_checkpoint, or resume training with `vitfast train --resume {path}`")
        return (f"{path}: a torch zip archive (torch.save), not a vitfast .safetensors; a state dict loads with "
                f"torch.load(path, weights_only=True), timm weights with vitfast.convert.from_timm(NAME, "
                f"checkpoint_path=path)")
    if head.startswith(_LEGACY_TORCH_MAGIC):
        return (f"{path}: a legacy torch pickle (torch.save before the zip format), not a vitfast .safetensors; a "
                f"state dict loads with torch.load(path, weights_only=True)")
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:  # PROTO opcode: a pickle of protocol 2..5
        return (f"{path}: a Python pickle, not a vitfast .safetensors (vitfast never unpickles files: save the "
                f"model with vitfast.save or vitfast.io.save_trainable)")
    return None
