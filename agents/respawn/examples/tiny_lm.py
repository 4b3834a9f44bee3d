"""A tiny GPT-like causal language model built from a config, for validation of LMs.

No weights or data from any hub: the model is one small transformer block over a
64-token vocabulary, and its batches are fixed-seed random token ids. Factories
for `ValidationSettings` / a job's validation fields:

    respawn.examples.tiny_lm:make_model          forward(input_ids) -> logits [B, T, V]
    respawn.examples.tiny_lm:make_dict_model     forward(input_ids, labels=None) -> {"logits", "loss"} (as an HF model)
    respawn.examples.tiny_lm:validation_batch    {"input_ids": [B, T]}: a kwargs batch, scored shifted
    respawn.examples.tiny_lm:labelled_batch      {"input_ids", "labels"}: the dict model computes its own loss
    respawn.examples.tiny_lm:perplexity          an eval_fn: exp of the shifted cross-entropy
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    vocab: int = 64
    n_embd: int = 16
    n_head: int = 2
    n_layer: int = 1
    n_ctx: int = 16
    dropout: float = 0.1


class TinyGPT(nn.Module):
    def __init__(self, config: Config = Config(), dict_output: bool = False):
        super().__init__()
        self.config, self.dict_output = config, dict_output
        self.tokens = nn.Embedding(config.vocab, config.n_embd)
        self.positions = nn.Embedding(config.n_ctx, config.n_embd)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(config.n_embd, config.n_head, 4 * config.n_embd, config.dropout,
                                       batch_first=True, norm_first=True) for _ in range(config.n_layer))
        self.norm = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None):
        t = input_ids.shape[1]
        h = self.tokens(input_ids) + self.positions(torch.arange(t, device=input_ids.device))
        causal = torch.triu(torch.full((t, t), float("-inf"), device=input_ids.device), diagonal=1)
        for block in self.blocks:
            h = block(h, src_mask=causal)
        logits = self.head(self.norm(h))
        if not self.dict_output:
            return logits
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = shifted_cross_entropy(logits, labels)
        return out


def shifted_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


def make_model() -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4321)
        return TinyGPT()


def make_dict_model() -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4321)
        return TinyGPT(dict_output=True)


def tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, Config.vocab, (n, Config.n_ctx), generator=torch.Generator().manual_seed(seed))


def validation_batch() -> dict[str, torch.Tensor]:
    return {"input_ids": tokens(8, 7)}


def labelled_batch() -> dict[str, torch.Tensor]:
    ids = tokens(8, 7)
    return {"input_ids": ids, "labels": ids}


def perplexity(model: nn.Module, batch: dict[str, torch.Tensor]) -> float:
    return float(torch.exp(shifted_cross_entropy(model(batch["input_ids"]), batch["input_ids"])))
