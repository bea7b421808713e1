"""The head-ranking file of drop-in DW-conv heads (`vitfast select-heads`): Σ_h per block and head as JSON, written
atomically; `HeadRanking` picks the blocks (Σ_b) or heads (Σ_h) with the lowest scores."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple, Union

RANKING_FORMAT = "vitfast.head_ranking"


# ---------------------------------------------------------------------------------------------- Σ criterion
@dataclass
class HeadRanking:
    """Σ_h of every head (`head_scores[b][h]`, blocks in depth order) and the selections it implies."""

    head_scores: List[List[float]]
    num_samples: int
    blocks: List[str] = field(default_factory=list)  # module path of each block's attention (informational)

    def __post_init__(self) -> None:
        if not self.head_scores or any(not row for row in self.head_scores):
            raise ValueError("head_scores: expected one non-empty row of Σ_h per block, got an empty table")
        for b, row in enumerate(self.head_scores):
            for h, s in enumerate(row):
                if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s < 0:
                    raise ValueError(f"head_scores[{b}][{h}]: expected a finite number >= 0, got {s!r}")

    @property
    def num_blocks(self) -> int:
        return len(self.head_scores)

    def block_scores(self) -> List[float]:
        """Σ_b = mean of the block's Σ_h (eq. 16)."""
        return [sum(row) / len(row) for row in self.head_scores]

    def block_order(self) -> List[int]:
        """Block indices, lowest Σ_b first (ties: shallower first)."""
        scores = self.block_scores()
        return sorted(range(self.num_blocks), key=lambda b: (scores[b], b))

    def head_order(self) -> List[Tuple[int, int]]:
        """(block, head) pairs, lowest Σ_h first (ties: shallower, then lower head index, first)."""
        pairs = [(b, h) for b, row in enumerate(self.head_scores) for h in range(len(row))]
        return sorted(pairs, key=lambda p: (self.head_scores[p[0]][p[1]], p))

    def select_blocks(self, count: int) -> List[int]:
        """Blockwise selection S_b^[p_b]: the `count` blocks with the smallest Σ_b, in depth order."""
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= self.num_blocks:
            raise ValueError(f"count: expected an int in [0, {self.num_blocks}] blocks, got {count!r}")
        return sorted(self.block_order()[:count])

    def select_heads(self, count: int) -> Dict[int, List[int]]:
        """Scattered selection S_h^[p_h]: the `count` heads with the smallest Σ_h, as {block: [heads]}."""
        total = sum(len(row) for row in self.head_scores)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= total:
            raise ValueError(f"count: expected an int in [0, {total}] heads, got {count!r}")
        chosen: Dict[int, List[int]] = {}
        for b, h in self.head_order()[:count]:
            chosen.setdefault(b, []).append(h)
        return {b: sorted(hs) for b, hs in sorted(chosen.items())}

    # ------------------------------------------------------------------------------------------ JSON
    def to_dict(self) -> Dict[str, Any]:
        return {
            "format": RANKING_FORMAT,
            "version": 1,
            "num_samples": self.num_samples,
            "blocks": self.blocks,
            "head_scores": self.head_scores,
            "block_scores": self.block_scores(),
            "block_order": self.block_order(),
            "head_order": [list(p) for p in self.head_order()],
        }

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "HeadRanking":
        if not isinstance(data, dict) or data.get("format") != RANKING_FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"ranking: expected a {RANKING_FORMAT!r} object, got format {got!r}")
        if data.get("version") != 1:
            raise ValueError(f"ranking['version']: expected 1, got {data.get('version')!r}")
        scores = data.get("head_scores")
        if not isinstance(scores, list) or not all(isinstance(r, list) for r in scores):
            raise ValueError("ranking['head_scores']: expected a list of per-block lists of Σ_h")
        samples = data.get("num_samples")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError(f"ranking['num_samples']: expected an int >= 1, got {samples!r}")
        blocks = data.get("blocks", [])
        return cls([list(r) for r in scores], samples, list(blocks) if isinstance(blocks, list) else [])

    def save(self, path: Union[str, os.PathLike]) -> None:
        from .atomic import atomic_write

        text = json.dumps(self.to_dict(), indent=1)

        def write(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text + "\n")

        atomic_write(os.fspath(path), write)

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "HeadRanking":
        with open(path, "r", encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"ranking file {os.fspath(path)!r}: expected JSON, got a parse error ({e})") from None
        return cls.from_dict(data)

    def format_table(self, top: int = 10) -> str:
        """Human-readable ranking: blocks by Σ_b, then the `top` lowest-Σ_h heads."""
        lines = [f"Σ criterion over {self.num_samples} samples (lowest first = most convolution-like)",
                 "blocks by Σ_b:"]
        scores = self.block_scores()
        for rank, b in enumerate(self.block_order()):
            lines.append(f"  {rank + 1:3d}. block {b:3d}  Σ_b = {scores[b]:.6g}")
        lines.append(f"lowest {min(top, len(self.head_order()))} heads by Σ_h:")
        for rank, (b, h) in enumerate(self.head_order()[:top]):
            lines.append(f"  {rank + 1:3d}. block {b:3d} head {h:3d}  Σ_h = {self.head_scores[b][h]:.6g}")
        return "\n".join(lines)
