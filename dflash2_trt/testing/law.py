"""The exact law of a target's first three tokens, and a chi-square against it: the sampling-losslessness
check shared by the reference loop's tests and the engine's.

``exact_triples(target, prompt, T)`` enumerates every prefix above ``thresh`` and returns
``{(t1, t2, t3): P(t1) P(t2 | t1) P(t3 | t1, t2)}`` at temperature T, from the target's own logits
(transformers, full recompute per prefix: independent of any cache or engine). ``chi2_pvalue`` bins the
triples expected at least 5 times, plus one bin for the rest."""

from __future__ import annotations

import torch


@torch.no_grad()
def exact_triples(target, prompt, temperature: float, thresh: float = 1e-4) -> dict:
    from ..reference.verify import target_probs

    def next_probs(prefixes):
        x = torch.tensor([list(prompt) + list(pf) for pf in prefixes])
        return target_probs(target(x).logits[:, -1], temperature)

    p1 = next_probs([()])[0]
    ones = [(int(t),) for t in torch.nonzero(p1 > thresh).flatten()]
    probs1 = {pf: float(p1[pf[0]]) for pf in ones}
    p2 = next_probs(ones)
    twos = {}
    for i, pf in enumerate(ones):
        for t in torch.nonzero(probs1[pf] * p2[i] > thresh).flatten():
            twos[pf + (int(t),)] = probs1[pf] * float(p2[i, t])
    keys = list(twos)
    p3 = next_probs(keys)
    out = {}
    for i, pf in enumerate(keys):
        for t in torch.nonzero(twos[pf] * p3[i] > thresh).flatten():
            out[pf + (int(t),)] = twos[pf] * float(p3[i, t])
    return out


def chi2_pvalue(samples, exact: dict) -> float:
    from scipy.stats import chisquare

    n = len(samples)
    bins = sorted(k for k, v in exact.items() if v * n >= 5)
    obs = [sum(1 for s in samples if s == b) for b in bins]
    exp = [exact[b] * n for b in bins]
    obs.append(n - sum(obs))
    exp.append(n - sum(exp))
    if len(bins) < 3:
        raise AssertionError("too few populated bins for a meaningful test")
    return float(chisquare(obs, exp).pvalue)
