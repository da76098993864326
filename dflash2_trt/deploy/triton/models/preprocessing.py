"""Triton python-backend model ``preprocessing`` (written by ``dflash2-trt deploy triton``).

QUERY (text) -> INPUT_ID / REQUEST_INPUT_LEN with the target's tokenizer (no special tokens unless
the ``add_special_tokens`` parameter is "true"); STOP_WORDS_DICT -> STOP_WORDS_IDS in
TensorRT-LLM's [2, L] word-list form; END_ID / PAD_ID default to the ``end_id`` / ``pad_id``
parameters (the engine's EOS and the tokenizer's pad). The engine's other EOS ids
(``extra_stop_ids``) are appended as one-token stop words when the request gives no END_ID, so the
ensemble stops where ``dflash2-trt run`` does. TEMPERATURE -> OUT_TEMPERATURE, the temperature the
engine's request carries: the client's from ``greedy_below`` up, ``greedy_request_temperature`` below it (0 and
no temperature included), so the ensemble decodes greedily by default and at 0 on every backend (for a request
without a temperature TensorRT-LLM fills the engine's with 1.0, at which this engine samples, and its EAGLE layer
refuses 0). A negative, NaN or infinite temperature is an error. TOP_K (the ensemble's top_k) 1 makes it greedy
whatever the temperature (the one likeliest token is the argmax), on every backend: the engine has no top-k input
(only the temperature), so behind the tensorrtllm backend it would otherwise sample at the temperature; 0 (or
none) leaves the temperature alone, and anything else is refused (the engine samples from the whole distribution);
so is a TOP_P (the ensemble's top_p) but 0 and 1, which the engine would drop the same way.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

MODEL = "preprocessing"


def _param(cfg, key, default=None):
    value = cfg.get("parameters", {}).get(key, {}).get("string_value")
    return default if value in (None, "") else value


def refuse_parameters(request):
    """This model reads no request parameters: any (e.g. a /generate JSON field naming no input, which Triton turns
    into one; an ensemble forwards its request's parameters to this model) is an error naming it, not ignored. A
    copy of dflash2_trt.deploy.triton.serving.refuse_parameters (this file imports nothing of the package)."""
    read = getattr(request, "parameters", None)    # a python backend without it (before 23.x) passes none on
    try:
        params = json.loads((read() if read is not None else None) or "{}")
    except ValueError:
        params = {"?": None}
    names = sorted(params)
    if names:
        raise ValueError(f"{MODEL}: request parameter{'s' if len(names) > 1 else ''} "
                         f"{', '.join(repr(n) for n in names)}: not an input of this model, and it reads no request "
                         f"parameters, so refused rather than ignored (Triton's /generate endpoint passes a JSON field "
                         f"that names no model input on as a request parameter); send only the model's inputs")


def word_list(words):
    """[[ids...], ...] -> int32 [2, L]: ids back to back, then the cumulative end offsets (-1 padded)."""
    flat, offsets = [], []
    for w in words:
        flat += list(w)
        offsets.append(len(flat))
    n = max(1, len(flat), len(offsets))
    out = np.zeros((2, n), dtype=np.int32)
    out[1, :] = -1
    out[0, :len(flat)] = flat
    out[1, :len(offsets)] = offsets
    return out


def load_tokenizer(directory):
    """As dflash2_trt.tokenizer.find_tokenizer loads it: a tokenizer_config naming the generic fast
    class is its tokenizer.json (AutoTokenizer may substitute the model type's own class, which
    ignores tokenizer.json's pipeline), anything else goes through AutoTokenizer."""
    import os

    if not os.path.isdir(directory):   # else transformers reads the path as a Hub repo id, and says only that
        raise FileNotFoundError(f"tokenizer_dir {directory}: not a directory (moved or removed since `deploy triton` "
                                f"wrote this repository?)")
    try:
        with open(os.path.join(directory, "tokenizer_config.json")) as f:
            declared = json.load(f).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        declared = None
    if declared in ("PreTrainedTokenizerFast", "TokenizersBackend") and \
            os.path.isfile(os.path.join(directory, "tokenizer.json")):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(directory)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def _bad_request(message):
    """The request's own fault: INVALID_ARG (HTTP 400, gRPC INVALID_ARGUMENT), so a client's retry logic does not
    take it for the server's (INTERNAL, a stub's default; older stubs take no code)."""
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    return pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        self.tokenizer = load_tokenizer(_param(cfg, "tokenizer_dir"))
        self.add_special = _param(cfg, "add_special_tokens", "false").lower() == "true"
        self.end_id = int(_param(cfg, "end_id", "-1"))
        self.pad_id = int(_param(cfg, "pad_id", "0"))
        extra = _param(cfg, "extra_stop_ids", "")
        self.extra_stop = [[int(t)] for t in extra.split(",") if t.strip()]
        self.greedy_below = float(_param(cfg, "greedy_below"))
        self.greedy_temperature = float(_param(cfg, "greedy_request_temperature"))

    def _temperature(self, value, top_k=None, top_p=None):
        p = None if top_p is None else float(top_p.reshape(-1)[0])
        if p not in (None, 0.0, 1.0):
            raise ValueError(f"preprocessing: top_p {p:g}: not supported (the engine samples from the whole "
                             f"distribution at the temperature); send 1 (or 0, or none)")
        k = None if top_k is None else int(top_k.reshape(-1)[0])
        if k not in (None, 0, 1):
            raise ValueError(f"preprocessing: top_k {k}: not supported (the engine samples from the whole "
                             f"distribution at the temperature); 1 is greedy, 0 or none the whole distribution")
        if value is None:
            return self.greedy_temperature
        t = float(value.reshape(-1)[0])
        if not (t >= 0 and np.isfinite(t)):
            raise ValueError(f"preprocessing: TEMPERATURE must be a finite number >= 0, got {t}")
        return t if t >= self.greedy_below and k != 1 else self.greedy_temperature

    def _encode(self, text, what="the text (QUERY)"):
        try:
            return list(self.tokenizer(text, add_special_tokens=self.add_special)["input_ids"])
        except Exception as exc:  # noqa: BLE001 - e.g. a word outside a word-level vocabulary
            # name the word, as `run --prompt` does (dflash2_trt.tokenizer.encode_text; the tokenizer's own "WordLevel
            # error: Missing [UNK] token" does not say which): each distinct word once, at most 10,000, so that a long
            # text cannot stall the model with a call per word (past that, the tokenizer's own message)
            bad = next((w for w in list(dict.fromkeys(text.split()))[:10_000] if not self._encodes(w)), None)
            why = f"the word {bad!r} is not in its vocabulary" if bad is not None else str(exc)
            raise ValueError(f"preprocessing: the tokenizer cannot encode {what}: {why}") from None

    def _encodes(self, word):
        try:
            self.tokenizer(word, add_special_tokens=self.add_special)
            return True
        except Exception:  # noqa: BLE001
            return False

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._one(request)))
            except ValueError as exc:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=_bad_request(str(exc))))
        return responses

    def _one(self, request):
        refuse_parameters(request)

        def get(name):
            t = pb_utils.get_input_tensor_by_name(request, name)
            return None if t is None else t.as_numpy()

        query = get("QUERY").reshape(-1)
        if query.size != 1:
            raise ValueError(f"preprocessing: QUERY must hold one text per request, got {query.size}")
        text = query[0].decode("utf-8") if isinstance(query[0], bytes) else str(query[0])
        ids = self._encode(text)
        if not ids:
            raise ValueError("preprocessing: the text encodes to no tokens")
        out_len = get("REQUEST_OUTPUT_LEN").reshape(-1)[:1].astype(np.int32)
        end = get("END_ID")
        pad = get("PAD_ID")
        bad = get("BAD_WORDS_DICT")
        if bad is not None:
            given = [b.decode("utf-8") if isinstance(b, bytes) else str(b) for b in bad.reshape(-1)]
            if any(given):
                raise ValueError(f"preprocessing: bad_words {[g for g in given if g]!r}: not supported (banning words "
                                 f"is logits processing, which the runtime does not apply to tokens accepted inside "
                                 f"the engine); send it empty or leave it out")
        words = []
        stop = get("STOP_WORDS_DICT")
        if stop is not None:
            for s in stop.reshape(-1):
                s = s.decode("utf-8") if isinstance(s, bytes) else str(s)
                if s:
                    w = self._encode(s, f"the stop word {s!r} (STOP_WORDS_DICT)")
                    if not w:   # (" " with most tokenizers) it could never match: refused, not ignored
                        raise ValueError(f"preprocessing: the stop word {s!r} (STOP_WORDS_DICT) encodes to no tokens "
                                         f"(stop words are matched on the tokens they encode to)")
                    words.append(w)
        if end is None:
            words += self.extra_stop
        end_id = np.array([int(end.reshape(-1)[0]) if end is not None else self.end_id], dtype=np.int32)
        pad_id = np.array([int(pad.reshape(-1)[0]) if pad is not None else self.pad_id], dtype=np.int32)
        return [
            pb_utils.Tensor("INPUT_ID", np.array([ids], dtype=np.int32)),
            pb_utils.Tensor("REQUEST_INPUT_LEN", np.array([[len(ids)]], dtype=np.int32)),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", out_len.reshape(1, 1)),
            pb_utils.Tensor("STOP_WORDS_IDS", word_list(words)[None]),
            pb_utils.Tensor("OUT_END_ID", end_id.reshape(1, 1)),
            pb_utils.Tensor("OUT_PAD_ID", pad_id.reshape(1, 1)),
            pb_utils.Tensor("OUT_TEMPERATURE", np.array(
                [[self._temperature(get("TEMPERATURE"), get("TOP_K"), get("TOP_P"))]], dtype=np.float32)),
        ]
