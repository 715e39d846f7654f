"""`sinklab analyze` on real pretrained models (SmolLM2, Gemma-3), tiny random HF models and a
SinkLab checkpoint, checked against metrics recomputed independently from HF's own eager maps."""

import json
import re

import pytest
import torch
from analysis_helpers import HAMLET, WORDS, micro_dataset, micro_model

from pipeline import flow
from pipeline.analysis import analyze, inputs
from pipeline.analysis.hf_capture import capture, hf_sink_measures
from sinklab_io.outputs import write_output


def _args(*argv):
    return analyze.check_args(analyze.build_parser().parse_args(list(argv)))


def _independent_alpha1(model, tokens):
    """α_1 per [N, L, H] straight from HF eager attention (output_attentions)."""
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attn = model(input_ids=tokens, output_attentions=True, use_cache=False).attentions
    return torch.stack([a[..., :, 0].mean(-1) for a in attn], dim=1)


def test_smollm2_table1_and_plots(smollm2, tmp_path):
    rec = analyze.run(smollm2, _args("smollm2", "-n", "3", "-T", "16", "--out", str(tmp_path)))
    assert set(rec["table1"]) == {"natural", "random", "repeat"}
    on_disk = json.loads((tmp_path / "measures.json").read_text())
    assert on_disk["table1"] == rec["table1"]
    nat = rec["measures"]["natural"]
    assert len(nat["alpha1"]) == 30 and len(nat["alpha1"][0]) == 9  # 30 layers x 9 heads
    assert nat["profile"][0] == nat["sink1"] and len(nat["profile"]) == 10
    # the massive-activation curve and the key/value ratios cover every layer
    assert len(nat["massive_ratio"]) == 30 and len(nat["key_norm_ratio"]) == 30
    # the information flow of every layer, and where the BOS norm jumps and the entropy drops
    assert len(nat["flow"]["entropy"]) == len(nat["flow"]["mixing"]) == 30 and nat["flow"]["position"] == 8
    assert 0 <= rec["flow"]["natural"]["flow/norm_jump_layer"] < 30
    assert rec["flow"]["natural"]["flow/mixing_l29"] == pytest.approx(nat["flow"]["mixing"][29])
    for png in ("sink_profile.png", "alpha1_natural.png", "norm_ratio.png", "qk_decomposition.png", "flow.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
    # one repeated token: every sequence is a single token id repeated
    ids = inputs.probe_sets(smollm2, _args("smollm2", "-n", "3", "-T", "16"))
    assert all(len(set(row.tolist())) == 1 for row in ids["repeat"])
    assert not set(ids["random"].flatten().tolist()) & smollm2.special_ids


def test_smollm2_metrics_match_eager_attention(smollm2):
    tokens = torch.randint(0, 49152, (3, 16), generator=torch.Generator().manual_seed(1))
    measures = hf_sink_measures(smollm2.model, tokens, eps=0.3, batch_size=2)
    alpha = _independent_alpha1(smollm2.model, tokens)
    assert torch.allclose(measures.alpha1, alpha.mean(0), atol=1e-5)
    assert measures.sink1 == pytest.approx(100.0 * (alpha > 0.3).double().mean().item())
    # each head's output is A·V of HF's own maps and the (repeated) value heads
    full = capture(smollm2.model, tokens)
    by_hand = torch.stack([(a @ v).norm(dim=-1).mean(dim=(0, -1)) for a, v in zip(full.attentions, full.values)])
    assert measures.out_norm.shape == (30, 9) and torch.allclose(measures.out_norm, by_hand, rtol=1e-4)
    assert measures.entropy.shape == (30, 9) and 0.0 <= measures.entropy.min() and measures.entropy.max() <= 1.0
    # over-mixing: the hooked perturbation equals one fed through HF's own inputs_embeds
    g = torch.Generator().manual_seed(flow.DIRECTION_SEED)
    spread = []
    for batch in (tokens[:2], tokens[2:]):
        with torch.no_grad():
            e = smollm2.model.get_input_embeddings()(batch)
            u = torch.randn(len(batch), e.shape[-1], generator=g, dtype=torch.float64).float()
            moved = e.clone()
            moved[:, 8] += flow.DEFAULT_RHO * e[:, 8].norm(dim=-1, keepdim=True) * u / u.norm(dim=-1, keepdim=True)
            clean, pert = (smollm2.model(inputs_embeds=x, output_hidden_states=True).hidden_states for x in (e, moved))
        spread.append(
            torch.stack([flow.perturbation_spread(a, b, 8, flow.DEFAULT_RHO) for a, b in zip(clean, pert)], 1)
        )
    torch.testing.assert_close(measures.flow.mixing[:-1], torch.cat(spread).mean(0)[1:-1], rtol=1e-3, atol=1e-4)
    # hidden states of the last block are read before the final norm
    c = capture(smollm2.model, tokens[:1])
    with torch.no_grad():
        hf = smollm2.model(input_ids=tokens[:1], output_hidden_states=True).hidden_states
    assert torch.allclose(c.hidden_states[0], hf[1], atol=1e-5)
    assert torch.allclose(smollm2.model.model.norm(c.hidden_states[-1]), hf[-1], atol=1e-4)
    assert not torch.allclose(c.hidden_states[-1], hf[-1], atol=1e-3)


def test_gemma3_cli(tmp_path, capsys):
    assert analyze.main(["gemma3-270m", "-n", "2", "-T", "12", "--out", str(tmp_path), "--no-plots"]) == 0
    rec = json.loads((tmp_path / "measures.json").read_text())
    assert rec["kind"] == "hf" and rec["source"].endswith("gemma-3-270m-q4_k_m.gguf")
    assert len(rec["measures"]["natural"]["alpha1"]) == 18  # Gemma-3-270M: 18 layers, 4 heads
    assert "| natural | random | repeat |" in capsys.readouterr().out


def test_gpt2_learned_position_edits(tiny_gpt2_dir, tmp_path):
    subject = analyze.Subject(str(tiny_gpt2_dir), "auto")
    wpe = subject.model.transformer.wpe.weight
    before = wpe.detach().clone()
    rec = analyze.run(
        subject,
        _args(
            str(tiny_gpt2_dir),
            "-n",
            "4",
            "-T",
            "16",
            "--inputs",
            "natural",
            "--text",
            str(HAMLET),
            "--no-plots",
            "--gpt2-positions",
            "replace:5",
            "--gpt2-positions",
            "swap:5,12",
            "--out",
            str(tmp_path),
        ),
    )
    assert torch.equal(wpe, before)  # restored
    rows = {(r["mode"], r["t"]): r for r in rec["learned_positions"]}
    assert set(rows) == {("replace", 5), ("swap", 5), ("swap", 12)}
    nat = inputs.natural_tokens(subject, _args(str(tiny_gpt2_dir), "-n", "4", "-T", "16", "--text", str(HAMLET)))
    for (mode, t), row in rows.items():  # recompute each edit by hand
        with torch.no_grad():
            wpe.copy_(before)
            wpe[0] = before[t - 1]
            if mode == "swap":
                wpe[t - 1] = before[0]
        manual = hf_sink_measures(subject.model, nat, positions=t)
        with torch.no_grad():
            wpe.copy_(before)
        assert row["sink1"] == pytest.approx(manual.sink1) and row["sink_t"] == pytest.approx(manual.profile[t - 1])


def test_pile_domains_and_mlflow(tiny_llama_dir, tmp_path, mlflow_server):
    shard = tmp_path / "shard.jsonl"
    words = HAMLET.read_text().split()
    docs = [
        {"text": " ".join(words[i * 60 : (i + 1) * 60]), "meta": {"pile_set_name": d}}
        for i, d in enumerate(["Pile-CC", "ArXiv", "Pile-CC", "ArXiv", "Github"])
    ]
    shard.write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    rec = analyze.main(
        [
            str(tiny_llama_dir),
            "-n",
            "2",
            "-T",
            "8",
            "--text",
            str(HAMLET),
            "--pile",
            str(shard),
            "--out",
            str(tmp_path / "o"),
            "--mlflow-uri",
            mlflow_server,
            "--experiment",
            "analysis-test",
        ]
    )
    assert rec == 0
    out = json.loads((tmp_path / "o" / "measures.json").read_text())
    assert set(out["domains"]) == {"Pile-CC", "ArXiv", "Github"}
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=mlflow_server)
    run = client.get_run(out["mlflow_run_id"])
    assert run.data.metrics["table1/natural"] == pytest.approx(out["table1"]["natural"])
    assert "domain/Pile-CC" in run.data.metrics
    assert run.data.metrics["natural/flow/mixing_l1"] == pytest.approx(out["measures"]["natural"]["flow"]["mixing"][1])
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"measures.json", "sink_profile.png"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        analyze.main(
            [str(tiny_llama_dir), "-n", "2", "-T", "8", "--pile", str(bad), "--no-plots", "--out", str(tmp_path / "b")]
        )


def test_sinklab_checkpoint(tmp_path):
    from pipeline.model import save_pretrained

    ckpt = save_pretrained(micro_model(sink_tokens=1), tmp_path / "ckpt")
    assert (
        analyze.main([str(ckpt), "--inputs", "random,repeat", "-n", "5", "-T", "12", "--out", str(tmp_path / "o")]) == 0
    )
    rec = json.loads((tmp_path / "o" / "measures.json").read_text())
    assert rec["kind"] == "sinklab" and set(rec["measures"]["random"]["sink_star"]) == {"0"}
    assert len(rec["measures"]["repeat"]["flow"]["mixing"]) == 2 and "flow/entropy_drop_layer" in rec["flow"]["random"]
    with pytest.raises(SystemExit, match="--dataset"):
        analyze.main([str(ckpt), "--inputs", "natural", "-n", "2", "-T", "8", "--out", str(tmp_path / "o2")])

    # its own output is rewritten; a file it did not write (or one edited since) never is, refused before any work
    again = [str(ckpt), "--inputs", "random", "-n", "2", "-T", "8", "--no-plots", "--out", str(tmp_path / "o")]
    (tmp_path / "o" / "notes.txt").write_text("mine")
    assert analyze.main(again) == 0 and (tmp_path / "o" / "notes.txt").read_text() == "mine"
    assert set(json.loads((tmp_path / "o" / "measures.json").read_text())["measures"]) == {"random"}
    (tmp_path / "o" / "measures.json").write_text("edited by hand")
    with pytest.raises(SystemExit, match="--out .*o: already holds measures.json, which sinklab did not write"):
        analyze.main(again)
    assert (tmp_path / "o" / "measures.json").read_text() == "edited by hand"
    # nor one that another command, or this one for another model, wrote into the same --out
    for other in ("sinklab report of sweep at scale cpu", f"sinklab analyze of {tmp_path / 'other.ckpt'}"):
        write_output(tmp_path / "r" / "measures.json", "{}", other)
        with pytest.raises(SystemExit, match=f"already holds measures.json, which {other} wrote"):
            analyze.main([*again[:-1], str(tmp_path / "r")])
        assert (tmp_path / "r" / "measures.json").read_text() == "{}"
        (tmp_path / "r" / "measures.json").unlink()
    (tmp_path / "file").write_text("mine")
    with pytest.raises(SystemExit, match="--out .*file: is a file; name a directory"):
        analyze.main([*again[:-1], str(tmp_path / "file")])
    with pytest.raises(SystemExit, match=r"--eps 3.0: α lies in \[0, 1\], so ε must be in \[0, 1\)"):
        analyze.main([*again[:-1], str(tmp_path / "o3"), "--eps", "3"])
    assert not (tmp_path / "o3").exists()


def test_sinklab_checkpoint_with_its_tokenizer_reads_text_pile_and_bos(sinklab_ckpt_with_tokenizer, tmp_path):
    text = tmp_path / "words.txt"
    text.write_text(" ".join(WORDS * 20))
    shard = tmp_path / "shard.jsonl"
    shard.write_text(
        "\n".join(
            json.dumps({"text": " ".join(WORDS[i:] + WORDS[:i]), "meta": {"pile_set_name": d}})
            for i, d in enumerate(["Pile-CC", "Github", "Pile-CC", "Github"])
        )
        + "\n"
    )
    tokenizer = str(sinklab_ckpt_with_tokenizer.with_name("tokenizer.json"))
    common = [str(sinklab_ckpt_with_tokenizer), "-n", "2", "-T", "8", "--no-plots", "--tokenizer", tokenizer]
    assert analyze.main([*common, "--text", str(text), "--pile", str(shard), "--out", str(tmp_path / "o")]) == 0
    rec = json.loads((tmp_path / "o" / "measures.json").read_text())
    assert set(rec["domains"]) == {"Pile-CC", "Github"} and set(rec["table1"]) == {"natural", "random", "repeat"}
    subject = analyze.Subject(str(sinklab_ckpt_with_tokenizer), "auto")  # tokenizer.json beside it is found
    sets = inputs.probe_sets(subject, _args(*common, "--text", str(text), "--bos"))
    assert all((t[:, 0] == 0).all() for t in sets.values())  # <|bos|> is id 0
    assert not any(
        ((t[:, 1:] == 0) | (t[:, 1:] == 1) | (t[:, 1:] == 2)).any() for k, t in sets.items() if k != "natural"
    ), "random and repeated tokens never draw BOS/EOS/PAD"
    with pytest.raises(SystemExit, match="--tokenizer"):
        analyze.main([*common[:-2], "--tokenizer", str(tmp_path / "missing.json"), "--out", str(tmp_path / "m")])


def test_bos_option_starts_every_probe_sequence_with_bos(tiny_gpt2_dir):
    subject = analyze.Subject(str(tiny_gpt2_dir), "auto")
    common = [str(tiny_gpt2_dir), "-n", "3", "-T", "10", "--text", str(HAMLET)]
    with pytest.raises(SystemExit, match="--bos needs a model whose tokenizer has a BOS token"):
        inputs.probe_sets(subject, _args(*common, "--bos"))
    subject.tokenizer.bos_token = "<|endoftext|>"
    plain = inputs.probe_sets(subject, _args(*common))
    with_bos = inputs.probe_sets(subject, _args(*common, "--bos"))
    bos = subject.tokenizer.bos_token_id
    for kind, tokens in plain.items():
        assert with_bos[kind].shape == tokens.shape == (3, 10)
        assert (with_bos[kind][:, 0] == bos).all() and torch.equal(with_bos[kind][:, 1:], tokens[:, :-1])


# ---- refused inputs say so in one line, at once, and leave no output folder ---------------------
@pytest.mark.parametrize(
    "extra, message",
    [
        (["-T", "40", "--dataset", "{ds}"], "probe.bin holds 8 sequences of T=12; ask for at most that"),
        (["-n", "9", "-T", "12", "--dataset", "{ds}"], "probe.bin holds 8 sequences of T=12"),
        (["-T", "65", "--inputs", "random"], "-T 65: "),
        # the probe set of a dataset of another tokenizer (a vocabulary of 48 ids, the model's 64)
        (
            ["-T", "12", "--dataset", "{other}"],
            "its tokenizer is not the model's (a vocabulary of 48 ids, the model's has 64)",
        ),
        (["-T", "8", "--text", "{empty}", "--tokenizer", "{tok}"], "empty.txt: the text has 0 tokens"),
        (["--gpt2-positions", "swap:3"], "--gpt2-positions needs learned absolute positions (transformer.wpe)"),
        pytest.param(
            ["--device", "cuda"],
            "--device cuda: no CUDA device is visible (use --device cpu)",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible"),
        ),
    ],
)
def test_analyze_refuses_what_it_cannot_measure(extra, message, sinklab_ckpt_with_tokenizer, tmp_path):
    (tmp_path / "empty.txt").write_text("")
    names = {
        "{ds}": str(micro_dataset(tmp_path / "ds")),
        "{other}": str(micro_dataset(tmp_path / "other", vocab=48)),
        "{empty}": str(tmp_path / "empty.txt"),
        "{tok}": str(tmp_path / "tokenizer.json"),
    }
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as err:
        analyze.main(
            [
                str(sinklab_ckpt_with_tokenizer),
                "-n",
                "2",
                "--no-plots",
                "--out",
                str(out),
                *[names.get(a, a) for a in extra],
            ]
        )
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not out.exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--inputs", "natural,noise"], "--inputs noise unknown; choose from natural,random,repeat"),
        (["--gpt2-positions", "move:3"], "--gpt2-positions 'move:3': expected replace:T[,T..] or swap:T[,T..]"),
        (["-T", "8", "--gpt2-positions", "replace:9"], "--gpt2-positions position 9 outside 2..8"),
    ],
)
def test_option_refusals_come_before_the_model_loads(extra, message, tmp_path, monkeypatch):
    monkeypatch.setattr(analyze, "Subject", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit, match=re.escape(message)):
        analyze.main(["smollm2", "--out", str(tmp_path / "out"), *extra])
    assert not (tmp_path / "out").exists()


def test_analyze_of_a_missing_path_fails_at_once(tmp_path, monkeypatch):
    import time

    monkeypatch.chdir(tmp_path)
    started = time.perf_counter()
    with pytest.raises(SystemExit, match="no-such-dir: no such file or directory"):
        analyze.main(["no-such-dir"])
    assert time.perf_counter() - started < 2  # no model-hub lookup first


@pytest.mark.parametrize("command", ["analyze", "survey", "stream-ppl", "passkey", "quant-eval"])
def test_a_refused_model_is_one_line_naming_the_command_and_exit_2(command, tmp_path, monkeypatch, capsys):
    from pipeline.cli import main as sinklab

    monkeypatch.chdir(tmp_path)
    assert sinklab([command, "no-such-dir"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sinklab {command}: no-such-dir: no such file or directory") and err.count("\n") == 1, err


@pytest.mark.parametrize("what", ["damaged checkpoint", "empty folder", "dataset folder"])
@pytest.mark.parametrize("command", ["analyze", "stream-ppl"])
def test_a_path_that_holds_no_model_is_one_line(what, command, tmp_path, monkeypatch, capsys):
    """A garbage .ckpt, an empty folder or a dataset folder: one line, no traceback."""
    from pipeline.cli import main as sinklab

    monkeypatch.chdir(tmp_path)
    path = {
        "damaged checkpoint": tmp_path / "garbage.ckpt",
        "empty folder": tmp_path / "empty",
        "dataset folder": tmp_path / "ds",
    }[what]
    if what == "damaged checkpoint":
        path.write_bytes(b"not a checkpoint")
    elif what == "empty folder":
        path.mkdir()
    else:  # what `sinklab prep` writes, no model
        path.mkdir()
        for name in ("manifest.json", "tokenizer.json", "probe.bin"):
            (path / name).write_text("{}")
    assert sinklab([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sinklab {command}: {path}") and err.count("\n") == 1, err
    assert ("not a readable checkpoint" if what == "damaged checkpoint" else "not a SinkLab export dir") in err


@pytest.mark.parametrize(
    "extra, option",
    [
        (["--cache", "4+100"], "--cache 4+100: needs 104 positions"),
        (["--cache", "4+28", "--full", "--max-tokens", "200"], "--full: needs 200 positions"),
    ],
)
def test_stream_ppl_refuses_a_cache_wider_than_the_model_positions(
    extra, option, sinklab_ckpt_with_tokenizer, tmp_path
):
    """A learned-positions model and a RoPE model streamed past max_seq_len are both refused, as
    `analyze -T` is."""
    from pipeline.analysis import stream_ppl
    from pipeline.model import save_pretrained

    text = tmp_path / "words.txt"
    text.write_text(" ".join(WORDS * 40))
    learned = save_pretrained(micro_model(positional="learned"), tmp_path / "learned")
    for ckpt in (sinklab_ckpt_with_tokenizer, learned):
        with pytest.raises(SystemExit) as err:
            stream_ppl.main([str(ckpt), "--text", str(text), "--tokenizer", str(tmp_path / "tokenizer.json"), *extra])
        assert option in str(err.value) and "handles at most 64" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("recorded", ["checkpoint", "logged model folder"])
def test_a_model_analysed_on_the_probe_set_of_another_tokenizer_is_refused(
    recorded, sinklab_ckpt_with_tokenizer, tmp_path
):
    """A dataset of the model's vocabulary size but another tokenizer, told by the tokenizer
    hash `sinklab fit` records with the model (a checkpoint's hyper-parameters, a logged model's
    dataset.json); the model's own dataset passes."""
    import hashlib

    from data_prep.dataset import content_hash
    from pipeline.model import save_pretrained

    model = micro_model()
    trained = hashlib.sha256((tmp_path / "tokenizer.json").read_bytes()).hexdigest()
    other = hashlib.sha256(b"another tokenizer").hexdigest()
    if recorded == "checkpoint":
        subject = tmp_path / "step-000004.ckpt"
        state = {f"model.{k}": v for k, v in model.state_dict().items()}
        hparams = {"arch": model.config.to_dict(), "tokenizer_sha256": trained}
        torch.save({"state_dict": state, "hyper_parameters": hparams}, subject)
    else:
        subject = save_pretrained(model, tmp_path / "model")
        (subject / "dataset.json").write_text(json.dumps({"tokenizer": {"sha256": trained}}))
    datasets = {}
    for name, sha in (("own", trained), ("other", other)):
        root = micro_dataset(tmp_path / name)
        manifest = json.loads((root / "manifest.json").read_text())
        manifest["tokenizer"] = {"source": name, "sha256": sha, "file": "tokenizer.json"}
        manifest["hash"] = content_hash(manifest)
        (root / "manifest.json").write_text(json.dumps(manifest))
        datasets[name] = root
    argv = [str(subject), "-n", "2", "-T", "12", "--no-plots", "--dataset"]
    with pytest.raises(SystemExit) as err:
        analyze.main([*argv, str(datasets["other"]), "--out", str(tmp_path / "refused")])
    assert str(err.value) == (
        f"sinklab analyze: --dataset {datasets['other']}: its tokenizer is not the model's (tokenizer sha256 "
        f"{other[:12]}, the model was trained with {trained[:12]}); give the dataset the model was trained on "
        "(or one prepared with its tokenizer)"
    )
    assert not (tmp_path / "refused").exists()
    assert analyze.main([*argv, str(datasets["own"]), "--out", str(tmp_path / "own-out")]) == 0


def test_the_flow_table_says_when_no_layer_moves():
    from pipeline import metric_names as N
    from pipeline.analysis.tables import flow_table

    flow = {N.layer(N.FLOW_ENTROPY, 0): 1.0, N.layer(N.FLOW_ENTROPY, 1): 0.5, N.ENTROPY_DROP_LAYER: 1}
    last = flow_table(flow, {})[-1]
    assert last == "largest BOS-norm jump: none (the ‖h₁‖ ratio rises at no layer); largest entropy drop: layer 1"
