"""The thesis' MMD generators through the real train(): runs without DP say so, the DP GMMN accounts its steps,
refusals come before any release, weights from config change the loss, and checkpoints sample."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from lightning_dp.checkpoint import load_run
from lightning_dp.data.encoders import TabularEncoder
from lightning_dp.data.schema import Schema, validate
from lightning_dp.data.sources import load_breast_cancer
from lightning_dp.errors import ConfigError
from lightning_dp.kernels.mmd import mmd2_iw
from lightning_dp.models.iw_mmd_gan import IWMMDGenerator
from lightning_dp.nets.mmd_nets import ResidualELUGenerator
from lightning_dp.sample import sample_checkpoint
from lightning_dp.train import train
from tests.conftest import make_cfg, shared

GMMN = ["model=iw_gmmn", "model.generator.width=16"]
GAN = ["model=iw_mmd_gan", "model.generator.width=32", "model.generator.blocks=1", "model.discriminator.hidden=[32,32]",
       "model.discriminator.code_dim=8", "model.module.d_iters=1", "model.module.d_iters_warmup=1",
       "model.module.warmup_gen_iters=0"]
CH4 = ["model=mmd_gan_ae", "model.generator.width=32", "model.generator.blocks=1",
       "model.discriminator.hidden=[32,32,32]", "model.discriminator.code_dim=16", "model.module.batch_size=64"]
BY_CLASS = "model.weights={piecewise:[{column:diagnosis,categories:[malignant],values:[0.5]}]}"


def ledger_of(path: Path) -> dict:
    return json.loads((path / "ledger.json").read_text())


def metric_keys(path: Path) -> set[str]:
    return set(next(path.glob("logs/*/metrics.csv")).read_text().splitlines()[0].split(","))


def test_mmd_gan_ae_on_cervical_rounds_binary_columns_and_makes_no_dp_claim(tmp_path, single_thread):
    shared("cervical")
    result = train(make_cfg(tmp_path, *CH4, "data=cervical"))
    ledger = ledger_of(tmp_path)
    assert ledger["dp_claim"] is False
    assert ledger["no_dp_claim"][0]["name"] == "mmd_gan_ae/discriminator+generator+standardizer"
    assert "NO DP CLAIM" in (tmp_path / "train.log").read_text()
    assert {"train/mmd2", "train/g_loss", "train/ae_loss"} <= metric_keys(tmp_path)
    run = load_run(result["checkpoint"])
    model = run.model
    assert bool(model.standardizer.fitted)  # the z-scores travel in the checkpoint
    clip = model.hparams.weight_clip  # MMD-GAN's weight clipping bounds the encoder (and so its codes)
    assert clip and all(w.abs().max() <= clip for w in model.discriminator.encoder.parameters())
    x, y = model.sample(64, seed=0)
    c = model.n_continuous
    assert x[:, :c].min() >= 0 and x[:, :c].max() <= 1
    onehots = x[:, c:]
    assert set(onehots.unique().tolist()) <= {0.0, 1.0}
    for block in torch.split(onehots, model.block_sizes, dim=1):
        assert (block.sum(1) == 1).all()  # every binary (or missing-aware) column rounded to one category
    assert set(y.tolist()) <= {0, 1}
    synth = pd.read_csv(result["synthetic"], dtype=str)
    assert set(synth["Smokes"].dropna()) <= {"0", "1", "0.0", "1.0"} and set(synth["Biopsy"]) <= {"0", "1"}


def test_iw_mmd_gan_weights_from_config_and_its_schedule(tmp_path, single_thread, caplog):
    caplog.set_level("INFO")
    cfg = make_cfg(tmp_path, *GAN, "model.estimator=sniw", BY_CLASS, "data.batch_size=32", "model.module.batch_size=32")
    result = train(cfg)
    assert "estimator=sniw, weights: known, piecewise on ['diagnosis']" in caplog.text
    ledger = ledger_of(tmp_path)
    assert ledger["dp_claim"] is False and ledger["no_dp_claim"][0]["name"].startswith("iw_mmd_gan/discriminator")
    run = load_run(result["checkpoint"])
    assert int(run.model.gen_iters) > 0  # d_iters = 1: discriminator and generator steps alternate
    out = sample_checkpoint(result["checkpoint"], 30, tmp_path / "more.csv", seed=3)
    assert len(pd.read_csv(out)) == 30


def test_iw_gmmn_defaults_say_which_estimator_and_weights(tmp_path, single_thread, caplog):
    caplog.set_level("INFO")
    result = train(make_cfg(tmp_path, *GMMN))
    assert "IWMMDGenerator: estimator=iw, weights: uniform" in caplog.text
    ledger = ledger_of(tmp_path)
    assert ledger["dp_claim"] is False
    assert ledger["no_dp_claim"][0]["name"] == "iw_gmmn/generator+standardizer"
    assert "train/mmd2" in metric_keys(tmp_path)
    x, y = load_run(result["checkpoint"]).model.sample(40, seed=1)
    assert x.shape == (40, 30) and set(y.tolist()) <= {0, 1}


def test_iw_gmmn_under_dp_sgd_is_accounted_and_logs_nothing_private(tmp_path, single_thread):
    train(make_cfg(tmp_path, *GMMN, "model.module.standardize=none", "privacy=dp_sgd", BY_CLASS,
                   "privacy.dp_sgd.max_grad_norm=0.5"))
    ledger = ledger_of(tmp_path)
    assert ledger["dp_claim"] is True and ledger["no_dp_claim"] == []
    sgd = next(r for r in ledger["releases"] if r["name"] == "dp_sgd/generator")
    assert sgd["sensitivity"] == pytest.approx(0.5) and sgd["count"] > 0  # per-sample: Δ = C, no batch term
    assert ledger["epsilon"] <= 1.0 + 1e-9
    assert "train/mmd2" not in metric_keys(tmp_path)


def test_estimated_weights_are_fitted_on_labelled_rows(tmp_path, single_thread):
    frame = load_breast_cancer().train.sample(80, random_state=0)
    frame["weight"] = frame["diagnosis"].map({"malignant": 3.0, "benign": 1.0})
    labelled = tmp_path / "labelled.csv"
    frame.to_csv(labelled, index=False)
    result = train(make_cfg(tmp_path / "run", *GMMN, "model.estimator=sniw",
                            f"model.weights={{estimated:{{path:'{labelled}',weight_column:weight,hidden:[16]}}}}",
                            "model.mechanisms.0.steps=300"))
    ledger = ledger_of(tmp_path / "run")
    assert ledger["no_dp_claim"][0]["name"] == "iw_gmmn/generator+standardizer+weight_net"
    run = load_run(result["checkpoint"])
    model, encoder = run.model, TabularEncoder(Schema.from_dict(run.data_state["schema"]))
    x, y = encoder.transform(validate(frame[encoder.schema.names], encoder.schema))
    with torch.no_grad():  # the refitted network on the labelled rows: malignant ≈ 3 × benign, up to a constant
        w = model.weight_net(model.standardizer(model.join(x, y)))
    malignant = y == list(encoder.classes).index("malignant")
    assert 2.0 < (w[malignant].mean() / w[~malignant].mean()).item() < 4.5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([*GMMN, "privacy=dp_sgd", "model.module.standardize=none", "model.estimator=sniw"], "estimator=sniw divides"),
        ([*GMMN, "privacy=dp_sgd", "model.module.standardize=none", "model.estimator=miw"], "median over random"),
        ([*GMMN, "privacy=dp_sgd", "model.module.standardize=none", "model.estimator=id"], "duplicates a row"),
        ([*GMMN, "privacy=dp_sgd"], "model.module.standardize=none"),
        ([*CH4, "privacy=dp_sgd"], "couples every pair of real rows"),
        ([*GAN, "privacy=default"], "model=iw_gmmn model.module.standardize=none privacy=dp_sgd"),
        ([*GMMN, "model.weights={piecewise:[{column:height,values:[2.0]}]}"], "not a column"),
        ([*GMMN, "model.weights={piecewise:[{column:mean radius,cuts:[10],values:[2.0]}]}"], "one more entry"),
        ([*GMMN, "model.weights={piecewise:[{column:diagnosis,categories:[maybe],values:[2.0]}]}"], "categories"),
        ([*GMMN, "model.weights={thinning:{}}"], "exactly one of piecewise, logistic, estimated"),
        ([*GMMN, "model.weights={estimated:{path:/nonexistent.csv}}"], "does not exist"),
        ([*GMMN, "model.estimator=median"], "valid: standard, iw, miw, sniw, id"),
    ],
)
def test_refusals_come_before_any_release(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        train(make_cfg(tmp_path, *overrides))
    assert not (tmp_path / "ledger.json").exists() and not (tmp_path / ".prefit.json").exists()


def test_the_per_row_losses_give_the_gradient_of_mmd2_iw():
    """∇θ[mean_i ℓ_i + the generated rows' term] = ∇θ MMD²_IW: the decomposition the DP variant clips."""
    torch.manual_seed(0)
    module = IWMMDGenerator(ResidualELUGenerator(n_continuous=3, latent_dim=4, width=8, blocks=1), n_continuous=3,
                            standardize="none", batch_size=16)
    real, z, w = torch.randn(12, 3), torch.randn(16, 4), torch.rand(12) + 0.5
    params = list(module.generator.parameters())
    fake = module.generator(z)
    split = torch.autograd.grad(module.row_losses(real, fake, w).mean() + module.fake_term(fake), params)
    fake = module.generator(z)
    whole = torch.autograd.grad(mmd2_iw(real, fake, w, module.kernel), params)
    for a, b in zip(split, whole):
        assert torch.allclose(a, b, atol=1e-6)


def test_mmd_gan_ae_blocks_are_hard_gumbel_samples_that_keep_a_rare_category():
    """block_output=gumbel: generated one-hot blocks are one-hot in training too, drawn with the generator's
    probabilities, so a 6% category is not rounded away at sampling (linear: the majority every time)."""
    from lightning_dp.models.mmd_gan_ae import MMDGANAE
    from lightning_dp.nets.mmd_nets import AEDiscriminator

    torch.manual_seed(0)
    layout = {"n_continuous": 2, "block_sizes": [2]}
    rows = {}
    for output in ("gumbel", "linear"):
        gen = ResidualELUGenerator(**layout, width=8, blocks=1)
        with torch.no_grad():  # a head whose block logits say [0.94, 0.06] for every z
            gen.head.weight[2:].zero_()
            gen.head.bias[2:] = torch.tensor([0.0, -2.75])
        model = MMDGANAE(gen, AEDiscriminator(**layout, hidden=[8], code_dim=4), **layout, standardize="none",
                         block_output=output)
        rows[output] = model.generate(4000).detach()
    block = rows["gumbel"][:, 2:]
    assert set(block.unique().tolist()) <= {0.0, 1.0} and (block.sum(1) == 1).all()
    assert block[:, 1].mean() == pytest.approx(0.06, abs=0.015)
    assert (rows["linear"][:, 2:].argmax(1) == 0).all()
    with pytest.raises(ConfigError, match="block_output"):
        MMDGANAE(gen, AEDiscriminator(**layout, hidden=[8], code_dim=4), **layout, block_output="soft")
