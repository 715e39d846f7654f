"""lm-evaluation-harness adapter for SinkLab checkpoints (zero-shot tables, Xiao et al. 2024 Table 9).

Importing this module registers the model name ``sinklab``; docs/analysis.md shows how to run it."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from torch.nn.utils.rnn import pad_sequence

EOT_NAMES = ("<|endoftext|>", "</s>", "<eos>", "[EOS]", "<|eos|>")


@register_model("sinklab")
class SinkLabLM(LM):
    def __init__(
        self,
        pretrained: str,
        tokenizer: str | None = None,
        device: str = "cpu",
        batch_size: int | str = 1,
        max_gen_toks: int = 64,
        model=None,
        **_ignored,
    ) -> None:
        super().__init__()
        from tokenizers import Tokenizer

        if model is None:
            from pipeline.model import load_pretrained

            if str(pretrained).startswith(("runs:/", "models:/")):  # a training run's logged model
                from pipeline.tracking import resolve_model

                resolved = resolve_model(str(pretrained))
                pretrained, tokenizer = str(resolved.path), tokenizer or resolved.tokenizer
            model = load_pretrained(pretrained)
        self.model = model.to(device).eval()
        self.device_ = torch.device(device)
        tok_path = Path(tokenizer) if tokenizer else Path(pretrained).with_name("tokenizer.json")
        if not tok_path.exists():
            raise FileNotFoundError(
                f"{tok_path}: tokenizer not found; pass model_args tokenizer=<dataset>/tokenizer.json"
            )
        self.tok = Tokenizer.from_file(str(tok_path))
        self.max_length = self.model.config.max_seq_len
        self.max_gen_toks = int(max_gen_toks)
        self.batch_size = 16 if str(batch_size).startswith("auto") else int(batch_size)
        self.eot_id = next((i for n in EOT_NAMES if (i := self.tok.token_to_id(n)) is not None), 0)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    @torch.no_grad()
    def _score_many(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum log p(continuation | context), greedy?) per pair, in batches of batch_size."""
        wholes = []
        for context, continuation in pairs:
            whole = ((context or [self.eot_id]) + continuation)[-(self.max_length + 1) :]
            wholes.append((whole[:-1], continuation))
        order = sorted(range(len(pairs)), key=lambda i: -len(wholes[i][0]))
        out: list[tuple[float, bool]] = [(0.0, False)] * len(pairs)
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            idx = pad_sequence([torch.tensor(wholes[i][0], dtype=torch.long) for i in batch], batch_first=True)
            logp = F.log_softmax(self.model(idx.to(self.device_)).logits.float(), dim=-1)
            for row, i in enumerate(batch):
                inputs, continuation = wholes[i]
                rows = logp[row, len(inputs) - len(continuation) : len(inputs)]
                target = torch.tensor(continuation, device=rows.device)
                out[i] = (rows.gather(-1, target[:, None]).sum().item(), bool((rows.argmax(-1) == target).all()))
        return out

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        pairs = []
        for req in requests:
            context, continuation = req.args
            # encode the joined string and split, so tokens straddling the boundary stay intact
            whole, ctx = self.encode(context + continuation), self.encode(context)
            n_ctx = len(ctx) if whole[: len(ctx)] == ctx else len(ctx) - 1
            pairs.append((whole[:n_ctx], whole[n_ctx:]))
        return self._score_many(pairs)

    def loglikelihood_rolling(self, requests) -> list[float]:
        windows, owner = [], []
        for n, req in enumerate(requests):
            (text,) = req.args
            rolling = get_rolling_token_windows(
                self.encode(text), prefix_token=self.eot_id, max_seq_len=self.max_length, context_len=1
            )
            pieces = [make_disjoint_window(window) for window in rolling]
            windows += pieces
            owner += [n] * len(pieces)
        totals = [0.0] * len(requests)
        for n, (logp, _) in zip(owner, self._score_many(windows)):
            totals[n] += logp
        return totals

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
                idx = torch.tensor((tokens + generated)[-self.max_length :], device=self.device_)[None]
                nxt = int(F.log_softmax(self.model(idx).logits[0, -1].float(), dim=-1).argmax())
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
