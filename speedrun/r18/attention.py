"""Attention over packed documents with a token-level sliding window (the masking of the medium record #18).

One sequence of T tokens holds several documents, given as cumulative boundaries `cu_seqlens` ([N+1] int32,
non-decreasing, first 0, last T; repeated trailing T entries are empty documents). Query token q sees key token k
iff both lie in the same document and 0 <= q - k <= window: FlashAttention's `window_size=(window, 0)` with
`causal=True`. Four implementations of that one function, chosen by `--attention`:

- fa3:    FlashAttention-3 varlen through the optional `kernels` package (a kernel hub download, so only on an
          online CUDA node; never required: a failed import or load just makes it unavailable);
- varlen: PyTorch's own `torch.nn.attention.varlen.varlen_attn` with `window_size` (CUDA, torch builds that have it);
- flex:   FlexAttention with a token-level mask_mod (compiled on CUDA; eager on CPU, where it is exact but dense);
- sdpa:   SDPA on the dense boolean mask of the same function (CPU runs and tests).

auto = the first available of fa3, varlen, flex on CUDA; sdpa on CPU (the only one that trains there: flex has no
CPU backward). Tensors are [T, H, D] (no batch dim).

A resumed run may go on under another kernel than its checkpoint's (another node): kernel_history names both, with
the step where the kernel changed, in the log's config line and in the checkpoints after it, so a run timed on two
kernels is never labelled with one.

Under `--compile on` each is traced into the model's one graph: sdpa and flex as torch ops (flex's block mask
built inside the graph), varlen as torch's own custom op, fa3 through its interface's autograd.Function over the
kernel hub's registered ops (as the record compiles it). The kernels are loaded before anything is compiled
(resolve_attention); a trace only looks them up.
"""

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from speedrun.errors import UsageError

ATTENTION_CHOICES = ("auto", "fa3", "varlen", "flex", "sdpa")
FA3_KERNEL_REPO = "varunneal/flash-attention-3"


def segment_ids(cu_seqlens, num_tokens):
    """The document index of every token position (empty documents take no position)."""
    positions = torch.arange(num_tokens, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    return torch.searchsorted(cu_seqlens[1:].contiguous(), positions, right=True)


def check_cu_seqlens(cu_seqlens, num_tokens):
    """Boundaries the kernels can take: 1-D, starts at 0, ends at T, never decreasing."""
    if cu_seqlens.ndim != 1 or cu_seqlens.numel() < 2:
        raise ValueError("cu_seqlens must be 1-D with at least two entries")
    if int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != num_tokens:
        raise ValueError(f"cu_seqlens must start at 0 and end at {num_tokens}")
    if bool((cu_seqlens[1:] < cu_seqlens[:-1]).any()):
        raise ValueError("cu_seqlens must not decrease")


def dense_varlen_mask(cu_seqlens, num_tokens, window):
    """[T, T] boolean: query q (row) sees key k (column)."""
    docs = segment_ids(cu_seqlens, num_tokens)
    idx = torch.arange(num_tokens, device=cu_seqlens.device)
    behind = idx[:, None] - idx[None, :]
    return (docs[:, None] == docs[None, :]) & (behind >= 0) & (behind <= window)


def _sdpa(q, k, v, cu_seqlens, max_len, window, scale):
    mask = dense_varlen_mask(cu_seqlens, q.size(0), window)
    y = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                       attn_mask=mask, scale=scale)
    return y.transpose(0, 1)


def flex_varlen_block_mask(cu_seqlens, num_tokens, window):
    docs = segment_ids(cu_seqlens, num_tokens)

    def document_window(b, h, q_idx, kv_idx):
        behind = q_idx - kv_idx
        return (docs[q_idx] == docs[kv_idx]) & (behind >= 0) & (behind <= window)

    return create_block_mask(document_window, None, None, num_tokens, num_tokens, device=cu_seqlens.device)


@functools.cache
def _compiled_flex_attention():
    # Compiled once and outside any trace (a global changing after tracing would fail that graph's guards).
    return torch.compile(flex_attention, dynamic=False)


def _flex(q, k, v, cu_seqlens, max_len, window, scale):
    block_mask = flex_varlen_block_mask(cu_seqlens, q.size(0), window)
    args = (q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None])
    if q.is_cuda and not torch.compiler.is_compiling():
        y = _compiled_flex_attention()(*args, block_mask=block_mask, scale=scale)
    else:  # traced into the caller's graph, or eager on CPU (exact, materialises the scores)
        y = flex_attention(*args, block_mask=block_mask, scale=scale)
    return y[0].transpose(0, 1)


_LOADED_KERNELS = {}


def _loaded_once(name, load):
    """load() on the first call, its result after: a dict look-up, which a compiled graph traces as a constant
    (torch.compile would trace through a functools.cache wrapper into the imports and checks of load, and fail).
    resolve_attention loads the run's kernel before anything is compiled."""
    if name not in _LOADED_KERNELS:
        _LOADED_KERNELS[name] = load()
    return _LOADED_KERNELS[name]


def _load_torch_varlen_function():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    import inspect
    return varlen_attn if "window_size" in inspect.signature(varlen_attn).parameters else None


def _torch_varlen_function():
    """torch's varlen attention (a torch custom op, so compiled graphs hold it whole) when this build has one
    taking a window, else None."""
    return _loaded_once("varlen", _load_torch_varlen_function)


def _varlen(q, k, v, cu_seqlens, max_len, window, scale):
    cu = cu_seqlens.to(torch.int32)
    return _torch_varlen_function()(q, k, v, cu, cu, max_len, max_len, scale=scale, window_size=(window, 0))


def _load_fa3_interface():
    try:
        from kernels import get_kernel
        return get_kernel(FA3_KERNEL_REPO).flash_attn_interface
    except Exception:  # noqa: BLE001 - an optional accelerator; every failure means "not here"
        return None


def _fa3_interface():
    """FlashAttention-3's interface from the kernel hub, or None (no `kernels` package, offline, no kernel for
    this GPU: any failure only makes fa3 unavailable). Its varlen function is an autograd.Function over the hub
    build's registered torch ops, which torch.compile traces into a full graph (as record #18 compiles it)."""
    return _loaded_once("fa3", _load_fa3_interface)


def _fa3(q, k, v, cu_seqlens, max_len, window, scale):
    cu = cu_seqlens.to(torch.int32)
    return _fa3_interface().flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max_len,
                                                   max_seqlen_k=max_len, causal=True, softmax_scale=scale,
                                                   window_size=(window, 0))


IMPLEMENTATIONS = {"fa3": _fa3, "varlen": _varlen, "flex": _flex, "sdpa": _sdpa}


def unavailable_reason(name, device_type):
    """Why `name` cannot train on this device, or None when it can."""
    if name in ("fa3", "varlen") and device_type != "cuda":
        return f"{name} needs a CUDA GPU"
    if name == "flex" and device_type != "cuda":  # its forward runs (eager), its first backward raises
        return "FlexAttention has no backward on CPU (training needs one); use sdpa, the same function on CPU"
    if name == "varlen" and _torch_varlen_function() is None:
        return f"this torch ({torch.__version__}) has no varlen_attn with a window"
    if name == "fa3" and _fa3_interface() is None:
        return f"FlashAttention-3 could not be loaded (needs the optional `kernels` package and {FA3_KERNEL_REPO})"
    return None


def resolve_attention(choice, device_type):
    """The implementation name `--attention choice` runs on this device; an explicit choice that cannot run is
    a UsageError naming why."""
    if choice not in ATTENTION_CHOICES:
        raise UsageError(f"--attention: expected one of {', '.join(ATTENTION_CHOICES)}, got {choice!r}")
    if choice == "auto":
        if device_type != "cuda":
            return "sdpa"
        return next(name for name in ("fa3", "varlen", "flex") if unavailable_reason(name, device_type) is None)
    reason = unavailable_reason(choice, device_type)
    if reason is not None:
        raise UsageError(f"--attention {choice}: {reason}")
    return choice


def kernel_history(previous, attention, step):
    """The attention label of a run going on at `step` under `attention` from a checkpoint whose steps ran on
    `previous` (its own label; None for a checkpoint from before labels were saved, or no checkpoint)."""
    if step == 0:
        return attention
    if previous is None:
        previous = "unrecorded"
    if previous.rsplit(", then ", 1)[-1] == attention:
        return previous
    return f"{previous} to step {step}, then {attention}"


def varlen_attend(name, q, k, v, cu_seqlens, max_len, window, scale):
    """Attention of [T, H, D] q, k, v over the documents of cu_seqlens with a `window`-token look-back."""
    return IMPLEMENTATIONS[name](q, k, v, cu_seqlens, max_len, window, scale)
