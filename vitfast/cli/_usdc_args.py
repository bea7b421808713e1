"""USDC options (usdc-static-dynamic-compression): the gate options of `convert`, the stage-2 options of `train`.

vitfast.methods.usdc imports timm: it is imported when a command uses it (see vitfast/cli/_models.py)."""
from __future__ import annotations

import vitfast
from vitfast.cli._common import CLIError
from vitfast.cli._common import checked
from vitfast.cli._common import positive_float
from vitfast.cli._recipe_args import ffn_flags_need_channel_idle


# The gates' and keep/prune logits' learning rate relative to --lr.  The paper uses one rate (ARCH_LR_SCALE_PAPER);
# without a recipe `vitfast train` and `vitfast usdc` keep vitfast's earlier 10×: the two measured the same on the
# digits study (vitfast.methods.usdc.arch_optimizer), and the published study and runs stored without the setting
# used 10.
ARCH_LR_SCALE = 10.0
ARCH_LR_SCALE_PAPER = 1.0


def ratio(text: str) -> float:
    return checked(text, float, "a ratio in (0, 1]", lambda v: 0.0 < v <= 1.0)


def add_gate_args(p) -> None:
    g = p.add_argument_group("USDC gates and static compression (usdc-static-dynamic-compression)")
    g.add_argument("--gates", action="store_true",
                   help="per-layer decision networks that skip MHSA/FFN sub-blocks (searched over G0..G6)")
    g.add_argument("--flops-target", type=ratio, default=None,
                   help="f_t in (0, 1]: adds static keep/prune logits and the resource loss 100 (F - f_t)^2")
    g.add_argument("--gate-level", choices=("group", "sample", "batch"), default="group",
                   help="gate level in training (group: USDC's augmentation)")
    g.add_argument("--gate-kind", choices=("G0", "G1", "G2", "G3", "G4", "G5", "G6"), default=None,
                   help="one fixed gate network instead of the search")


def check_gate_options(args) -> None:
    """The gate options mean nothing without --gates (they were silently dropped: a plain θ model came out)."""
    if getattr(args, "gates", False):
        return
    given = [flag for flag, value, default in (("--flops-target", getattr(args, "flops_target", None), None),
                                               ("--gate-kind", getattr(args, "gate_kind", None), None),
                                               ("--gate-level", getattr(args, "gate_level", "group"), "group"))
             if value != default]
    if given:
        raise CLIError(f"{'/'.join(given)}: only with --gates (USDC gated blocks), got no --gates")


def add_usdc_train_args(p) -> None:
    g = p.add_argument_group("USDC (models converted with --gates)")
    g.add_argument("--usdc-prune", action="store_true",
                   help="stage 2: physically remove what stage 1 pruned and keep the best gate net, then train")
    add_arch_lr_scale_arg(g)


def add_arch_lr_scale_arg(g, default=None) -> None:
    g.add_argument("--arch-lr-scale", type=positive_float, default=default, metavar="S",
                   help=f"learning rate of the gates and keep/prune logits, relative to --lr: 1 is the paper's single "
                        f"rate (5e-4 for both); {ARCH_LR_SCALE:g}, vitfast's earlier rule, measured the same on the "
                        f"digits [default: {ARCH_LR_SCALE:g}]")


def usdc_convert(args, timm_model):
    ffn_flags_need_channel_idle(vars(args), "with --gates alone the FFNs stay timm's")
    return vitfast.convert.from_timm(
        timm_model, channel_idle=args.channel_idle, norm=args.norm if args.channel_idle is not None else None,
        heuristic=args.heuristic, gates=True, flops_target=args.flops_target, gate_level=args.gate_level,
        gate_search=args.gate_kind is None, gate_kind=args.gate_kind or "G0",
    )


def usdc_stage2(model, resume_state):
    from vitfast.methods.usdc.compression import prune
    from vitfast.methods.usdc.compression import usdc_blocks

    if resume_state is not None:
        raise CLIError("--usdc-prune: not used with --resume (the checkpoint's model is already pruned or not)")
    if not usdc_blocks(model):
        raise CLIError("--usdc-prune: SOURCE has no USDC blocks (convert with --gates first)")
    pruned = prune(model.eval()).train()
    print("USDC stage 2: pruned heads/channels/sub-blocks removed, best gate network kept per layer")
    return pruned


def usdc_optimizer(model, settings, arch_lr_scale):
    from vitfast.methods.usdc.compression import arch_optimizer
    from vitfast.methods.usdc.compression import usdc_blocks

    if not usdc_blocks(model):
        return "adamw"
    return arch_optimizer(model, settings["lr"], settings["lr"] * arch_lr_scale)
