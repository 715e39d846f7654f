"""--model.init from a pretrained HF model (a small random GQA Llama stands in for SmolLM2; the real one is
tested in tests/model/test_hf.py): the arch its config sets, the slots a run adds without changing the
function, --model.trainable, and the refusals."""

import json
import math

import pytest
import torch
from fit_runs import fit_in_process, read_metrics
from packed_datasets import make_dataset

from data_prep.dataset import load_probe
from pipeline.model import ModelConfig, Transformer
from pipeline.model.hf_native import from_hf
from pipeline.train import init_from
from pipeline.train.init_from import init_arch, read_init


@pytest.fixture(scope="module")
def llama_ds(tmp_path_factory, hf_tokenizer):
    """A dataset in the vocabulary of tiny_llama_dir's tokenizer."""
    return make_dataset(tmp_path_factory.mktemp("llama_ds") / "ds", V=len(hf_tokenizer))


def _run_arch(tiny_llama_dir, **overrides):
    return init_arch(str(tiny_llama_dir), ModelConfig(**overrides), 300)


@pytest.mark.parametrize(
    "slot",
    [
        {"attention": {"sink_logit": True}},
        {"biases": {"kind": "kv", "slot_logit": True}},
        {"biases": {"kind": "k", "slot_logit": True, "value_norm": 3.0}, "attention": {"sink_logit": True}},
    ],
    ids=["sink", "kv", "k+sink"],
)
def test_an_added_slot_starts_where_the_function_is_the_sources(tiny_llama_dir, slot):
    """Logits of the retrofitted model equal the source's within float32 rounding on the probe set the slot
    logits were set on; with those logits at 0 they do not."""
    arch = _run_arch(tiny_llama_dir, **slot)
    assert (arch.d_model, arch.n_heads, arch.n_kv_heads, arch.vocab_size) == (32, 4, 2, 300)
    source = from_hf(str(tiny_llama_dir)).eval()
    probe = torch.randint(0, 300, (6, 24), generator=torch.Generator().manual_seed(0))
    want = source(probe).logits
    state, tags = read_init_from(source, arch, probe)
    model = Transformer(arch).eval()
    model.load_state_dict(state)
    tolerance = 4 * torch.finfo(torch.float32).eps * want.abs().max().item()
    assert (model(probe).logits - want).abs().max().item() <= tolerance
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("sink_logit", "slot_logit")):
                p.zero_()
    assert (model(probe).logits - want).abs().max().item() > 100 * tolerance


def read_init_from(source, arch, probe, margin=init_from.SLOT_MARGIN, quantile=0.0):
    """read_init with ``source`` (a SinkLab model) as the source."""
    from unittest import mock

    with mock.patch.object(init_from, "_source_model", return_value=(source, {"sinklab.init_from": "x"})):
        return read_init("x", arch, probe, margin, quantile)


@pytest.mark.parametrize("quantile", [0.0, 0.5])
def test_the_margin_counts_from_a_quantile_of_the_rows(tiny_llama_dir, quantile):
    """slot_margin log(99): the slot takes 1% of each head's row at that quantile of log-sum-exps, more of the
    rows below it, less of those above (quantile 0: the smallest row, every row at most 1%)."""
    arch = _run_arch(tiny_llama_dir, attention={"sink_logit": True})
    probe = torch.randint(0, 300, (6, 24), generator=torch.Generator().manual_seed(0))
    state, _ = read_init_from(from_hf(str(tiny_llama_dir)).eval(), arch, probe, math.log(99), quantile)
    model = Transformer(arch).double().eval()
    model.load_state_dict(state)
    with torch.no_grad():
        attentions = model(probe, output_attentions=True).attentions
    for layer in attentions:
        share = layer[..., 0].transpose(0, 1).reshape(arch.n_heads, -1)  # the slot column, per head
        at = torch.quantile(
            share, 1 - quantile, dim=-1, interpolation="higher"
        )  # the higher the row's lse, the lower its share
        assert at == pytest.approx(torch.full_like(at, 0.01), rel=1e-5)
        assert (share.amax(-1) > 0.02).all() == (quantile > 0)


def test_a_pretrained_source_keeps_its_architecture(tiny_llama_dir):
    with pytest.raises(ValueError, match=r"arch\.ffn='gelu', the source has 'swiglu'"):
        _run_arch(tiny_llama_dir, ffn="gelu")
    with pytest.raises(ValueError, match=r"arch\.preset=micro: a pretrained source sets the shape; drop it$"):
        _run_arch(tiny_llama_dir, preset="micro")


def test_fit_continues_a_pretrained_model_with_a_sink_logit_training_alone(
    tiny_llama_dir, llama_ds, tmp_path, monkeypatch, mlflow_server
):
    """Step 0's probe is `sinklab analyze`'s on the same probe set; only the sink logits move."""
    from pipeline.analysis import analyze

    run = tmp_path / "run"
    flags = ["--data.path", str(llama_ds), "--run-dir", str(run), "--model.init", str(tiny_llama_dir)]
    flags += ["--arch.preset", "null", "--arch.attention.sink_logit", "true", "--trainer.max_steps", "2"]
    flags += ["--optim.warmup_steps", "0", "--run.sink_every", "2", "--run.flow", "false"]
    assert fit_in_process([*flags, "--model.trainable", "blocks.*.attn.sink_logit"], monkeypatch, mlflow_server) == 0
    first = {r["step"]: r for r in read_metrics(run) if "sink/sink1" in r}[0]
    argv = [str(tiny_llama_dir), "--dataset", str(llama_ds), "-n", "8", "-T", "12", "--inputs", "natural"]
    assert analyze.main([*argv, "--no-plots", "--out", str(tmp_path / "a")]) == 0
    report = json.loads((tmp_path / "a" / "measures.json").read_text())
    assert first["sink/sink1"] == pytest.approx(report["table1"]["natural"], abs=1e-9)
    alpha1 = torch.tensor(report["measures"]["natural"]["alpha1"]).mean().item()  # [L, H]: per query head
    assert first["sink/alpha1_mean"] == pytest.approx(alpha1, abs=1e-6)
    ckpt = torch.load(run / "checkpoints" / "step-000002.ckpt", weights_only=False)
    source = from_hf(str(tiny_llama_dir)).state_dict()
    arch = ModelConfig.from_dict(ckpt["hyper_parameters"]["arch"])
    start, _ = read_init(str(tiny_llama_dir), arch, torch.from_numpy(load_probe(llama_ds)))
    for name, value in ckpt["state_dict"].items():
        name = name.removeprefix("model.")
        if name.endswith("sink_logit"):
            assert (value != start[name]).all() and (start[name] < -20).all()  # trained
        else:
            assert torch.equal(value, source[name]), name  # frozen, saved as it was


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--model.trainable", "blocks.*.attn.nothing"],
            "model.trainable: 'blocks.*.attn.nothing' matches no parameter",
        ),
        (["--model.slot_margin", "0"], "model.slot_margin=0.0: must be above 0"),
        (["--model.slot_quantile", "2"], "model.slot_quantile=2.0: must be in [0, 1]"),
        (["--arch.vocab_size", "64"], ""),
    ],
    ids=["glob", "margin", "quantile", "vocab"],
)
def test_refusals_are_one_line(tiny_llama_dir, llama_ds, tmp_path, monkeypatch, mlflow_server, capsys, flags, message):
    data = llama_ds if message else make_dataset(tmp_path / "ds64", V=64)
    if not message:
        flags, message = (
            [],
            "the dataset has a vocabulary of 64 ids, the model 300; prepare it with the model's tokenizer",
        )
    run = tmp_path / "run"
    base = [
        "--data.path",
        str(data),
        "--run-dir",
        str(run),
        "--model.init",
        str(tiny_llama_dir),
        "--arch.preset",
        "null",
    ]
    assert fit_in_process([*base, *flags], monkeypatch, mlflow_server) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and err[-1].startswith("sinklab fit: "), err[-3:]
    assert not (run / "config.yaml").exists()
