"""Each paper's published training settings, as data, with where every number comes from.

A recipe is a plain dict: `settings` maps a setting to `(value, source)`, where the source names the paper's table
or section (or says plainly that the paper does not give it and whose convention stands in); `variants` hold the
per-model-size rows of a paper's table (or a paper's second protocol) as overrides of the same form.  Nothing here
trains: `vitfast.recipes.resolve` merges a recipe with explicit options and defaults, and the Trainer and `vitfast
train` apply the result.

Setting names (the same in every recipe; `KEYS` says who applies each):
  optimizer, lr, batch_size (the batch the lr belongs to), lr_scaling (how lr follows another batch: linear, sqrt
  or none), min_lr, warmup_lr (warm-up start), warmup_epochs, epochs, weight_decay, no_weight_decay (what is
  excluded, in words), layer_decay, betas, label_smoothing, mixup, cutmix, drop_path, auto_augment (timm's
  RandAugment string), color_jitter, reprob (random erasing), interpolation, repeated_aug (copies of each drawn image
  per epoch, 1: off), and the method schedule:
  join_schedule, join_start_fraction, join_steps, diversity_weight, global_pool, remove_cls, dwconv_cls,
  gamma_weight_decay, freeze_backbone, arch_lr_scale, gate_tau, search_tau, resource_gamma, distill, alpha,
  alpha_schedule, harmonic.
"""
from __future__ import annotations

import copy
from typing import Any, Dict, Tuple

__all__ = ["RECIPES", "KEYS", "get_recipe", "recipe_names"]

# The DeiT recipe (Touvron et al. 2021) that RePaViT (App. A) and the non-deep ViT (App. A.1, supervised) follow:
# the values of DeiT's training script (facebookresearch/deit main.py defaults).
def _deit_aug(where: str) -> Dict[str, Tuple[Any, str]]:
    """DeiT's augmentations, which the paper follows at `where`, with the values of DeiT's training script."""
    src = f"{where}: DeiT augmentations (Touvron et al. 2021; deit main.py default"
    return {
        "auto_augment": ("rand-m9-mstd0.5-inc1", f"{src} --aa)"),
        "color_jitter": (0.4, f"{src} --color-jitter; timm's transform skips it under RandAugment)"),
        "reprob": (0.25, f"{src} --reprob)"),
        "mixup": (0.8, f"{src} --mixup)"),
        "cutmix": (1.0, f"{src} --cutmix)"),
        "label_smoothing": (0.1, f"{src} --smoothing)"),
        "interpolation": ("bicubic", f"{src} --train-interpolation)"),
        "repeated_aug": (3, f"{src} --repeated-aug, RASampler num_repeats=3)"),
    }


_TIMM_SCALING = "not in the paper: timm's train.py rule (sqrt for Adam-family and LAMB optimizers)"
_NO_WD = ("1-D parameters (norms, biases), pos_embed, cls_token, and every parameter a method marks "
          "`_no_weight_decay`")
_NO_WD_SOURCE = "not in the paper: DeiT/timm's convention (no_weight_decay())"

RECIPES: Dict[str, Dict[str, Any]] = {
    "repavit": {
        "paper": "RePaViT (papers/repavit-channel-idle-ffn), Appendix A, Table 7; sec. 4.1",
        "settings": {
            "optimizer": ("lamb", "Table 7; App. A (LAMB for the large batch)"),
            "lr": (4e-3, "Table 7 (DeiT-Tiny/Small/Base row)"),
            "batch_size": (4096, "Table 7; App. A"),
            "lr_scaling": ("none", "not in the paper; the authors' released training command passes DeiT's "
                                   "--unscale-lr, so the lr is used as given at any batch"),
            "min_lr": (5e-5, "Table 7"),
            "warmup_lr": (1e-6, "Table 7; sec. 4.1"),
            "warmup_epochs": (20, "sec. 4.1 (20 epochs of warm-up)"),
            "epochs": (300, "Table 7; App. A"),
            "weight_decay": (0.05, "Table 7"),
            "no_weight_decay": (_NO_WD, _NO_WD_SOURCE),
            "drop_path": (0.1, "Table 7"),
            **_deit_aug("App. A"),
        },
        "variants": {
            "deit": {},
            "vit_large": {"lr": (1e-3, "Table 7 (ViT-Large/Huge rows)"),
                          "drop_path": (0.3, "Table 7 (ViT-Large/Huge rows)")},
            "vit_huge": {"lr": (1e-3, "Table 7 (ViT-Large/Huge rows)"),
                         "drop_path": (0.3, "Table 7 (ViT-Large/Huge rows)")},
            "swin": {"lr": (4e-3, "Table 7 (Swin rows)"), "drop_path": (0.1, "Table 7 (Swin rows)")},
            "lvvit": {"batch_size": (1024, "Table 7 (LV-ViT rows)"), "lr": (1e-3, "Table 7 (LV-ViT rows)"),
                      "min_lr": (1e-5, "Table 7 (LV-ViT rows)")},
        },
    },
    "nondeep": {
        "paper": "Non-deep ViT (papers/non-deep-vit-progressive-reparam), App. A.1 Table 7, A.2, A.3 Table 9; sec. 4",
        "settings": {
            "optimizer": ("adamw", "App. A.1 Table 7 (supervised DeiT pre-training)"),
            "lr": (1e-3, "App. A.1 Table 7"),
            "batch_size": (1024, "App. A.1 Table 7"),
            "lr_scaling": ("linear", "App. A.3 (linear rule, Goyal et al. 2017)"),
            "min_lr": (1e-5, "not in the paper: DeiT's main.py --min-lr (the paper follows Touvron et al. 2021)"),
            "warmup_lr": (1e-6, "not in the paper: DeiT's main.py --warmup-lr"),
            "warmup_epochs": (5, "App. A.1 Table 7"),
            "epochs": (300, "App. A.1 Table 7"),
            "weight_decay": (0.05, "App. A.1 Table 7"),
            "betas": ((0.9, 0.999), "App. A.1 Table 7 (momentum 0.9); A.3 Table 9"),
            "no_weight_decay": (_NO_WD, _NO_WD_SOURCE),
            "drop_path": (0.1, "not in the paper: DeiT's main.py --drop-path (App. A.1 follows Touvron et al. 2021)"),
            **_deit_aug("App. A.1"),
            # pre-train, then join (A.2): the branches train apart, joining starts after pre-training
            "join_start_fraction": (0.5, "A.2 pre-trains then joins; the split is vitfast's (digits study, "
                                         "docs/methods/nondeep.md: joining from step 0 trained worse)"),
            "join_steps": (1 / 6, "A.2: 10k-step λ warm-up of a 60k-step joining phase"),
            "join_schedule": ("linear", "A.2; Table 5 (linear is the default)"),
            "diversity_weight": (0.05, "sec. 4 (α = 0.05)"),
            "global_pool": ("avg", "sec. 4, model setup (global average pooling replaces the class token)"),
        },
        "variants": {
            "pretrain": {},
            # The self-supervised (MAE) models' fine-tuning protocol, Table 9; supervised models are not fine-tuned.
            "finetune": {
                "lr": (1e-3, "App. A.3 Table 9 (base lr, batch 256)"),
                "batch_size": (256, "App. A.3 (lr = base lr x batch / 256)"),
                "warmup_epochs": (5, "App. A.3 Table 9"),
                "epochs": (100, "App. A.3 Table 9 ({100, 300})"),
                "layer_decay": (0.85, "App. A.3 Table 9"),
                "auto_augment": ("rand-m10-mstd0.5", "App. A.3 Table 9: RandAug(10, 0.5)"),
                "color_jitter": (0.3, "App. A.3 Table 9"),
                "label_smoothing": (0.0, "App. A.3 Table 9"),
                "mixup": (0.2, "App. A.3 Table 9"),
                "cutmix": (0.0, "App. A.3 Table 9"),
                "drop_path": (0.0, "App. A.3 Table 9"),
                "reprob": (0.0, "not in Table 9 (no random erasing listed)"),
                "repeated_aug": (1, "not in Table 9 (1: each image once per epoch)"),
            },
        },
    },
    "dwconv": {
        "paper": "Drop-in DW conv (papers/dropin-depthwise-conv-attention), sec. 3.2.2; App. A.2.1, A.3.1, A.3.2",
        "settings": {
            "optimizer": ("adamw", "App. A.2.1"),
            "epochs": (25, "App. A.2.1: second stage = half the 50 first-stage epochs (classification)"),
            "lr_scaling": ("none", "App. A.2.1: the second stage halves the batch and keeps the hyperparameters"),
            "warmup_epochs": (None, "App. A.2.1: linear warm-up, length not given"),
            "no_weight_decay": ("the convolution kernels (and " + _NO_WD + ")",
                                "App. A.2.1 (kernels excluded from L2 regularisation)"),
            "gamma_weight_decay": (True, "App. A.2.1 excludes only the kernels: γ decays"),
            "auto_augment": (None, "App. A.2.1: random crop and horizontal flip only"),
            "reprob": (0.0, "App. A.2.1: random crop and horizontal flip only"),
            "mixup": (0.0, "App. A.2.1: random crop and horizontal flip only"),
            "cutmix": (0.0, "App. A.2.1: random crop and horizontal flip only"),
            "label_smoothing": (0.0, "App. A.2.1: cross-entropy, nothing else listed"),
            "remove_cls": (True, "App. A.3.2 (the class token removed, mean of the tokens pooled)"),
            "dwconv_cls": ("exclude", "App. A.3.2: Σ_h over patch tokens (the model has no class token)"),
            "freeze_backbone": (False, "sec. 3.2.2 fine-tunes everything; Table A.1's frozen backbone: variant"),
        },
        "variants": {
            "stage2": {},
            "frozen": {"freeze_backbone": (True, "App. A.3.1, Table A.1 (only the replaced heads train)")},
        },
    },
    "usdc": {
        "paper": "USDC (papers/usdc-static-dynamic-compression), supplementary (implementation details); sec. 3.4",
        "settings": {
            "optimizer": ("adamw", "supplementary: AdamW"),
            "lr": (5e-4, "supplementary: lr 5e-4"),
            "batch_size": (256, "supplementary: batch 256"),
            "lr_scaling": ("sqrt", _TIMM_SCALING),
            "epochs": (300, "supplementary: 300 epochs"),
            "weight_decay": (0.05, "supplementary: weight decay 0.05"),
            "no_weight_decay": ("the decision parameters: static keep/prune logits, gate-search logits and the gate "
                                "networks (vitfast.methods.usdc.arch_optimizer), and " + _NO_WD,
                                "not in the paper: architecture parameters are not weights (DARTS)"),
            "arch_lr_scale": (1.0, "supplementary: one learning rate (5e-4) for everything"),
            "gate_tau": (5.0, "supplementary: Gumbel τ = 5 for dynamic skipping"),
            "search_tau": (2.0, "supplementary: Gumbel τ = 2 for the gate search and static compression"),
            "resource_gamma": (100.0, "sec. 3.4, eq. 9 (γ = 100)"),
        },
        "variants": {},
    },
    "distill": {
        "paper": "Swin distillation (papers/swin-distillation-compression), sec. IV-A, IV-B, IV-D; Table VII",
        "settings": {
            "optimizer": ("adamw", "sec. IV-A"),
            "lr": (2e-4, "sec. IV-A (initial lr 0.0002)"),
            "lr_scaling": ("none", "sec. IV-A gives no batch size"),
            "warmup_epochs": (5, "sec. IV-A"),
            "epochs": (60, "sec. IV-A"),
            "weight_decay": (0.01, "sec. IV-A"),
            "no_weight_decay": (_NO_WD, _NO_WD_SOURCE),
            "distill": ("mse", "sec. IV-B2 (MSE on logits instead of KL: no τ)"),
            "harmonic": ((13.0, 1.0), "sec. IV-D, Table VII (weighted harmonic mean, w_d = 13, w_s = 1)"),
        },
        "variants": {
            "alpha": {"harmonic": (None, "sec. IV-C uses eq. 1"),
                      "alpha_schedule": ((0.0, 0.5), "sec. IV-C, Table VI (α linear 0 -> 0.5)")},
        },
    },
}

# Who applies a setting: "trainer" (Trainer(recipe=...)), "data" (the loaders), "model" (when the model is built),
# "method" (the method's options in `vitfast train`), "info" (described, nothing to apply).
KEYS: Dict[str, str] = {
    **{k: "trainer" for k in ("optimizer", "lr", "batch_size", "lr_scaling", "min_lr", "warmup_lr", "warmup_epochs",
                              "epochs", "weight_decay", "layer_decay", "betas", "label_smoothing", "mixup",
                              "cutmix")},
    **{k: "data" for k in ("auto_augment", "color_jitter", "reprob", "interpolation", "repeated_aug")},
    "drop_path": "model",
    **{k: "method" for k in ("join_schedule", "join_start_fraction", "join_steps", "diversity_weight", "global_pool",
                             "remove_cls", "dwconv_cls", "gamma_weight_decay", "freeze_backbone", "arch_lr_scale",
                             "gate_tau", "search_tau", "resource_gamma", "distill", "alpha", "alpha_schedule",
                             "harmonic")},
    "no_weight_decay": "info",
}


def recipe_names() -> Tuple[str, ...]:
    """Every valid `--recipe` value: NAME and NAME:VARIANT."""
    names = []
    for name, recipe in RECIPES.items():
        names.append(name)
        names.extend(f"{name}:{v}" for v in recipe["variants"])
    return tuple(names)


def get_recipe(name: str) -> Dict[str, Any]:
    """The recipe NAME or NAME:VARIANT: {"name", "paper", "settings": {key: (value, source)}} (a copy)."""
    if not isinstance(name, str):
        raise TypeError(f"recipe: expected a name such as 'repavit' or 'repavit:vit_large', got {type(name).__name__}")
    base, _, variant = name.partition(":")
    if base not in RECIPES or (variant and variant not in RECIPES[base]["variants"]):
        raise ValueError(f"recipe: expected one of {', '.join(recipe_names())}, got {name!r}")
    recipe = RECIPES[base]
    settings = dict(recipe["settings"])
    if variant:
        settings.update(recipe["variants"][variant])
    return {"name": name, "paper": recipe["paper"], "settings": copy.deepcopy(settings)}
