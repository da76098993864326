"""The DFlash2 selector: from the drafter's per-position top-k candidates, one path of K drafts per request
(plugin ``DFlash2PairwiseScan``: unary scores plus a low-rank pairwise term between neighbouring candidates).

    top-k of the unary scores -> hidden projection -> DFlash2PairwiseScan -> K drafts + proposal q

q is the proposal distribution over each position's candidates; the accept step (:mod:`.accept`) uses it for
rejection sampling at T > 0.
"""

from __future__ import annotations

from .accept import counter_uniforms, decoding_temperature
from .common import F, api

SELECTOR_PLUGIN_MODE = {"greedy": "sample", "viterbi": "viterbi"}
"""Build selector -> DFlash2PairwiseScan mode. ``greedy`` (the published behaviour) is the
plugin's ``sample`` mode: per request, T <= 0 walks greedily (one-hot q) and T > 0 samples from
softmax(S/T) (q kept for rejection sampling). ``viterbi`` proposes the global best path (one-hot
q) at every temperature — lossless too, never the default."""


class DFlash2Selector(api.Module):
    def __init__(self, hidden, vocab, rank, dtype):
        super().__init__()
        self.predecessor_codebook = api.Parameter(shape=(vocab, rank), dtype=dtype)
        self.successor_codebook = api.Parameter(shape=(vocab, rank), dtype=dtype)
        self.hidden_projection = api.layers.ColumnLinear(hidden, rank, bias=False, dtype=dtype, tp_size=1,
                                                         gather_output=False)

    def propose(self, unary, hid, anchor, anchor_pos, j, eagle_temperature, rand_data_sample, *, K, top_k, mode):
        """(drafts [bs, K], q [bs, K, top_k], candidates [bs, K, top_k], temperature [bs]) from the unary scores
        ``[bs, K, V]`` fp32 and the drafter's hidden states ``[bs, K, hidden]`` of draft positions 1..K. The
        sampling uniforms are counter-based: keyed by the runtime's ``rand_data_sample`` per request, counted by
        the positions' absolute indices (``anchor_pos + 1..K``; ``j`` is ``[[0..K]]``)."""
        scores, cand = F.topk(unary, top_k, dim=2)
        proj = self.hidden_projection(hid)
        temperature = decoding_temperature(eagle_temperature)                          # 0 below 1e-5: greedy
        key = F.cast(rand_data_sample * float(2**31), "int64")
        counter = F.cast(F.unsqueeze(anchor_pos, 1) + F.slice(j, [0, 1], [1, K]), "int64")
        uniforms = counter_uniforms(key, counter)                                     # [bs, K]
        drafts, q = api.plugins.pairwise_scan(scores, cand, proj, anchor, self.predecessor_codebook.value,
                                              self.successor_codebook.value, temperature, uniforms, mode=mode)
        return drafts, q, cand, temperature
