"""The lm-evaluation-harness adapter on a SinkLab micro model and a local multiple-choice task."""

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from analysis_helpers import micro_model


@pytest.fixture(scope="module")
def micro_lm(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from pipeline.analysis.lm_eval_adapter import SinkLabLM
    from pipeline.model import save_pretrained

    root = tmp_path_factory.mktemp("lm_eval")
    words = "<|endoftext|> [UNK] the cat dog sat on mat a red blue sky is sea green grass".split()
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(root / "tokenizer.json"))
    ckpt = save_pretrained(micro_model(max_seq_len=8), root / "ckpt")
    return SinkLabLM(pretrained=str(ckpt), tokenizer=str(root / "tokenizer.json")), root


def _req(*args):
    return SimpleNamespace(args=args)


def _direct_logprob(model, ids):
    with torch.no_grad():
        logp = F.log_softmax(model(torch.tensor([ids])).logits[0], -1)
    return sum(logp[i - 1, ids[i]].item() for i in range(1, len(ids)))


def test_loglikelihood_matches_direct_computation(micro_lm):
    lm, _ = micro_lm
    ((ll, greedy),) = lm.loglikelihood([_req("the cat sat", " on the mat")])
    ids = lm.encode("the cat sat on the mat")
    with torch.no_grad():
        logp = F.log_softmax(lm.model(torch.tensor([ids])).logits[0], -1)
    assert ll == pytest.approx(sum(logp[i - 1, ids[i]].item() for i in range(3, 6)), abs=1e-5)
    assert greedy == all(logp[i - 1].argmax().item() == ids[i] for i in range(3, 6))


def test_batched_scoring_equals_one_request_at_a_time(micro_lm):
    lm, _ = micro_lm
    requests = [
        _req("the cat", " sat on the mat"),
        _req("", " sky"),
        _req("a red dog sat on", " the green grass"),
        _req("the sea is", " blue"),
        _req("green grass", " is green"),
    ]
    lm.batch_size = 1
    alone = lm.loglikelihood(requests)
    alone_rolling = lm.loglikelihood_rolling([_req("the cat sat"), _req(" ".join(["a blue sky is green"] * 4))])
    lm.batch_size = 3  # rows of different lengths, right-padded in one batch
    try:
        batched = lm.loglikelihood(requests)
        batched_rolling = lm.loglikelihood_rolling([_req("the cat sat"), _req(" ".join(["a blue sky is green"] * 4))])
    finally:
        lm.batch_size = 1
    assert [g for _, g in batched] == [g for _, g in alone]
    assert [ll for ll, _ in batched] == pytest.approx([ll for ll, _ in alone], abs=1e-5)
    assert batched_rolling == pytest.approx(alone_rolling, abs=1e-5)


def test_loglikelihood_rolling_windows(micro_lm):
    lm, _ = micro_lm
    short = "the cat sat on the mat"  # 6 tokens fit the 8-token context: [eot] + text in one pass
    (got,) = lm.loglikelihood_rolling([_req(short)])
    assert got == pytest.approx(_direct_logprob(lm.model, [lm.eot_id] + lm.encode(short)), abs=1e-5)
    long = " ".join(["the red cat sat on a blue mat"] * 3)  # 24 tokens: several disjoint windows
    (got_long,) = lm.loglikelihood_rolling([_req(long)])
    ids = [lm.eot_id] + lm.encode(long)
    assert got_long < got and len(ids) - 1 == 24  # every token scored once, so more negative mass


def test_generate_until_is_greedy(micro_lm):
    lm, _ = micro_lm
    (text,) = lm.generate_until([_req("the cat", {"until": ["\n"], "max_gen_toks": 3})])
    ids = lm.encode("the cat")
    for _ in range(3):
        with torch.no_grad():
            nxt = lm.model(torch.tensor([ids[-8:]])).logits[0, -1].argmax().item()
        if nxt == lm.eot_id:
            break
        ids.append(nxt)
    assert text == lm.tok.decode(ids[2:])


def test_simple_evaluate_on_local_task(micro_lm, tmp_path):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    lm, _ = micro_lm
    data = tmp_path / "toy.jsonl"
    docs = [
        {"q": "the cat sat on the", "choices": ["mat", "sky"], "label": 0},
        {"q": "the sky is", "choices": ["blue", "grass"], "label": 0},
        {"q": "the grass is", "choices": ["green", "sea"], "label": 0},
    ]
    data.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    (tmp_path / "toy.yaml").write_text(f"""task: sinklab_toy
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{q}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
""")
    out = simple_evaluate(model=lm, tasks=["sinklab_toy"], task_manager=TaskManager(include_path=str(tmp_path)))
    acc = out["results"]["sinklab_toy"]["acc,none"]
    # recompute: the choice with the higher log-likelihood wins
    expected = 0
    for d in docs:
        scores = [ll for ll, _ in lm.loglikelihood([_req(d["q"], " " + c) for c in d["choices"]])]
        expected += int(max(range(2), key=scores.__getitem__) == d["label"])
    assert acc == pytest.approx(expected / 3)


def test_registered_under_sinklab():
    from lm_eval.api.registry import get_model

    import pipeline.analysis.lm_eval_adapter as adapter

    assert get_model("sinklab") is adapter.SinkLabLM
