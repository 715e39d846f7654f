"""An export is usable where users are: `sinklab analyze` and `sinklab stream-ppl` read it
back with the checkpoint's Sink_1 and perplexity, and lm-evaluation-harness's own HF backend
(``--model hf --model_args pretrained=DIR,trust_remote_code=True``) scores a remote-code export
as the checkpoint's own forward does."""

import json
from types import SimpleNamespace

import pytest
import torch
from analysis_helpers import micro_model

VOCAB = ["<|bos|>", "<|eos|>", "<|pad|>", *(f"w{i}" for i in range(61))]  # the micro model's 64 ids
VARIANTS = {"remote": dict(sink_tokens=1, biases={"kind": "kv"}, attention={"sink_logit": True}), "llama": {}}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Per variant: a checkpoint with its tokenizer.json beside it, and its `sinklab export-hf`."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from pipeline.cli import main as sinklab
    from pipeline.model import save_pretrained

    root = tmp_path_factory.mktemp("export_use")
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<|pad|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = {}
    for name, overrides in VARIANTS.items():
        ckpt = save_pretrained(micro_model(init_std=0.2, **overrides), root / name / "ckpt")
        tok.save(str(root / name / "tokenizer.json"))
        assert sinklab(["export-hf", str(ckpt), "--out", str(root / name / "hf")]) == 0
        out[name] = SimpleNamespace(ckpt=ckpt, hf=root / name / "hf", root=root / name)
    return out


@pytest.mark.parametrize("name", VARIANTS)
def test_analyze_and_stream_ppl_read_the_export_back(exported, name, tmp_path):
    from pipeline.analysis import analyze, stream_ppl

    paths = exported[name]
    text = tmp_path / "words.txt"
    text.write_text(" ".join(VOCAB[3:] * 2))
    found = {}
    for which in ("ckpt", "hf"):
        model = str(getattr(paths, which))
        out = tmp_path / which
        args = ["--inputs", "random,repeat", "-n", "6", "-T", "12", "--eps", "0.26", "--no-plots", "--out", str(out)]
        assert analyze.main([model, *args]) == 0
        ppl = [
            "--text",
            str(text),
            "--max-tokens",
            "24",
            "--cache",
            "1+7",
            "--full",
            "--bos",
            "yes",
            "--out",
            str(out / "ppl.json"),
        ]
        assert stream_ppl.main([model, *ppl]) == 0
        found[which] = (json.loads((out / "measures.json").read_text()), json.loads((out / "ppl.json").read_text()))
    (ckpt_report, ckpt_ppl), (hf_report, hf_ppl) = found["ckpt"], found["hf"]
    assert hf_report["kind"] == ("sinklab" if name == "remote" else "hf")
    assert hf_report["table1"] == pytest.approx(ckpt_report["table1"], abs=1e-9)
    assert 0 < max(ckpt_report["table1"].values()) < 100  # a Sink_1 that could differ
    for kind in ("random", "repeat"):
        assert hf_report["measures"][kind]["profile"] == pytest.approx(ckpt_report["measures"][kind]["profile"])
    assert hf_ppl["perplexity"] == pytest.approx(ckpt_ppl["perplexity"], rel=1e-5)
    card = (paths.hf / "README.md").read_text()
    assert "attention.sink_logit=True" in card if name == "remote" else "default block" in card


def checkpoint_loglikelihood(paths, context: str, continuation: str) -> tuple[float, bool]:
    """log p(continuation | context) and whether it is the greedy one, by the SinkLab checkpoint's forward."""
    from tokenizers import Tokenizer

    from pipeline.model import load_pretrained

    tok = Tokenizer.from_file(str(paths.root / "tokenizer.json"))
    ctx, cont = (tok.encode(t, add_special_tokens=False).ids for t in (context, continuation))
    with torch.no_grad():
        logits = load_pretrained(paths.ckpt).eval()(torch.tensor([ctx + cont[:-1]])).logits[0].float()
    rows = torch.log_softmax(logits, -1)[len(ctx) - 1 :]
    target = torch.tensor(cont)
    return rows.gather(-1, target[:, None]).sum().item(), bool((rows.argmax(-1) == target).all())


def test_lm_eval_hf_backend_scores_a_remote_code_export(exported, tmp_path):
    lm_eval = pytest.importorskip("lm_eval")  # the `eval` extra
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    paths = exported["remote"]
    hf = HFLM(pretrained=str(paths.hf), trust_remote_code=True, batch_size=2, device="cpu")
    assert type(hf.model).__name__ == "SinkLabForCausalLM"
    pairs = [("w1 w2 w3", " w4 w5"), ("w9", " w10"), ("w7 w7", " w8")]
    got = hf.loglikelihood([SimpleNamespace(args=pair) for pair in pairs])
    expected = [checkpoint_loglikelihood(paths, *pair) for pair in pairs]
    assert [g for _, g in got] == [g for _, g in expected]
    assert [ll for ll, _ in got] == pytest.approx([ll for ll, _ in expected], abs=1e-4)
    data = tmp_path / "toy.jsonl"
    docs = [{"q": "w1 w2 w3", "choices": ["w4", "w50"], "label": 0}, {"q": "w9", "choices": ["w10", "w3"], "label": 1}]
    data.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    (tmp_path / "toy.yaml").write_text(
        f"task: sinklab_export_toy\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        'test_split: test\noutput_type: multiple_choice\ndoc_to_text: "{{q}}"\ndoc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{label}}"\nmetric_list:\n  - metric: acc\n'
    )
    result = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={paths.hf},trust_remote_code=True",
        tasks=["sinklab_export_toy"],
        task_manager=TaskManager(include_path=str(tmp_path)),
        device="cpu",
    )
    scores = [[checkpoint_loglikelihood(paths, d["q"], " " + c)[0] for c in d["choices"]] for d in docs]
    accuracy = sum(max(range(2), key=s.__getitem__) == d["label"] for s, d in zip(scores, docs)) / len(docs)
    assert result["results"]["sinklab_export_toy"]["acc,none"] == pytest.approx(accuracy)
