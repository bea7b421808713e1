"""USDC learning rate of the architecture parameters: one rate for everything (the paper's recipe) with
`arch_optimizer(model, lr)`, a separate rate when asked, and `--arch-lr-scale` on `vitfast usdc`."""
import pytest
from helpers import randomize
from timm.models.vision_transformer import VisionTransformer

import vitfast
from vitfast.methods.usdc import arch_optimizer, arch_parameters

pytestmark = pytest.mark.usefixtures("one_thread")


def _model():
    vit = randomize(VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=10),
                    seed=0)
    return vitfast.convert.from_timm(vit, gates=True, flops_target=0.6)


def _groups(model, make):
    groups = [{"params": [p for p in model.parameters()], "weight_decay": 0.05}]
    return make(groups).param_groups


@pytest.mark.parametrize("arch_lr,expected", [(None, 1e-3), (1e-3, 1e-3), (1e-2, 1e-2)])
def test_arch_optimizer_rates(arch_lr, expected):
    model = _model()
    groups = _groups(model, arch_optimizer(model, 1e-3, arch_lr))
    arch = {id(p) for p in arch_parameters(model)}
    arch_group = [g for g in groups if any(id(p) in arch for p in g["params"])]
    assert len(arch_group) == 1 and all(id(p) in arch for p in arch_group[0]["params"])
    assert arch_group[0]["lr"] == pytest.approx(expected) and arch_group[0]["weight_decay"] == 0.0
    assert [g["lr"] for g in groups if g is not arch_group[0]] == [pytest.approx(1e-3)]
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_cli_usdc_takes_the_scale(monkeypatch, tmp_path):
    from vitfast.cli import main
    import vitfast.cli.usdc as usdc_cli

    seen = {}

    def fake_study(**kwargs):
        seen.update(kwargs)
        return {}

    monkeypatch.setattr(usdc_cli, "run_usdc_study", fake_study)
    assert main(["usdc", "--quick", "--out", str(tmp_path), "--arch-lr-scale", "1", "--no-progress"]) == 0
    assert seen["arch_lr_scale"] == 1.0
    assert main(["usdc", "--quick", "--out", str(tmp_path), "--no-progress"]) == 0
    assert seen["arch_lr_scale"] == 10.0
    assert main(["usdc", "--arch-lr-scale", "0"]) == 2
