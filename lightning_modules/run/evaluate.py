"""BLEU and perplexity as the paper reports them, each labelled as what it is.

- sacreBLEU: corpus BLEU on detokenized output, with its signature (the comparable number).
- tokenized BLEU with compound splitting: what the paper reported (tensor2tensor's get_ende_bleu.sh:
  Moses tokenizer, then "a ##AT##-##AT## b", then multi-bleu), in `bleu.py`.
- perplexity per wordpiece: exp(mean unsmoothed NLL over target tokens, EOS included, padding not).
"""

from __future__ import annotations

import logging
import math
import time

import torch
from torch import Tensor

from aiayn.lightning_modules.run.bleu import bleu
from aiayn.lightning_modules.transformer.config import PAPER_DECODING, Decoding
from aiayn.lightning_modules.transformer.decoding import translate_batch
from aiayn.lightning_modules.transformer.loss import nll_sum_of_hidden
from aiayn.lightning_modules.transformer.model import Transformer

__all__ = ["bleu", "evaluate", "nll_sum"]

log = logging.getLogger(__name__)
SAY_EVERY_S = 15.0  # a line on the beam search's progress at most this often (a dev set decodes for about a minute)


def nll_sum(model: Transformer, batch: dict) -> tuple[Tensor, int]:
    """Summed unsmoothed NLL of the target tokens and their count (padding excluded), without (B, T, V) logits."""
    memory, src_mask = model.encode(batch["src"])
    hidden = model.decode(batch["tgt_in"], memory, src_mask)
    nll, n = nll_sum_of_hidden(hidden, model.embed.weight, batch["tgt_out"])
    return nll, int(n)


@torch.no_grad()
def evaluate(model: Transformer, datamodule, split: str = "dev", decoding: Decoding = PAPER_DECODING) -> dict:
    """Dev/test PPL and BLEU of `model` on a set-up TranslationDataModule split (dev: its dev_subset)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loader = datamodule.val_dataloader() if split == "dev" else datamodule.test_dataloader()
    hyps: dict[int, str] = {}
    total_nll, total_tokens = 0.0, 0
    started = said = time.monotonic()
    for batch in loader:
        batch = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}
        nll, n = nll_sum(model, batch)
        total_nll, total_tokens = total_nll + float(nll), total_tokens + n
        out = translate_batch(model, batch["src"], datamodule.bos_id, datamodule.eos_id, decoding)
        for i, ids in zip(batch["idx"].tolist(), out):
            hyps[i] = datamodule.decode(ids)
        if time.monotonic() - said >= SAY_EVERY_S:
            said = time.monotonic()
            log.info("evaluating on %s: %d sentences decoded so far (beam %d)", split, len(hyps), decoding.beam)
    if time.monotonic() - started >= SAY_EVERY_S:
        log.info("evaluated on %s: %d sentences in %.0f s", split, len(hyps), time.monotonic() - started)
    model.train(was_training)
    refs = datamodule.references(split)
    ordered = [hyps[i] for i in range(len(refs))]
    return {
        "ppl": math.exp(total_nll / max(total_tokens, 1)),
        **bleu(ordered, refs, lang=datamodule.data.tgt_lang),
        "n_sentences": len(refs),
        "hypotheses": ordered,
    }
