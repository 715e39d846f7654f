"""lm-evaluation-harness adapter for SinkLab checkpoints (zero-shot tables, seed 000 Table 9).

    python -c 'import pipeline.analysis.lm_eval_adapter; from lm_eval.__main__ import cli_evaluate; cli_evaluate()' \\
        --model sinklab --model_args pretrained=<export dir or .ckpt>,tokenizer=<tokenizer.json> --tasks hellaswag,piqa

or from Python, ``lm_eval.simple_evaluate(model="sinklab", model_args=...)`` after importing this module.

Importing this module registers the model name ``sinklab``. Sequences longer than the model's
``max_seq_len`` keep their last ``max_seq_len`` tokens. Needs the ``eval`` extra (lm-eval).
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

EOT_NAMES = ("<|endoftext|>", "</s>", "<eos>", "[EOS]", "<|eos|>")


@register_model("sinklab")
class SinkLabLM(LM):
    def __init__(self, pretrained: str, tokenizer: str | None = None, device: str = "cpu",
                 batch_size: int | str = 1, max_gen_toks: int = 64, model=None, **_ignored) -> None:
        super().__init__()
        from tokenizers import Tokenizer

        if model is None:
            from pipeline.model import load_pretrained

            model = load_pretrained(pretrained)
        self.model = model.to(device).eval()
        self.device_ = torch.device(device)
        tok_path = Path(tokenizer) if tokenizer else Path(pretrained).with_name("tokenizer.json")
        if not tok_path.exists():
            raise FileNotFoundError(f"{tok_path}: tokenizer not found; pass model_args tokenizer=<dataset>/tokenizer.json")
        self.tok = Tokenizer.from_file(str(tok_path))
        self.max_length = self.model.config.max_seq_len
        self.max_gen_toks = int(max_gen_toks)
        self.eot_id = next((i for n in EOT_NAMES if (i := self.tok.token_to_id(n)) is not None), 0)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    @torch.no_grad()
    def _logprobs(self, tokens: list[int]) -> torch.Tensor:
        """log p(tokens[i+1] | tokens[..i]) over the vocabulary: [len-1, V]."""
        idx = torch.tensor(tokens[-(self.max_length + 1):][:-1], device=self.device_)[None]
        return F.log_softmax(self.model(idx).logits[0].float(), dim=-1)

    def _score(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        if not context:
            context = [self.eot_id]
        whole = (context + continuation)[-(self.max_length + 1):]
        logp = self._logprobs(whole)[-len(continuation):]
        target = torch.tensor(continuation, device=logp.device)
        total = logp.gather(-1, target[:, None]).sum().item()
        return total, bool((logp.argmax(-1) == target).all())

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        out = []
        for req in requests:
            context, continuation = req.args
            # encode the joined string and split, so tokens straddling the boundary stay intact
            whole, ctx = self.encode(context + continuation), self.encode(context)
            n_ctx = len(ctx) if whole[: len(ctx)] == ctx else len(ctx) - 1
            out.append(self._score(whole[:n_ctx], whole[n_ctx:]))
        return out

    def loglikelihood_rolling(self, requests) -> list[float]:
        out = []
        for req in requests:
            (text,) = req.args
            windows = map(make_disjoint_window, get_rolling_token_windows(
                self.encode(text), prefix_token=self.eot_id, max_seq_len=self.max_length, context_len=1))
            out.append(sum(self._score(ctx, cont)[0] for ctx, cont in windows))
        return out

    @torch.no_grad()
    def generate_until(self, requests) -> list[str]:
        out = []
        for req in requests:
            context, kwargs = req.args
            until = kwargs.get("until", []) or []
            until = [until] if isinstance(until, str) else list(until)
            tokens = self.encode(context) or [self.eot_id]
            generated: list[int] = []
            text = ""
            for _ in range(int(kwargs.get("max_gen_toks", self.max_gen_toks))):
                nxt = int(self._logprobs(tokens + generated + [0])[-1].argmax())
                if nxt == self.eot_id:
                    break
                generated.append(nxt)
                text = self.tok.decode(generated)
                if any(stop in text for stop in until):
                    break
            for stop in until:
                text = text.split(stop)[0]
            out.append(text)
        return out
