"""Non-deep ViT options (non-deep-vit-progressive-reparam) of `train` and `bench`: branches, progressive joining,
the diversity regulariser and attention-map distillation.  vitfast.methods.nondeep (timm) is imported on use."""
from __future__ import annotations

import vitfast
from vitfast.cli._common import CLIError
from vitfast.cli._common import checked
from vitfast.cli._common import existing_file
from vitfast.cli._common import nonneg_float
from vitfast.cli._common import positive_int
from vitfast.cli._models import nondeep_blocks
from vitfast.cli._recipe_args import ffn_flags_need_channel_idle


NONDEEP_TRAIN_SETTINGS = ("branches", "join_values", "join_schedule", "join_start", "join_steps", "adjust_steps",
                          "diversity_weight", "distill_teacher", "distill_weight", "global_pool")


def _join_steps(text: str):
    value = checked(text, float, "a step count >= 1 or a fraction in [0, 1) of the steps after --join-start",
                    lambda v: v >= 0 and (v < 1 or float(v).is_integer()))
    return int(value) if value >= 1 else value  # a count stays an int (stored settings, messages)


def _join_start(text: str):
    value = checked(text, float, "a step count >= 0 or a fraction in (0, 1) of the run's steps",
                    lambda v: v >= 0 and (v < 1 or float(v).is_integer()))
    return int(value) if value >= 1 or value == 0 else value


def add_nondeep_args(p, *, train: bool) -> None:
    """Non-deep ViT options (non-deep-vit-progressive-reparam): branches, progressive joining, diversity, distillation."""
    g = p.add_argument_group("non-deep ViT (parallel branches, progressive joining; timm ViT/DeiT names)")
    g.add_argument("--branches", type=positive_int, default=None, metavar="n",
                   help="n >= 2: L timm blocks -> L/n blocks of n parallel branches (fused: L/n layers); with it "
                        "--channel-idle defaults to 0 and the FFN norm to layer (--norm applies with --channel-idle)")
    g.add_argument("--join-values", action="store_true", default=None,
                   help="join the value path too (the fused attention then has value width d_h, eq. 6-7 exact)")
    if not train:
        return
    g.add_argument("--join-schedule", choices=("linear", "cosine", "exp", "sqrt"), default=None,
                   help="λ(t) during the joining steps (eq. 10-13) [default: linear]")
    g.add_argument("--join-start", type=_join_start, default=None, metavar="N",
                   help="steps before joining starts (λ = 0: the branches train apart), a count or a fraction (< 1) "
                        "of the run's steps; the paper pre-trains the branched model first (the digits study: 0.5) "
                        "[default: 0, joining from the first step]")
    g.add_argument("--join-steps", type=_join_steps, default=None, metavar="N",
                   help="joining steps (λ: 0 -> 1), a count or a fraction (< 1) of the steps after --join-start; "
                        "after them the adjustment phase runs at λ = 1 [default: 1/6, the paper's 10k of 60k]")
    g.add_argument("--adjust-steps", type=int, default=None, metavar="STEPS",
                   help="instead of --join-steps: the length of the final adjustment phase (λ = 1); joining then "
                        "takes the steps between --join-start and it")
    g.add_argument("--diversity-weight", type=nonneg_float, default=None, metavar="α",
                   help="weight of the branch-diversity regulariser (squared cosine, section 4) [default: 0.05]")
    g.add_argument("--distill-teacher", type=existing_file, default=None, metavar="PATH",
                   help="attention-map distillation from this teacher (a train-time .safetensors of a timm ViT with "
                        "the same heads and tokens, e.g. a trained deeper model from `vitfast train`)")
    g.add_argument("--distill-weight", type=nonneg_float, default=None,
                   help="weight of the attention-map MSE [default: 1.0]")
    g.add_argument("--global-pool", choices=("token", "avg"), default=None,
                   help="avg: drop the class token and pool the mean of the patch tokens, as the paper fine-tunes "
                        "(section 4); token: keep the class token [default: token]")


def apply_join_settings(model, settings, total_steps: int) -> None:
    """--join-* and --diversity-weight onto a non-deep model's blocks (refused for a model without branches)."""
    from vitfast.methods.nondeep.schedule import JoinSchedule

    given = [k for k in ("join_schedule", "join_start", "join_steps", "adjust_steps", "diversity_weight",
                         "distill_teacher", "global_pool") if settings.get(k) is not None]
    blocks = nondeep_blocks(model)
    if not blocks:
        if given:
            raise CLIError(f"--{given[0].replace('_', '-')}: only applies to a non-deep model (--branches n, or a "
                           f"file converted with --branches), got a model without branches")
        return
    start_fraction = settings.get("join_start") if isinstance(settings.get("join_start"), float) else None
    start = int(round(start_fraction * total_steps)) if start_fraction is not None else settings.get("join_start") or 0
    if start < 0 or start > total_steps:
        raise CLIError(f"--join-start: expected a step in [0, {total_steps}], got {start}")
    # a fraction stays one in the schedule (and the file): the step it names follows the run's length
    at_start = {"start_fraction": start_fraction} if start_fraction is not None else {"start_step": start}
    if settings.get("join_steps") is not None and settings.get("adjust_steps") is not None:
        raise CLIError("--join-steps/--adjust-steps: expected one of them (the other follows from the step count), got both")
    if any(settings.get(k) is not None for k in ("join_schedule", "join_start", "join_steps", "adjust_steps")):
        kind = settings.get("join_schedule") or "linear"
        if settings.get("adjust_steps") is not None:
            warmup = total_steps - start - settings["adjust_steps"]
            if warmup < 0:
                raise CLIError(f"--adjust-steps: expected at most {total_steps - start} (steps after --join-start), "
                               f"got {settings['adjust_steps']}")
            schedule = JoinSchedule(kind, warmup, **at_start)
        elif settings.get("join_steps") is not None and settings["join_steps"] >= 1:
            schedule = JoinSchedule(kind, int(settings["join_steps"]), **at_start)
        elif settings.get("join_steps") is not None:
            schedule = JoinSchedule(kind, None, warmup_fraction=settings["join_steps"], **at_start)
        else:
            schedule = JoinSchedule(kind, **at_start)
        end = start + schedule.warmup_length(total_steps)
        if end > total_steps:  # λ < 1 at the end: the run "finished", then `vitfast fuse` refused the model
            raise CLIError(f"--join-start/--join-steps/--adjust-steps: joining would end at step {end}, after the run's "
                           f"last step {total_steps}; the model fuses only once λ = 1")
        for block in blocks:
            block.schedule = schedule
    if settings.get("diversity_weight") is not None:
        for block in blocks:
            block.extra_loss_weight = settings["diversity_weight"] / len(blocks)
            for sub in (block.attn, block.mlp):
                sub.compute_diversity = block.extra_loss_weight > 0


def nondeep_source(timm_model, settings, recipe):
    """A timm ViT/DeiT made non-deep (--branches n): θ = --channel-idle or 0, FFN norm --norm with --channel-idle,
    else layer (a plain non-deep model: the same FFN as the timm one)."""
    ffn_flags_need_channel_idle(settings, "a plain non-deep model keeps timm's FFNs")
    theta = settings.get("channel_idle") or 0.0
    norm = (settings.get("norm") or "batch") if settings.get("channel_idle") is not None else "layer"
    try:
        model = vitfast.convert.from_timm(
            timm_model, branches=settings["branches"], channel_idle=theta, norm=norm,
            heuristic=settings.get("heuristic") or "static", join_values=bool(settings.get("join_values")),
            global_pool=settings.get("global_pool"),
        )
    except ValueError as exc:
        flag = "--global-pool" if str(exc).startswith("global_pool") else "--branches"
        raise CLIError(f"{flag}: {exc}") from None
    recipe.update(branches=settings["branches"], channel_idle=theta, norm=norm,
                  join_values=bool(settings.get("join_values")), global_pool=settings.get("global_pool") or "token")
    return model, recipe
