"""Small calls of TensorRT-LLM's functional API whose outcome (accepted: the result's dtype and shape; or refused) is a
rule recorded in ``dflash2_trt/trtllm/cpu/api_1_2.yaml`` ``dtype_rules``. Each probe takes the module ``F`` (the CPU
stand-in's ``dflash2_trt.trtllm.cpu.functional`` or TensorRT-LLM's real ``tensorrt_llm.functional``) and numpy,
and uses only what both have, so one probe runs on both and test_functional_probes.py compares the outcomes.

``STRICTER``: probes the stand-in refuses on purpose where the real code accepts and computes a wrong value (the
record says so); ``NOT_MODELLED``: Tensor methods the stand-in leaves out; every other probe must have the same
outcome on both."""

from __future__ import annotations


def _c(F, np, values, dtype):
    return F.constant(np.asarray(values, dtype))


def shape_is_int64(F, np):
    return F.shape(_c(F, np, np.zeros((3, 5)), np.float32), 1)


def shape_cast_to_int32(F, np):
    return F.shape(_c(F, np, np.zeros((3, 5)), np.float32), 1, "int32")


def int32_meets_int64(F, np):
    return _c(F, np, np.arange(5), np.int32) + F.shape(_c(F, np, np.zeros((3, 5)), np.float32), 1)


def where_mixed_int_kinds(F, np):
    i32 = _c(F, np, np.arange(5), np.int32)
    i64 = _c(F, np, np.arange(5), np.int64)
    return F.where(F.lt(i64, 2), i64, i32)


def where_python_int_follows_tensor(F, np):
    i32 = _c(F, np, np.arange(5), np.int32)
    return F.where(F.lt(i32, 2), i32, -1)


def concat_mixed_int_kinds(F, np):
    i32 = _c(F, np, np.arange(5), np.int32)
    return F.concat([i32, F.cast(i32, "int64")])


def concat_int_next_to_int64(F, np):
    return F.concat([F.shape(_c(F, np, np.zeros((3, 5)), np.float32), 1), 4])


def empty_constant(F, np):
    return F.constant(np.zeros((1, 0), np.int32))


def int64_times_large_int(F, np):
    return _c(F, np, [3], np.int64) * 2654435761


def int32_times_large_int(F, np):
    return _c(F, np, [3], np.int32) * 2654435761


def half_times_python_int(F, np):
    return _c(F, np, np.ones(2), np.float16) * 2


def python_int_minus_half(F, np):
    return 1 - _c(F, np, np.ones(2), np.float16)


def half_times_float(F, np):
    return _c(F, np, np.ones(2), np.float16) * _c(F, np, np.ones(2), np.float32)


def float_plus_int32(F, np):
    return _c(F, np, np.ones(2), np.float32) + _c(F, np, np.ones(2), np.int32)


def int32_plus_half_a_unit(F, np):
    return _c(F, np, [3], np.int32) + 0.5


def and_of_int32(F, np):
    return F.op_and(_c(F, np, np.ones(2), np.int32), _c(F, np, np.ones(2), np.int32))


def and_of_bool(F, np):
    b = F.lt(_c(F, np, np.arange(2), np.int32), 1)
    return F.op_and(b, b)


def reciprocal_of_tensor(F, np):
    return 1.0 / _c(F, np, np.ones(2), np.float32)


def negated_tensor(F, np):
    return -_c(F, np, np.ones(2), np.float32)


def indexed_tensor(F, np):
    return _c(F, np, np.ones((2, 3)), np.float32)[0]


def cast_to_own_dtype_is_itself(F, np):
    x = _c(F, np, np.ones(2), np.float32)
    return F.cast(x, "float32") is x


def rms_norm_positional_weight(F, np):
    x = _c(F, np, np.ones((2, 4)), np.float32)
    return F.rms_norm(x, 4, _c(F, np, np.full(4, 2.0), np.float32), 1e-6)


def rms_norm_keyword_weight(F, np):
    x = _c(F, np, np.ones((2, 4)), np.float32)
    return F.rms_norm(x, 4, weight=_c(F, np, np.full(4, 2.0), np.float32), eps=1e-6)


def matmul_half(F, np):
    return F.matmul(_c(F, np, np.ones((2, 4)), np.float16), _c(F, np, np.ones((4, 3)), np.float16))


def gather_same_rank(F, np):
    return F.gather(_c(F, np, np.ones((2, 3)), np.float32), 1, _c(F, np, np.zeros((2, 1)), np.int32))


def select_with_int(F, np):
    return F.select(_c(F, np, np.ones((2, 3)), np.float32), 1, 2)


def index_select_rank1(F, np):
    return F.index_select(_c(F, np, np.ones((2, 3)), np.float32), 1, _c(F, np, [0, 2], np.int32))


def slice_to_zero_width(F, np):
    zero = F.expand(_c(F, np, [0], np.int32), F.concat([3]))
    return F.slice(F.unsqueeze(zero, 1), [0, 0], F.concat([3, 0]))


def view_with_zero_placeholder(F, np):
    return _c(F, np, np.ones((2, 3, 4)), np.float32).view([0, 12])


def permute_and_transpose(F, np):
    return _c(F, np, np.ones((2, 3, 4)), np.float32).permute([2, 0, 1]).transpose(1, 2)


def flatten_from_one(F, np):
    return _c(F, np, np.ones((2, 3, 4)), np.float32).flatten(1)


def split_in_sizes(F, np):
    parts = _c(F, np, np.ones((2, 6)), np.float32).split([2, 4], dim=1)
    return parts[1]


def unbind_first(F, np):
    return _c(F, np, np.ones((3, 5)), np.float32).unbind(0)[2]


def squeeze_and_unsqueeze(F, np):
    return _c(F, np, np.ones((2, 1, 3)), np.float32).squeeze(1, False).unsqueeze(0)


def mean_keepdim(F, np):
    return _c(F, np, np.ones((2, 3)), np.float32).mean(1, keepdim=True)


def max_over_dim(F, np):
    return _c(F, np, np.ones((2, 3)), np.float32).max(1)


def repeat_rows(F, np):
    return _c(F, np, np.ones((2, 3)), np.float32).repeat([2, 1])


def select_method(F, np):
    return _c(F, np, np.ones((2, 3)), np.float32).select(1, 0)


def size_of_dim(F, np):
    return _c(F, np, np.ones((2, 3)), np.float32).size(1)


def topk_last_dim(F, np):
    values, indices = F.topk(_c(F, np, np.arange(6).reshape(2, 3), np.float32), 2, 1)
    return indices


def cumsum_last_dim(F, np):
    return F.cumsum(_c(F, np, np.ones((2, 3)), np.int32), 1)


def softmax_last_dim(F, np):
    return F.softmax(_c(F, np, np.ones((2, 3)), np.float32), dim=1)


def argmax_keepdim(F, np):
    return F.argmax(_c(F, np, np.ones((2, 3)), np.float32), 1, keepdim=True)


def arange_of_ints(F, np):
    return F.arange(0, 5, "int32")


PROBES = {f.__name__: f for f in (
    shape_is_int64, shape_cast_to_int32, int32_meets_int64, where_mixed_int_kinds, where_python_int_follows_tensor,
    concat_mixed_int_kinds, concat_int_next_to_int64, empty_constant, int64_times_large_int, int32_times_large_int,
    half_times_python_int, python_int_minus_half, half_times_float, float_plus_int32, int32_plus_half_a_unit,
    and_of_int32, and_of_bool, reciprocal_of_tensor, negated_tensor, indexed_tensor, cast_to_own_dtype_is_itself,
    rms_norm_positional_weight, rms_norm_keyword_weight, matmul_half, gather_same_rank, select_with_int,
    index_select_rank1, slice_to_zero_width, view_with_zero_placeholder, permute_and_transpose, flatten_from_one,
    split_in_sizes, unbind_first, squeeze_and_unsqueeze, mean_keepdim, max_over_dim, repeat_rows, select_method,
    size_of_dim, topk_last_dim, cumsum_last_dim, softmax_last_dim, argmax_keepdim, arange_of_ints)}

# the stand-in refuses, the real code accepts and computes something else (api_1_2.yaml dtype_rules):
# int32_array(0.5) truncates to 0 (elementwise_binary); int32_array(2654435761) wraps (elementwise_binary)
STRICTER = {"int32_plus_half_a_unit", "int32_times_large_int"}

# Tensor methods the stand-in leaves out (the network does not call them; it says so in a NotImplementedError naming
# TensorRT-LLM): they must exist and work in the real code
NOT_MODELLED = {"split_in_sizes", "unbind_first", "squeeze_and_unsqueeze", "mean_keepdim", "repeat_rows"}
