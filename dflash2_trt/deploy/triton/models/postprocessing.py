"""Triton python-backend model ``postprocessing`` (written by ``dflash2-trt deploy triton``).

TOKENS_BATCH [b, beam, L] + SEQUENCE_LENGTH [b, beam] -> OUTPUT [b] (text of the first beam, special
tokens skipped unless the ``skip_special_tokens`` parameter is "false"). Stateless: a streamed
response is decoded on its own.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

MODEL = "postprocessing"


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
        params = cfg.get("parameters", {})
        self.tokenizer = load_tokenizer(params["tokenizer_dir"]["string_value"])
        self.skip_special = params.get("skip_special_tokens", {}).get("string_value", "true").lower() != "false"

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                refuse_parameters(request)
            except ValueError as exc:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=_bad_request(str(exc))))
                continue
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
            lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
            tokens = tokens.reshape(tokens.shape[0], -1, tokens.shape[-1])
            lengths = lengths.reshape(lengths.shape[0], -1)
            texts = [self.tokenizer.decode(tokens[b, 0, :int(lengths[b, 0])].tolist(),
                                           skip_special_tokens=self.skip_special).encode("utf-8")
                     for b in range(tokens.shape[0])]
            out = np.array(texts, dtype=np.object_).reshape(-1, 1)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", out)]))
        return responses
