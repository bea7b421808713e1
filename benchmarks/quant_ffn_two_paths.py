"""Does the channel-idle FFN need its two paths' weight ranges equalised before int8?  (issue 29, the
reparameterization-aware options.)

    cd <repo> && PYTHONPATH=$PWD python benchmarks/quant_ffn_two_paths.py --work runs/quant-digits   # ~1 min cold

The fused RePaViT FFN (eq. 6) sums two paths: GELU rows w_in[:A] followed by w_out, and linear rows w_in[A:] (the
idle channels' W2·W1, plus the block's shortcut I in the BatchNorm variant, eq. 5).  Merged branches are known to
widen weight ranges (arXiv 2212.01593); a quantizer with one weight scale per tensor gives the narrow path's rows
the wide path's step.  "Equalising the two paths" means giving each path its own scale.  This script measures, on
the demo model (benchmarks/quant_digits.py's channel-idle model, cached under --work), every FFN's own relative
output error ‖y_q − y‖ / ‖y‖ on the 360 validation digits, activations int8 per token (the definitions of
vitfast/reference/_int8.py), for three weight granularities:

  per tensor   one scale for w_in (both paths) and one for w_out (ONNX Runtime quantize_dynamic's default);
  per path     one scale for the GELU rows, one for the linear rows, one for w_out (the two paths equalised);
  per row      one scale per output channel (vitfast.quantize);

each with the shortcut quantized inside the linear rows, or taken off them and added in fp32 (`split_identity`,
vitfast.quantize's default).  Reference: the same FFN in float64.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
GRANULARITIES = ("per tensor", "per path", "per row")


def _scales(w: torch.Tensor, granularity: str, active: int) -> torch.Tensor:
    """Per-row scales [N] of w [N, K] for `granularity` (each row gets its group's max|w| / 127)."""
    from vitfast.reference._int8 import QMAX

    amax = w.abs().amax(dim=1)
    if granularity == "per tensor":
        return torch.full_like(amax, float(amax.max())) / QMAX
    if granularity == "per path":
        out = amax.clone()
        for rows in (slice(0, active), slice(active, None)):
            if out[rows].numel():
                out[rows] = amax[rows].max()
        return out / QMAX
    return amax / QMAX


def _quantize(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    from vitfast.reference._int8 import QMAX

    inv = torch.where(s > 0, 1.0 / s, torch.zeros_like(s))
    return torch.round(w * inv.unsqueeze(1)).clamp_(-QMAX, QMAX).to(torch.int8)


def ffn_error(ffn, x: torch.Tensor, granularity: str, split_identity: bool) -> float:
    """The relative output error of `ffn` (a FusedChannelIdleFFN without a norm: the BatchNorm variant) on rows x."""
    from vitfast.reference._int8 import int8_matmul, quantize_rows

    a = ffn.active_features
    w_in, b_in = ffn.w_in.detach().double(), ffn.b_in.detach().double()
    w_out, b_out = ffn.w_out.detach().double(), ffn.b_out.detach().double()
    x = x.double()
    h = x @ w_in.T + b_in
    ref = F.gelu(h[:, :a]) @ w_out.T + h[:, a:] + b_out
    identity = torch.zeros_like(w_in)
    if split_identity:
        identity[a:] = torch.eye(w_in.shape[1], dtype=w_in.dtype)
    w_q = (w_in - identity).float()
    s_in = _scales(w_q, granularity, a)
    s_out = _scales(w_out.float(), "per tensor" if granularity == "per tensor" else "per row", w_out.shape[0])
    q, s = quantize_rows(x.float())
    hq = int8_matmul(q, s, _quantize(w_q, s_in), s_in).double() + b_in + x @ identity.T
    q2, s2 = quantize_rows(F.gelu(hq[:, :a]).float())
    out = int8_matmul(q2, s2, _quantize(w_out.float(), s_out), s_out).double() + hq[:, a:] + b_out
    return float((out - ref).norm() / ref.norm())


def measure(fused_path: str) -> List[Dict[str, Any]]:
    import vitfast
    from vitfast.nn.ffn import FusedChannelIdleFFN
    from vitfast.training.data import digits_loaders

    model = vitfast.load(fused_path).eval()
    ffns = {n: m for n, m in model.named_modules() if isinstance(m, FusedChannelIdleFFN)}
    if not ffns or any(m.norm is not None or not m.linear_path for m in ffns.values()):
        raise ValueError(f"fused_path: expected a model whose FFNs are BatchNorm-variant channel-idle FFNs with a "
                         f"linear path, got {fused_path}")
    inputs: Dict[str, List[torch.Tensor]] = {n: [] for n in ffns}
    hooks = [m.register_forward_hook(lambda mod, args, out, n=n: inputs[n].append(args[0].reshape(-1, args[0].shape[-1])))
             for n, m in ffns.items()]
    _, val = digits_loaders(32, 64, seed=0, augment=False)
    with torch.no_grad():
        for images, _ in val:
            model(images)
    for h in hooks:
        h.remove()
    rows = []
    for name, ffn in ffns.items():
        x = torch.cat(inputs[name])
        a = ffn.active_features
        w = ffn.w_in.detach()
        eye = torch.eye(w.shape[1], dtype=w.dtype)
        row = {"layer": name, "gelu_rows_max": float(w[:a].abs().max()),
               "linear_rows_max": float((w[a:] - eye).abs().max()), "linear_rows_with_I_max": float(w[a:].abs().max())}
        for g in GRANULARITIES:
            for split in (False, True):
                row[f"{g}{' split' if split else ''}"] = ffn_error(ffn, x, g, split)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="quant-digits", help="benchmarks/quant_digits.py's cache of trained models")
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    sys.path.insert(0, HERE)
    import quant_digits

    path = os.path.join(args.work, quant_digits.CACHED["channel-idle"])
    if not os.path.exists(path):
        path = quant_digits.train_channel_idle(args.work, 800, 0)
    rows = measure(path)
    cols = [f"{g}{s}" for g in GRANULARITIES for s in ("", " split")]
    print(f"{'layer':<14} {'max|W| gelu':>11} {'linear':>7} {'lin+I':>6}  " + "  ".join(f"{c:>15}" for c in cols))
    for r in rows:
        print(f"{r['layer']:<14} {r['gelu_rows_max']:>11.3f} {r['linear_rows_max']:>7.3f} "
              f"{r['linear_rows_with_I_max']:>6.3f}  " + "  ".join(f"{r[c]:>15.4f}" for c in cols))
    if not args.no_record:
        import results_file

        table = {
            "title": "The channel-idle FFN's two paths in int8: relative FFN output error by weight-scale granularity",
            "script": "benchmarks/quant_ffn_two_paths.py", "command": results_file.command_line(),
            "conditions": ("demo model (RePaViT θ = 0.75, BatchNorm FFNs, 800 digits steps, seed 0); 360 validation "
                           "digits; activations int8 per token; reference float64; 'split': the shortcut I taken off "
                           "the linear rows and added in fp32 (split_identity)"),
            "columns": [{"label": "layer", "fmt": "{layer}"},
                        {"label": "max abs W, GELU rows", "fmt": "{gelu_rows_max:.3f}"},
                        {"label": "max abs W, linear rows (I off / with I)",
                         "fmt": "{linear_rows_max:.3f} / {linear_rows_with_I_max:.3f}"}]
            + [{"label": f"{g}{' + split' if s else ''}", "fmt": f"{{{g}{' split' if s else ''}:.4f}}"}
               for g in GRANULARITIES for s in (False, True)],
            "rows": rows,
        }
        print(results_file.record("quant_ffn_two_paths", table, box=quant_digits.study_box()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
