"""The token-window document attention (speedrun/r18/attention.py): every CPU-runnable implementation equals an
independent per-query reference on the same documents and windows; `--attention` resolves as documented."""

import pytest
import torch

from speedrun.r18 import attention as va
from speedrun.errors import UsageError

# (cu_seqlens, window): several documents, a first document of one token, trailing empty documents (as the
# record's loader pads them), window 0 (only the token itself), a window longer than any document.
CASES = [
    ([0, 1, 7, 20, 29, 29, 29], 4),
    ([0, 13, 29], 0),
    ([0, 29], 5),
    ([0, 3, 10, 29], 100),
]
T, H, D = 29, 2, 8


def reference_attention(q, k, v, bounds, window, scale):
    """Each query's softmax over the keys of its own document no more than `window` tokens behind it."""
    out = torch.zeros_like(q)
    for start, end in zip(bounds[:-1], bounds[1:]):
        for t in range(start, end):
            keys = slice(max(start, t - window), t + 1)
            scores = torch.einsum("hd,khd->hk", q[t], k[keys]) * scale
            out[t] = torch.einsum("hk,khd->hd", scores.softmax(-1), v[keys])
    return out


def qkv(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(T, H, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)]


@pytest.mark.slow
@pytest.mark.parametrize("bounds,window", CASES)
def test_sdpa_equals_reference_forward_and_backward(bounds, window):
    """Guards: r18's SDPA document attention equals a per-query float64 reference, forward and backward."""
    q, k, v = qkv(len(bounds) + window)
    cu = torch.tensor(bounds, dtype=torch.int32)
    got = va.varlen_attend("sdpa", q, k, v, cu, T, window, 0.3)
    want = reference_attention(q, k, v, bounds, window, 0.3)
    torch.testing.assert_close(got, want)
    probe = torch.randn(T, H, D, dtype=torch.float64)
    grads_got = torch.autograd.grad((got * probe).sum(), (q, k, v))
    grads_want = torch.autograd.grad((want * probe).sum(), (q, k, v))
    for a, b in zip(grads_got, grads_want):
        torch.testing.assert_close(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("bounds,window", CASES)
def test_flex_equals_reference_forward(bounds, window):
    """Guards: r18's FlexAttention document attention equals the per-query reference forward on CPU."""
    # FlexAttention has no CPU backward (torch 2.13); its gradients are FlexAttention's own, checked on GPU.
    q, k, v = (t.detach() for t in qkv(len(bounds) + window))
    cu = torch.tensor(bounds, dtype=torch.int32)
    torch.testing.assert_close(va.varlen_attend("flex", q, k, v, cu, T, window, 0.3),
                               reference_attention(q, k, v, bounds, window, 0.3))


def test_segment_ids_skip_empty_documents():
    cu = torch.tensor([0, 0, 2, 5, 5, 6], dtype=torch.int32)
    assert va.segment_ids(cu, 6).tolist() == [1, 1, 2, 2, 2, 4]


def test_dense_mask_is_flash_attention_window_semantics():
    # window w: keys q-w..q of the same document (w+1 tokens), never across a boundary.
    mask = va.dense_varlen_mask(torch.tensor([0, 4, 10], dtype=torch.int32), 10, 2)
    assert mask[9].nonzero().flatten().tolist() == [7, 8, 9]
    assert mask[5].nonzero().flatten().tolist() == [4, 5]
    assert mask[3].nonzero().flatten().tolist() == [1, 2, 3]


def test_check_cu_seqlens_refuses_bad_boundaries():
    va.check_cu_seqlens(torch.tensor([0, 3, 3, 8]), 8)
    for bad in ([1, 8], [0, 7], [0, 5, 3, 8]):
        with pytest.raises(ValueError):
            va.check_cu_seqlens(torch.tensor(bad), 8)


def test_auto_on_cpu_is_sdpa_and_gpu_only_choices_are_refused():
    assert va.resolve_attention("auto", "cpu") == "sdpa"
    with pytest.raises(UsageError, match="--attention flex: FlexAttention has no backward on CPU"):
        va.resolve_attention("flex", "cpu")
    for name in ("fa3", "varlen"):
        with pytest.raises(UsageError, match=f"--attention {name}: {name} needs a CUDA GPU"):
            va.resolve_attention(name, "cpu")
    with pytest.raises(UsageError, match="expected one of"):
        va.resolve_attention("xformers", "cpu")


def test_auto_on_cuda_falls_back_fa3_then_varlen_then_flex(monkeypatch):
    monkeypatch.setattr(va, "_fa3_interface", lambda: object())
    monkeypatch.setattr(va, "_torch_varlen_function", lambda: object())
    assert va.resolve_attention("auto", "cuda") == "fa3"
    monkeypatch.setattr(va, "_fa3_interface", lambda: None)
    assert va.resolve_attention("auto", "cuda") == "varlen"
    with pytest.raises(UsageError, match="kernels"):
        va.resolve_attention("fa3", "cuda")
    monkeypatch.setattr(va, "_torch_varlen_function", lambda: None)
    assert va.resolve_attention("auto", "cuda") == "flex"
    with pytest.raises(UsageError, match="no varlen_attn with a window"):
        va.resolve_attention("varlen", "cuda")


def test_fa3_without_kernels_package_is_unavailable_not_an_import_error():
    va._LOADED_KERNELS.pop("fa3", None)
    try:
        import kernels  # noqa: F401
        pytest.skip("the optional kernels package is installed here")
    except ImportError:
        assert va._fa3_interface() is None


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fa3", "varlen"])
def test_gpu_kernels_get_flash_attention_window_arguments(name, monkeypatch):
    """Guards: the fa3 and varlen glue hand stand-in kernels int32 bounds, causal and (window, 0): sdpa's result."""
    # The CUDA-only kernels cannot run here: a stand-in with their documented semantics (cumulative int32
    # boundaries, causal, window (left, 0)) checks that the glue hands them what the reference means.
    bounds, window = CASES[0]
    calls = []

    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, scale, window_size):
        assert cu_q.dtype == torch.int32 and torch.equal(cu_q, cu_k) and window_size[1] == 0
        calls.append(max_q)
        return reference_attention(q, k, v, cu_q.tolist(), window_size[0], scale)

    if name == "varlen":
        monkeypatch.setattr(va, "_torch_varlen_function", lambda: lambda q, k, v, cq, ck, mq, mk, scale, window_size:
                            kernel(q, k, v, cq, ck, mq, mk, scale, window_size))
    else:
        class Interface:
            @staticmethod
            def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                       softmax_scale, window_size):
                assert causal
                return kernel(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                              window_size)
        monkeypatch.setattr(va, "_fa3_interface", lambda: Interface)
    q, k, v = qkv(1)
    cu = torch.tensor(bounds, dtype=torch.int64)
    got = va.varlen_attend(name, q, k, v, cu, 16, window, 0.3)
    torch.testing.assert_close(got, va.varlen_attend("sdpa", q, k, v, cu, 16, window, 0.3))
    assert calls == [16]


def test_a_resume_on_another_kernel_is_labelled_with_both():
    assert va.kernel_history(None, "sdpa", 0) == "sdpa"  # a fresh run
    assert va.kernel_history("fa3", "fa3", 400) == "fa3"
    assert va.kernel_history("flex", "fa3", 400) == "flex to step 400, then fa3"
    assert va.kernel_history("flex to step 400, then fa3", "fa3", 800) == "flex to step 400, then fa3"
    assert va.kernel_history("flex to step 400, then fa3", "varlen", 800) == \
        "flex to step 400, then fa3 to step 800, then varlen"
    assert va.kernel_history(None, "fa3", 400) == "unrecorded to step 400, then fa3"  # a checkpoint without a label


def test_a_run_timed_on_two_kernels_is_warned_about_even_when_it_ends_on_fa3():
    from types import SimpleNamespace

    from analysis.logs import attention_warnings
    label = va.kernel_history("flex", "fa3", 400)
    (warning,) = attention_warnings({"resumed": [SimpleNamespace(config={"base": "r18", "attention": label})]})
    assert "attention flex to step 400, then fa3, not fa3" in warning
