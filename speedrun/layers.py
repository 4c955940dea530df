"""The layers both tracks build their blocks from: norm, the half-truncated rotary, the uniform init, attention,
the relu^2 MLP, the document-causal sliding-window masks (dense for CPU SDPA, FlexAttention BlockMask on CUDA) and
`attend`."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from speedrun.data import BOS_TOKEN


def norm(x):
    return F.rms_norm(x, (x.size(-1),))


class Rotary(nn.Module):
    """Half-truncated rotary embedding: the second quarter-half of frequencies is zero (those dims do not rotate)."""

    def __init__(self, head_dim, max_seq_len):
        super().__init__()
        freqs = (1 / 1024) ** torch.linspace(0, 1, steps=head_dim // 4, dtype=torch.float32)
        freqs = torch.cat([freqs, freqs.new_zeros(head_dim // 4)])
        theta = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), freqs)
        self.register_buffer("cos", theta.cos(), persistent=False)
        self.register_buffer("sin", theta.sin(), persistent=False)

    def forward(self, x):  # x: [B, T, H, D]
        T = x.size(-3)
        cos, sin = self.cos[None, :T, None, :], self.sin[None, :T, None, :]
        x1, x2 = x.float().chunk(2, dim=-1)
        y1 = x1 * cos + x2 * sin
        y2 = -x1 * sin + x2 * cos
        return torch.cat((y1, y2), dim=-1).type_as(x)


def padded_vocab(vocab_size):
    """The lm head's rows: the vocabulary rounded up to a multiple of 128 (50257 -> 50304)."""
    return ((vocab_size + 127) // 128) * 128


# Validation's lm head runs on at most this many tokens at a time: one piece's logits (fp32, 50304 wide) exist at
# once, so its memory does not grow with --val-seq-len (the record's 262,144 tokens unchunked: tens of GB).
VAL_HEAD_CHUNK_TOKENS = 16384


def val_head_chunks(seq_len, fewest):
    """Pieces validation's head splits a sequence into: at least `fewest` (a track's record value), more when a
    piece would exceed VAL_HEAD_CHUNK_TOKENS."""
    return max(fewest, -(-seq_len // VAL_HEAD_CHUNK_TOKENS))


def chunked_cross_entropy(latents, target_seq, logits_of, chunks=1):
    """Mean cross-entropy of logits_of(x) (a piece of latents[0] -> its fp32 logits) against target_seq, summed
    over `chunks` pieces of the sequence so that one piece's logits exist at a time, then averaged."""
    total = latents.new_zeros((), dtype=torch.float32)
    for xc, tc in zip(latents[0].chunk(chunks), target_seq.chunk(chunks)):
        total = total + F.cross_entropy(logits_of(xc), tc, reduction="sum")
    return total / target_seq.numel()


def uniform_init_(w):
    bound = math.sqrt(3) * 0.5 / math.sqrt(w.size(-1))
    with torch.no_grad():
        return w.uniform_(-bound, bound)


class CausalSelfAttention(nn.Module):
    """q, k, v, o of every head; cfg gives num_heads, head_dim, model_dim and attn_scale."""

    def __init__(self, cfg, max_seq_len, norm_v=True):
        super().__init__()
        self.norm_v = norm_v  # the medium track norms v per head, the small track does not
        self.num_heads, self.head_dim, self.scale = cfg.num_heads, cfg.head_dim, cfg.attn_scale
        hdim = cfg.num_heads * cfg.head_dim
        # q, k, v, o in one [4, hdim, dim] tensor so Muon orthogonalises the four as one batch.
        self.qkvo_w = nn.Parameter(torch.empty(4, hdim, cfg.model_dim))
        uniform_init_(self.qkvo_w[:3])
        with torch.no_grad():
            self.qkvo_w[3].zero_()
        self.rotary = Rotary(cfg.head_dim, max_seq_len)

    def forward(self, x, ve, mask, v_self, v_embed):
        B, T = x.shape[:2]
        qkv = F.linear(x, self.qkvo_w[:3].flatten(end_dim=1).type_as(x))
        q, k, v = qkv.view(B, T, 3 * self.num_heads, self.head_dim).chunk(3, dim=-2)
        q, k = self.rotary(norm(q)), self.rotary(norm(k))
        if self.norm_v:
            v = norm(v)
        v = v_self * v + v_embed * ve.view_as(v) if ve is not None else v_self * v
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, self.scale)
        y = y.transpose(1, 2).contiguous().view(B, T, self.num_heads * self.head_dim)
        return F.linear(y, self.qkvo_w[3].T.type_as(y))


class MLP(nn.Module):
    def __init__(self, dim, hidden, in_dim=None):
        super().__init__()
        self.fc_w = nn.Parameter(uniform_init_(torch.empty(hidden, in_dim or dim)))
        self.proj_w = nn.Parameter(torch.zeros(dim, hidden))

    def forward(self, x):
        x = F.linear(x, self.fc_w.type_as(x))
        return F.linear(F.relu(x).square(), self.proj_w.type_as(x))


# --- attention masks -------------------------------------------------------------------------------------------
# The mask: token q sees token k iff both are in the same document, k <= q, and k's block is fewer than W blocks
# before q's block. On CUDA it is a FlexAttention BlockMask built from block-level document ranges (no token-level
# mask evaluation); on CPU a dense boolean mask of the same function for SDPA.

def window_in_blocks(tokens, block_size):
    """A window of `tokens` rounded up to whole blocks, at least one block; returned in blocks."""
    return max(block_size, int(math.ceil(tokens / block_size)) * block_size) // block_size


def dense_window_mask(input_seq, window_blocks, block_size):
    docs = (input_seq == BOS_TOKEN).cumsum(0)
    idx = torch.arange(input_seq.numel(), device=input_seq.device)
    causal = idx[:, None] >= idx[None, :]
    same_doc = docs[:, None] == docs[None, :]
    in_window = (idx[:, None] // block_size - idx[None, :] // block_size) < window_blocks
    return causal & same_doc & in_window


def flex_block_masks(input_seq, window_blocks_list, block_size):
    """FlexAttention BlockMasks for each window (in blocks), from block-level document ranges."""
    docs = (input_seq == BOS_TOKEN).cumsum(0)
    num_blocks = input_seq.numel() // block_size
    docs_low = docs.view(num_blocks, block_size)[:, 0].contiguous()
    docs_high = docs.view(num_blocks, block_size)[:, -1].contiguous()

    def document_causal(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (docs[q_idx] == docs[kv_idx])

    blk = torch.arange(num_blocks, dtype=torch.int32, device=input_seq.device)
    any_visible = (blk[:, None] >= blk[None, :]) & (docs_low[:, None] <= docs_high[None, :]) & \
                  (docs_high[:, None] >= docs_low[None, :])
    all_visible = (blk[:, None] > blk[None, :]) & (docs_low[:, None] == docs_high[None, :]) & \
                  (docs_high[:, None] == docs_low[None, :])

    def most_recent_first(dense):
        count = dense.sum(dim=-1, dtype=torch.int32)
        order = dense.to(torch.int32).argsort(dim=-1, descending=False, stable=True).flip(-1).to(torch.int32)
        return count[None, None].contiguous(), order[None, None].contiguous()

    partial_num, partial_idx = most_recent_first(any_visible & ~all_visible)
    full_num, full_idx = most_recent_first(all_visible)
    masks = []
    for w in window_blocks_list:
        # Keep the w-1 most recent full blocks and enough partial blocks (the diagonal at least) to make w.
        masks.append(BlockMask.from_kv_blocks(
            torch.clamp_max(partial_num, torch.clamp_min(w - full_num, 1)), partial_idx,
            torch.clamp_max(full_num, w - 1), full_idx, BLOCK_SIZE=block_size, mask_mod=document_causal))
    return masks


_flex_attention_compiled_alone = None


def attend(q, k, v, mask, scale):
    if isinstance(mask, torch.Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if torch.compiler.is_compiling():  # traced into the model's (or region's) graph
        return flex_attention(q, k, v, block_mask=mask, scale=scale)
    # Compiled on its own under --compile off: eager FlexAttention ignores the block sparsity (the window) and
    # materialises the whole score matrix. Made on first use here, never inside a trace: a global that changes
    # after a graph was traced would fail that graph's guards and compile it twice.
    global _flex_attention_compiled_alone
    if _flex_attention_compiled_alone is None:
        _flex_attention_compiled_alone = torch.compile(flex_attention, dynamic=False)
    return _flex_attention_compiled_alone(q, k, v, block_mask=mask, scale=scale)
