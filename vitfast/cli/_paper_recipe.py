"""`vitfast train --recipe NAME`: a paper's training settings (vitfast.recipes) merged with the explicit options, the
optimizer / schedule / augmentation options they map onto, and `--print` (the resolved settings and their sources).

A recipe is a plain dict; this module maps its keys onto `vitfast train`'s own settings.  A method key applies to the
model it belongs to (non-deep pooling and joining with --branches, DW-conv's γ decay and frozen stage with DW-conv
heads, USDC's single lr with gates); for another model a printed note says it was not applied.  Keys whose option
does not exist yet are shown as "not applied yet" by --print (vitfast.recipes.resolve.NOT_APPLIED_YET), never
dropped silently."""
from __future__ import annotations

from typing import Any, Dict, Optional

from vitfast.cli._common import CLIError
from vitfast.cli._common import nonneg_float
from vitfast.cli._common import positive_int
from vitfast.cli._common import positive_float
from vitfast.cli._common import unit_float

# The settings of `vitfast train` these options add (stored in the checkpoint; --resume refuses to change them).
RECIPE_SETTINGS = ("recipe", "optimizer", "min_lr", "warmup_lr", "layer_decay", "drop_path", "mixup", "cutmix",
                   "auto_augment", "color_jitter", "reprob", "repeated_aug")
# Stored with every new run (settings["param_rules"]): γ decays by its `_weight_decay` mark and the frozen DW-conv
# stage trains W^O.  A stored run without it resumes on the groups it was trained with (method_keys_after_model).
PARAM_RULES = 1
# Recipe keys that become `vitfast train` settings of the same name when the model / options they need are there.
_METHOD_KEYS = {
    "nondeep": ("join_schedule", "join_steps", "diversity_weight", "global_pool"),
    "dwconv": ("remove_cls",),
    "usdc": ("arch_lr_scale",),
    "distill": ("distill", "alpha", "alpha_schedule", "harmonic"),
}
# The order --print lists them in.
_ORDER = ("optimizer", "lr", "batch_size", "lr_scaling", "min_lr", "warmup_lr", "warmup", "epochs", "steps",
          "weight_decay", "no_weight_decay", "layer_decay", "betas", "drop_path", "label_smoothing", "mixup", "cutmix",
          "auto_augment", "color_jitter", "reprob", "interpolation", "repeated_aug", "join_start_fraction",
          "join_steps", "join_schedule", "diversity_weight", "global_pool", "remove_cls", "dwconv_cls",
          "gamma_weight_decay", "freeze_backbone", "arch_lr_scale", "gate_tau", "search_tau", "resource_gamma",
          "distill", "alpha", "alpha_schedule", "harmonic")


def add_paper_recipe_args(p) -> None:
    g = p.add_argument_group("paper recipes and training options (docs/training.md)")
    g.add_argument("--recipe", default=None, metavar="NAME[:VARIANT]",
                   help="a paper's training settings: repavit, nondeep, dwconv, usdc, distill (variants: e.g. "
                        "repavit:vit_large, nondeep:finetune, dwconv:frozen); explicit options override it, and its "
                        "lr follows --batch-size by the recipe's rule")
    g.add_argument("--print", dest="print_settings", action="store_true",
                   help="print the resolved settings with each value's source, and exit without training")
    g.add_argument("--optimizer", default=None, metavar="NAME",
                   help="adamw, sgd, lamb or another timm.optim name [default: adamw]")
    g.add_argument("--min-lr", type=nonneg_float, default=None, help="the cosine's floor [default: 0]")
    g.add_argument("--warmup-lr", type=nonneg_float, default=None,
                   help="where the warm-up starts (timm's schedule) [default: lr / warm-up steps]")
    g.add_argument("--layer-decay", type=positive_float, default=None, metavar="F",
                   help="layer-wise lr decay in (0, 1] (timm's param groups) [default: off]")
    g.add_argument("--drop-path", type=unit_float, default=None,
                   help="stochastic depth rate (timm model names: drop_path_rate) [default: the model's]")
    g.add_argument("--mixup", type=nonneg_float, default=None, metavar="ALPHA", help="timm Mixup alpha [default: 0]")
    g.add_argument("--cutmix", type=nonneg_float, default=None, metavar="ALPHA", help="timm CutMix alpha [default: 0]")
    g.add_argument("--auto-augment", default=None, metavar="POLICY",
                   help="timm RandAugment policy, e.g. rand-m9-mstd0.5-inc1 (image folders) [default: none]")
    g.add_argument("--color-jitter", type=nonneg_float, default=None, help="colour jitter (image folders) [default: 0]")
    g.add_argument("--reprob", type=unit_float, default=None, help="random-erasing probability [default: 0]")
    g.add_argument("--repeated-aug", type=positive_int, default=None, metavar="N",
                   help="repeated augmentation: each drawn image N times per batch, each copy augmented on its own "
                        "(DeiT's RASampler; an epoch keeps its length) [default: 1, off]")


def check_recipe(name: Optional[str]):
    """The recipe dict for --recipe (None without); an unknown name: one line naming the valid ones."""
    if name is None:
        return None
    from vitfast.recipes import get_recipe

    try:
        return get_recipe(name)
    except ValueError as exc:
        raise CLIError(f"--{exc}") from None


def resolve_settings(settings: Dict[str, Any], given: Dict[str, Any], recipe) -> Dict[str, Any]:
    """The Setting of every recipe-related key for this run: `given` (explicit flags) > recipe > `settings`'s
    defaults.  The run's batch is --batch-size (or its default), never the paper's: that one is the reference of
    the lr rule."""
    from vitfast.recipes import TRAINER_DEFAULTS
    from vitfast.recipes import resolve

    defaults = dict(TRAINER_DEFAULTS)
    defaults.update({k: settings.get(k) for k in ("lr", "weight_decay", "warmup", "label_smoothing")})
    defaults["drop_path"] = None
    explicit = {k: given.get(k) for k in ("optimizer", "lr", "min_lr", "warmup_lr", "warmup", "weight_decay",
                                          "layer_decay", "label_smoothing", "mixup", "cutmix", "drop_path",
                                          "auto_augment", "color_jitter", "reprob", "repeated_aug", "epochs")}
    explicit.update({k: given.get(k) for keys in _METHOD_KEYS.values() for k in keys})
    resolved = resolve(recipe, explicit, defaults, batch_size=settings["batch_size"])
    from vitfast.recipes import Setting

    resolved["batch_size"] = Setting(settings["batch_size"], "explicit" if "batch_size" in given else "default")
    if recipe and "batch_size" in recipe["settings"]:
        base, source = recipe["settings"]["batch_size"]
        rule = recipe["settings"].get("lr_scaling", ("none", ""))[0]
        if base != settings["batch_size"]:
            resolved["batch_size"].note = (f"the recipe's lr is for batch {base} ({source}); "
                                           + (f"lr scaled by the {rule} rule" if rule in ("linear", "sqrt")
                                              else "lr not scaled (the recipe has no rule)"))
    if given.get("steps") is not None:
        resolved["steps"] = Setting(given["steps"], "explicit")
        if resolved.get("epochs") is not None and resolved["epochs"].origin == "recipe":
            resolved["epochs"].note += "; not used: --steps sets the length"
    if given.get("join_start") is not None and resolved.get("join_start_fraction") is not None:
        resolved["join_start_fraction"].note += f"; not used: --join-start {given['join_start']:g} given"
    return resolved


def apply_recipe(settings: Dict[str, Any], resolved, *, given: Dict[str, Any]) -> None:
    """The resolved trainer / data / model settings into `settings` (the stored settings of the run).  Method keys
    are applied later (`apply_method_keys`), once the model is known."""
    for key in ("optimizer", "lr", "min_lr", "warmup_lr", "warmup", "weight_decay", "layer_decay", "betas",
                "label_smoothing", "mixup", "cutmix", "drop_path", "auto_augment", "color_jitter", "reprob",
                "interpolation", "repeated_aug"):
        if key in resolved:
            value = resolved[key].value
            settings[key] = list(value) if isinstance(value, tuple) else value
    if settings.get("steps") is None and settings.get("epochs") is None and resolved.get("epochs") is not None \
            and resolved["epochs"].value:
        settings["epochs"] = int(resolved["epochs"].value)
    recipe_keys = {k: s for k, s in resolved.items() if s.origin == "recipe"}
    settings["recipe_method"] = {k: (list(s.value) if isinstance(s.value, tuple) else s.value)
                                 for k, s in recipe_keys.items()
                                 if k in ("join_start_fraction", "freeze_backbone", "gamma_weight_decay")
                                 or any(k in keys for keys in _METHOD_KEYS.values())}


def method_keys_before_model(settings: Dict[str, Any], *, timm_name: bool) -> None:
    """Recipe method keys that shape the model when it is built from a timm name (`timm_name`; a file keeps its
    tokens): DW-conv's class-token removal with --dwconv-blocks/--dwconv-heads, the non-deep model's global
    average pooling (class token dropped, `from_timm(branches=n, global_pool="avg")`) with --branches."""
    method = settings.get("recipe_method") or {}
    if not timm_name:
        return
    if "remove_cls" in method and settings.get("remove_cls") is None and (
            settings.get("dwconv_blocks") is not None or settings.get("dwconv_heads") is not None):
        settings["remove_cls"] = method["remove_cls"] or None
    if method.get("global_pool") is not None and settings.get("global_pool") is None \
            and settings.get("branches") is not None:
        settings["global_pool"] = method["global_pool"]


def method_keys_after_model(model, settings: Dict[str, Any], total_steps: int, *, resumed: bool = False) -> None:
    """Recipe method keys for the built model, before its optimizer is: non-deep joining (the join start stays a
    fraction of the run: `JoinSchedule.pretrain_then_join`), USDC's single lr, the distillation loss (with
    --teacher), DW-conv's γ weight decay and the frozen backbone of its second stage.  A resumed run has the values
    in its stored settings and model description already; only the frozen parameters (not stored) are set again."""
    from vitfast.cli._models import nondeep_blocks
    from vitfast.methods.dwconv import DWConvAttention

    method = settings.get("recipe_method") or {}
    if resumed:
        # A run stored before PARAM_RULES trained γ without weight decay (the 1-D rule won over `_weight_decay`)
        # and froze W^O in the frozen stage: its optimizer state holds those groups, so it resumes on them.
        legacy = settings.get("param_rules") is None
        if legacy and any(isinstance(m, DWConvAttention) for m in model.modules()):
            from vitfast.methods.dwconv import set_gamma_weight_decay

            set_gamma_weight_decay(model, False)
        if method.get("freeze_backbone"):
            _freeze_backbone(model, legacy=legacy)
        return
    dwconv_heads = [m for m in model.modules() if isinstance(m, DWConvAttention)]
    if nondeep_blocks(model):
        if "join_start_fraction" in method and settings.get("join_start") is None:
            settings["join_start"] = float(method["join_start_fraction"])  # a fraction (< 1) of the run's steps
        for key in _METHOD_KEYS["nondeep"]:
            if key in method and settings.get(key) is None and key != "global_pool":
                settings[key] = method[key]
    if "arch_lr_scale" in method and settings.get("arch_lr_scale") is None:
        settings["arch_lr_scale"] = method["arch_lr_scale"]
    if settings.get("teacher") is not None and settings.get("distill") != "none":
        loss_given = any(settings.get(k) is not None for k in ("alpha", "alpha_schedule", "harmonic"))
        if "distill" in method and settings.get("distill") is None:
            settings["distill"] = method["distill"]
        if not loss_given:
            for key in ("alpha", "alpha_schedule", "harmonic"):
                if method.get(key) is not None:
                    settings[key] = method[key]
    if method.get("gamma_weight_decay") is not None and dwconv_heads:
        # True is the heads' default; set anyway so a file converted before the option follows the paper too
        from vitfast.methods.dwconv import set_gamma_weight_decay

        set_gamma_weight_decay(model, bool(method["gamma_weight_decay"]))
    if method.get("freeze_backbone"):
        _freeze_backbone(model)
    unused = []  # said aloud, never dropped silently
    if not nondeep_blocks(model) and any(k in method for k in ("join_start_fraction",) + _METHOD_KEYS["nondeep"]
                                         if k != "global_pool"):
        unused.append("the joining schedule (the model has no branches: --branches n)")
    if method.get("global_pool") is not None and settings.get("global_pool") is None:
        unused.append(f"global_pool={method['global_pool']!r} (only for a non-deep model built from a timm name "
                      f"with --branches n; a file keeps the pooling it was made with)")
    if method.get("gamma_weight_decay") is False and not dwconv_heads:
        unused.append("γ's weight decay (the model has no DW-conv heads)")
    if method.get("remove_cls") and settings.get("remove_cls") is None:
        unused.append("removing the class token (only with --dwconv-blocks/--dwconv-heads on a timm name; a file "
                      "keeps the tokens it was converted with)")
    if settings.get("teacher") is None and any(method.get(k) is not None for k in _METHOD_KEYS["distill"]):
        unused.append("the distillation loss (no --teacher)")
    for what in unused:
        print(f"note: not applied from the recipe: {what}")


def _freeze_backbone(model, *, legacy: bool = False) -> None:
    """Table A.1 (DW-conv appendix A.3.1): the second stage trains only the replaced heads (vitfast.methods.dwconv.
    freeze_backbone: their value rows, kernels, γ and output projection); everything else keeps its weights.
    `legacy`: a run stored before PARAM_RULES, which also froze the output projection (resumed as it trained)."""
    from vitfast.methods.dwconv import DWConvAttention
    from vitfast.methods.dwconv import freeze_backbone

    try:
        freeze_backbone(model)
    except ValueError:
        raise CLIError("--recipe dwconv:frozen: trains only DW-conv heads, and the model has none "
                       "(give --dwconv-blocks/--dwconv-heads)") from None
    if legacy:
        for m in model.modules():
            if isinstance(m, DWConvAttention):
                m.proj.requires_grad_(False)


def print_settings(resolved, recipe, data: str) -> None:
    """`--print`: the recipe and its paper, then every setting with its value and source."""
    from vitfast.recipes.resolve import format_settings

    if recipe:
        print(f"recipe {recipe['name']}: {recipe['paper']}")
    else:
        print("no recipe: vitfast's defaults for small data (docs/training.md)")
    from vitfast.methods.usdc import GATE_TAU
    from vitfast.methods.usdc import SEARCH_TAU
    from vitfast.methods.usdc.compression import RESOURCE_GAMMA

    # constants vitfast.methods.usdc fixes (no option): --print says whether they are the paper's
    built_in = {"gate_tau": ("vitfast.methods.usdc GATE_TAU", GATE_TAU),
                "search_tau": ("vitfast.methods.usdc SEARCH_TAU", SEARCH_TAU),
                "resource_gamma": ("vitfast.methods.usdc RESOURCE_GAMMA", RESOURCE_GAMMA)}
    order = list(_ORDER) + [k for k in resolved if k not in _ORDER]
    print(format_settings(resolved, data="digits" if data == "digits" else "folder", order=order,
                          built_in=built_in))
