"""The ensemble's preprocessing model maps a client's temperature to the one the engine's request carries
(models/preprocessing.py): from greedy_below up unchanged, below it (0 and no temperature included) the greedy
request temperature; a negative, NaN or infinite one is an error; a text it cannot encode is named by its input (QUERY or a stop
word). Loaded here with a stand-in for the python
backend's utility module (it only provides the Tensor / response types the model returns); the parameters come
from the preprocessing template as `deploy triton` fills them."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from dflash2_trt.deploy.triton.repository import MODELS
from dflash2_trt.sampling import GREEDY_BELOW, GREEDY_REQUEST_TEMPERATURE, request_temperature


@pytest.fixture
def model(monkeypatch):
    pb = types.ModuleType("triton_python_backend_utils")
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    spec = importlib.util.spec_from_file_location("df2_preprocessing_under_test", MODELS / "preprocessing.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    m = mod.TritonPythonModel.__new__(mod.TritonPythonModel)
    cfg = {"parameters": {"greedy_below": {"string_value": repr(GREEDY_BELOW)},
                          "greedy_request_temperature": {"string_value": repr(GREEDY_REQUEST_TEMPERATURE)}}}
    m.greedy_below = float(mod._param(cfg, "greedy_below"))
    m.greedy_temperature = float(mod._param(cfg, "greedy_request_temperature"))
    return m


def _t(v):
    return np.array([[v]], dtype=np.float32)


def test_sampling_temperatures_pass_and_greedy_ones_become_the_request_greedy_temperature(model):
    assert model._temperature(None) == GREEDY_REQUEST_TEMPERATURE
    for v in (0.0, 1e-45, 1e-7, 9.9e-6):
        assert model._temperature(_t(v)) == GREEDY_REQUEST_TEMPERATURE, v
    for v in (np.float32(1e-5), 0.7, 1.0, 2.5):
        assert model._temperature(_t(v)) == float(np.float32(v)), v
    # the same mapping as the CLI / bench paths (sampling.request_temperature) on every fp32 value tried
    for v in (0.0, 1e-45, 9.9e-6, np.float32(1e-5), 0.7):
        assert model._temperature(_t(v)) == pytest.approx(request_temperature(float(np.float32(v))), rel=1e-7)


@pytest.mark.parametrize("bad", [-1.0, np.inf, np.nan])
def test_a_temperature_tensorrt_llm_would_refuse_is_an_error(model, bad):
    with pytest.raises(ValueError, match="TEMPERATURE must be a finite number >= 0"):
        model._temperature(_t(bad))


def test_the_template_passes_both_parameters():
    from dflash2_trt.deploy.triton.repository import read_template

    text = read_template("preprocessing.pbtxt")
    assert '"greedy_below"' in text and '"greedy_request_temperature"' in text
    assert 'name: "TEMPERATURE"' in text and 'name: "OUT_TEMPERATURE"' in text


class _In:
    def __init__(self, a):
        self.a = a

    def as_numpy(self):
        return self.a


def test_a_stop_word_the_tokenizer_cannot_encode_is_named_not_the_text(model):
    """The error used to say "cannot encode the text" when the text encoded fine and a stop word did not."""
    from dflash2_trt.assets import ASSET_ROOT

    module = type(model)._one.__globals__   # the model file's globals (loaded from its path, not imported)
    pb = module["pb_utils"]
    pb.get_input_tensor_by_name = lambda request, name: request.get(name)
    pb.Tensor = lambda name, value: (name, value)
    model.tokenizer = module["load_tokenizer"](str(ASSET_ROOT / "qwen3" / "target"))
    model.add_special, model.end_id, model.pad_id, model.extra_stop = False, 2, 0, []
    request = {"QUERY": _In(np.array([[b"puni kiku"]], dtype=object)),
               "REQUEST_OUTPUT_LEN": _In(np.array([[4]], dtype=np.int32))}
    assert dict(model._one(request))["REQUEST_INPUT_LEN"].item() == 2
    request["STOP_WORDS_DICT"] = _In(np.array([[b"kiku", b"qqqq"]], dtype=object))
    with pytest.raises(ValueError, match=r"cannot encode the stop word 'qqqq' \(STOP_WORDS_DICT\)"):
        model._one(request)
    # a stop word that encodes to no tokens could never match: refused, not ignored
    request["STOP_WORDS_DICT"] = _In(np.array([[b"kiku", b" "]], dtype=object))
    with pytest.raises(ValueError, match=r"the stop word ' ' \(STOP_WORDS_DICT\) encodes to no tokens"):
        model._one(request)
    request["STOP_WORDS_DICT"] = _In(np.array([[b"kiku", b""]], dtype=object))   # an empty entry: no word (padding)
    assert dict(model._one(request))["REQUEST_INPUT_LEN"].item() == 2
    request["QUERY"] = _In(np.array([[b"puni qqqq"]], dtype=object))
    # the word is named (the tokenizer's own "WordLevel error: Missing [UNK] token" does not say which)
    with pytest.raises(ValueError, match=r"^preprocessing: the tokenizer cannot encode the text \(QUERY\): the word "
                                         r"'qqqq' is not in its vocabulary$"):
        model._one(request)


class _Params(dict):
    def __init__(self, inputs, parameters):
        super().__init__(inputs)
        self._p = parameters

    def parameters(self):
        return self._p


def test_a_request_parameter_is_refused_by_name_as_the_package_refuses_it(model):
    """A request parameter (Triton's /generate makes one of a JSON field that names no input; the ensemble forwards
    it) is an error naming it, worded as dflash2_trt.deploy.triton.serving.refuse_parameters words it (the model
    file carries a copy); none at all, or a python backend without parameters(), passes (the server test:
    test_triton_server.py, test_request_parameters_are_refused_by_name)."""
    from dflash2_trt.deploy.triton.serving import refuse_parameters
    from dflash2_trt.errors import ConfigError

    refuse = type(model)._one.__globals__["refuse_parameters"]
    for text in ('{"repetition_penalty":5.0}', '{"min_tokens":2,"lora_task_id":3}'):
        with pytest.raises(ConfigError) as want:
            refuse_parameters(text)
        with pytest.raises(ValueError) as got:
            refuse(_Params({}, text))
        assert str(got.value) == f"preprocessing: {want.value}"
    assert "request parameters 'lora_task_id', 'min_tokens': not an input of this model" in str(got.value)
    for ok in ("{}", ""):
        refuse(_Params({}, ok))
        refuse_parameters(ok)
    refuse({})


def test_the_postprocessing_model_carries_the_same_refusal():
    """models/postprocessing.py imports nothing of the package either, so it carries its own copy of the refusal: the
    same function, word for word, as the preprocessing copy tested above (only MODEL, a module constant, differs)."""
    import ast

    from dflash2_trt.deploy.triton import models

    def source(name):
        text = (Path(models.__file__).parent / f"{name}.py").read_text()
        (fn,) = [n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "refuse_parameters"]
        return ast.get_source_segment(text, fn)

    assert source("postprocessing") == source("preprocessing")


def _k(v):
    return np.array([[v]], dtype=np.int32)


def test_top_k_one_is_greedy_on_every_backend(model):
    """top_k 1 keeps only the likeliest token: greedy whatever the temperature. The engine has no top-k input, so
    behind TensorRT-LLM's own tensorrtllm backend a top_k of 1 would be dropped and the request sampled at its
    temperature: preprocessing makes the temperature greedy itself. 0 (none) leaves it alone; others are refused
    (the python-backend tensorrt_llm model refuses them too: test_serving.py)."""
    for t in (None, _t(0.0), _t(0.7), _t(2.5)):
        assert model._temperature(t, _k(1)) == GREEDY_REQUEST_TEMPERATURE
    assert model._temperature(_t(0.7), _k(0)) == model._temperature(_t(0.7), None) == float(np.float32(0.7))
    for k in (2, 50, -1):
        with pytest.raises(ValueError, match=rf"^preprocessing: top_k {k}: not supported"):
            model._temperature(_t(0.7), _k(k))
    with pytest.raises(ValueError, match="TEMPERATURE must be a finite number >= 0"):   # still checked under top_k 1
        model._temperature(_t(-1.0), _k(1))
    # top_p likewise: 1 and 0 (TensorRT-LLM's "unset") are the whole distribution, anything else is refused
    for p in (0.0, 1.0):
        assert model._temperature(_t(0.7), None, _t(p)) == float(np.float32(0.7))
    for p in (0.9, 0.5, 1.5):
        with pytest.raises(ValueError, match=rf"^preprocessing: top_p {p:g}: not supported"):
            model._temperature(_t(0.7), None, _t(p))


def test_the_ensemble_hands_top_k_to_preprocessing_and_to_the_engine_model():
    from dflash2_trt.deploy.triton.repository import read_template

    pre = read_template("preprocessing.pbtxt")
    assert 'name: "TOP_K" data_type: TYPE_INT32 dims: [ 1 ] optional: true' in pre
    ens = read_template("ensemble.pbtxt")
    assert 'input_map { key: "TOP_K" value: "top_k" }' in ens
    assert 'input_map { key: "runtime_top_k" value: "top_k" }' in ens
    assert 'name: "TOP_P" data_type: TYPE_FP32 dims: [ 1 ] optional: true' in pre
    assert 'input_map { key: "TOP_P" value: "top_p" }' in ens
