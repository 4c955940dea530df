"""GPT-2 Medium speedrun (2.92 val-loss track), research fork.

With no flags this is the upstream medium-track baseline (the 2025-09-30 "Smoothed Snoo" record: 5590 steps on
8xH100). Study flags add the backout skip, LAuReL and DLO variants; every one of them is off by default.

Runs as `torchrun --standalone --nproc_per_node=N train_gpt_medium.py` (N in 1, 2, 4, 8; every world size sees the
same tokens per optimiser step through gradient accumulation) or as a plain `python train_gpt_medium.py`.
On CUDA: NCCL, FlexAttention, torch.compile. On CPU: gloo and an SDPA attention on the same mask (for tests and the
demo, `--preset tiny`). Importing this file runs nothing.
"""

import argparse
import copy
import glob
import json
import math
import os
import platform
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, asdict, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

TRACK = "medium"
VIRTUAL_RANKS = 8  # upstream's 8 GPUs: the unit of data parallelism every world size reproduces
SHARD_MAGIC, SHARD_VERSION, SHARD_HEADER_INTS = 20240520, 1, 256
BOS_TOKEN = 50256


class UsageError(Exception):
    """Bad input: reported as one line on stderr and exit status 2, before any log is written."""


# ----------------------------------------------------------------------------------------------------------------
# Configuration

@dataclass
class ModelConfig:
    vocab_size: int = 50257
    num_layers: int = 16
    model_dim: int = 1024
    num_heads: int = 8
    head_dim: int = 128
    mlp_ratio: int = 4
    block_size: int = 128  # attention windows are counted in blocks of this many tokens
    max_window_tokens: int = 3456
    attn_scale: float = 0.12


PRESETS = {
    "full": dict(num_layers=16, model_dim=1024, num_heads=8, head_dim=128, block_size=128, max_window_tokens=3456,
                 train_seq_len=64 * 1024, val_seq_len=4 * 64 * 1024, val_tokens=10_485_760,
                 num_iterations=5590, val_every=125,
                 train_files="data/fineweb10B/fineweb_train_*.bin", val_files="data/fineweb10B/fineweb_val_*.bin"),
    # CPU-sized: trains on the bundled demo shards in seconds per step.
    "tiny": dict(num_layers=6, model_dim=64, num_heads=2, head_dim=32, block_size=16, max_window_tokens=48,
                 train_seq_len=64, val_seq_len=128, val_tokens=2048,
                 num_iterations=40, val_every=10,
                 train_files="data/demo/demo_train_*.bin", val_files="data/demo/demo_val_*.bin"),
}


def layer_pattern(num_layers):
    """Per-layer structure derived from the layer count; gives exactly the upstream values at 16 layers.

    - value embeddings: n_ve = max(1, 5L//16); layers 0..n_ve-1 and L-n_ve..L-1 use ve[0..n_ve-1].
    - long attention windows: first and last layer of each value-embedding run (0, 4, 11, 15 at L=16).
    - the layer without attention: L//2 - 1 (7 at L=16).
    - U-net skips: with m = L//2, for k = 1..(m-1)//2 the output of layer m-2k is added before layer m+k
      (6->9, 4->10, 2->11 at L=16).
    """
    if num_layers < 2:
        raise UsageError(f"--num-layers must be at least 2 (got {num_layers})")
    n_ve = max(1, (5 * num_layers) // 16)
    ve_index = [None] * num_layers
    for i in range(n_ve):
        ve_index[i] = i
        ve_index[num_layers - n_ve + i] = i
    long_window = sorted({0, n_ve - 1, num_layers - n_ve, num_layers - 1})
    mid = num_layers // 2
    unet = [(mid - 2 * k, mid + k) for k in range(1, (mid - 1) // 2 + 1)]
    return dict(num_value_embeds=n_ve, ve_index=ve_index, long_window_layers=long_window,
                no_attention_layer=mid - 1, unet_pairs=unet)


# ----------------------------------------------------------------------------------------------------------------
# Data: shards and the upstream token stream

def read_shard(path):
    path = str(path)
    try:
        with open(path, "rb") as f:
            header = np.frombuffer(f.read(SHARD_HEADER_INTS * 4), dtype="<i4")
            if header.size != SHARD_HEADER_INTS:
                raise UsageError(f"{path}: malformed shard (header shorter than {SHARD_HEADER_INTS * 4} bytes)")
            if header[0] != SHARD_MAGIC:
                raise UsageError(f"{path}: not a token shard (magic {header[0]}, expected {SHARD_MAGIC})")
            if header[1] != SHARD_VERSION:
                raise UsageError(f"{path}: unsupported shard version {header[1]}")
            num_tokens = int(header[2])
            tokens = np.frombuffer(f.read(), dtype="<u2")
    except OSError as e:
        raise UsageError(f"{path}: cannot read shard ({e.strerror})")
    if tokens.size != num_tokens:
        raise UsageError(f"{path}: truncated shard ({tokens.size} tokens present, header says {num_tokens})")
    return torch.from_numpy(tokens.astype(np.int32))


def find_shards(pattern, flag):
    files = sorted(glob.glob(pattern))
    if not files:
        raise UsageError(f"{flag}: no files match {pattern!r}")
    return files


class TokenStream:
    """The upstream stream: files in name order, no wrap-around; each step takes VIRTUAL_RANKS sequences of
    seq_len(+1) tokens from `pos`, virtual rank v taking [pos + v*T, pos + (v+1)*T + 1)."""

    def __init__(self, files, seq_len, what):
        self.files, self.seq_len, self.what = files, seq_len, what
        self.file_index, self.pos, self.tokens = -1, 0, None
        self._advance_file()

    def _advance_file(self):
        self.file_index += 1
        if self.file_index >= len(self.files):
            raise UsageError(f"{self.what}: ran out of tokens after {len(self.files)} file(s); "
                             f"download more shards or train for fewer steps")
        self.tokens, self.pos = read_shard(self.files[self.file_index]), 0

    def state(self):
        return dict(file_index=self.file_index, pos=self.pos)

    def restore(self, state):
        self.file_index = state["file_index"] - 1
        self._advance_file()
        self.pos = state["pos"]

    def next_batch(self, virtual_ranks):
        """Returns [(inputs, targets)] for the given virtual ranks of the next step, and advances the stream."""
        span = VIRTUAL_RANKS * self.seq_len
        if self.pos + span + 1 >= len(self.tokens):
            self._advance_file()
            if span + 1 >= len(self.tokens):
                raise UsageError(f"{self.files[self.file_index]}: shard has {len(self.tokens)} tokens, "
                                 f"fewer than one step's {span + 1}")
        out = []
        for v in virtual_ranks:
            start = self.pos + v * self.seq_len
            chunk = self.tokens[start:start + self.seq_len + 1].long()
            out.append((chunk[:-1], chunk[1:]))
        self.pos += span
        return out


# ----------------------------------------------------------------------------------------------------------------
# Model

def norm(x):
    return F.rms_norm(x, (x.size(-1),))


def softcap(logits):
    return 15 * logits * torch.rsqrt(logits.square() + 225)


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


def uniform_init_(w):
    bound = math.sqrt(3) * 0.5 / math.sqrt(w.size(-1))
    with torch.no_grad():
        return w.uniform_(-bound, bound)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, max_seq_len):
        super().__init__()
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
        v = norm(v)
        v = v_self * v + v_embed * ve.view_as(v) if ve is not None else v_self * v
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, self.scale)
        y = y.transpose(1, 2).contiguous().view(B, T, self.num_heads * self.head_dim)
        return F.linear(y, self.qkvo_w[3].T.type_as(y))


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc_w = nn.Parameter(uniform_init_(torch.empty(hidden, dim)))
        self.proj_w = nn.Parameter(torch.zeros(dim, hidden))

    def forward(self, x):
        x = F.linear(x, self.fc_w.type_as(x))
        return F.linear(F.relu(x).square(), self.proj_w.type_as(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, has_attention, max_seq_len):
        super().__init__()
        self.attn = CausalSelfAttention(cfg, max_seq_len) if has_attention else None
        self.mlp = MLP(cfg.model_dim, cfg.mlp_ratio * cfg.model_dim)

    def forward(self, x, x00, x01, ve, mask, lambdas, v_lambdas):
        x = lambdas[0] * x + lambdas[1] * x00 + lambdas[2] * x01
        if self.attn is not None:
            x = x + self.attn(x, ve, mask, v_lambdas[0], v_lambdas[1])
        return x + self.mlp(norm(x))


# --- attention masks -------------------------------------------------------------------------------------------
# The mask: token q sees token k iff both are in the same document, k <= q, and k's block is fewer than W blocks
# before q's block. On CUDA it is a FlexAttention BlockMask built from block-level document ranges (no token-level
# mask evaluation); on CPU a dense boolean mask of the same function for SDPA.

def window_blocks_at(step, num_iterations, cfg: ModelConfig):
    x = step / num_iterations
    tokens = cfg.max_window_tokens * (4 * x ** 3 - 6 * x ** 2 + 3 * x)
    tokens = max(cfg.block_size, int(math.ceil(tokens / cfg.block_size)) * cfg.block_size)
    return tokens // cfg.block_size


def dense_window_mask(input_seq, window_blocks, block_size):
    docs = (input_seq == BOS_TOKEN).cumsum(0)
    idx = torch.arange(input_seq.numel(), device=input_seq.device)
    causal = idx[:, None] >= idx[None, :]
    same_doc = docs[:, None] == docs[None, :]
    in_window = (idx[:, None] // block_size - idx[None, :] // block_size) < window_blocks
    return causal & same_doc & in_window


def flex_block_masks(input_seq, window_blocks_list, block_size):
    """FlexAttention BlockMasks for each window (in blocks), from block-level document ranges."""
    from torch.nn.attention.flex_attention import BlockMask
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


def attend(q, k, v, mask, scale):
    if isinstance(mask, torch.Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    from torch.nn.attention.flex_attention import flex_attention
    return flex_attention(q, k, v, block_mask=mask, scale=scale)


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, max_seq_len):
        super().__init__()
        self.cfg = cfg
        self.pattern = layer_pattern(cfg.num_layers)
        L, D = cfg.num_layers, cfg.model_dim
        self.embed1 = nn.Embedding(cfg.vocab_size, D)
        self.embed2 = nn.Embedding(cfg.vocab_size, D)
        self.value_embeds = nn.ModuleList(nn.Embedding(cfg.vocab_size, cfg.num_heads * cfg.head_dim)
                                          for _ in range(self.pattern["num_value_embeds"]))
        self.blocks = nn.ModuleList(Block(cfg, i != self.pattern["no_attention_layer"], max_seq_len)
                                    for i in range(L))
        padded_vocab = ((cfg.vocab_size + 127) // 128) * 128
        self.lm_head_w = nn.Parameter(torch.zeros(padded_vocab, D))
        # Study variants keep their modules here (key = variant name) and their scalars in the shared vector,
        # so parameter counts, optimiser groups and logging find them without special cases.
        self.study = nn.ModuleDict()
        # Every learned scalar lives in one vector; `scalar_layout` names the slices.
        self._scalar_inits, self.scalar_layout = [], {}
        self.add_scalars("unet", torch.ones(len(self.pattern["unet_pairs"])))
        self.add_scalars("block", torch.tensor([1.0, 0.0, 0.0]).repeat(L))
        self.add_scalars("value", torch.tensor([0.5, 0.5]).repeat(L))
        self.add_study_variants(cfg)
        self.scalars = nn.Parameter(torch.cat(self._scalar_inits))
        del self._scalar_inits

    def add_scalars(self, name, init):
        """Reserves a named slice of the scalar vector (only during __init__)."""
        start = sum(t.numel() for t in self._scalar_inits)
        self._scalar_inits.append(init.float().flatten())
        self.scalar_layout[name] = (start, start + init.numel())

    def add_study_variants(self, cfg):
        """Adds the modules and scalars of the study flags in cfg (none for the baseline)."""

    def scalar_slice(self, name):
        a, b = self.scalar_layout[name]
        return self.scalars[a:b]

    def added_params(self):
        """Parameters added by each study variant: its modules plus its scalar slices ("name" or "name.*")."""
        counts = {name: sum(p.numel() for p in module.parameters()) for name, module in self.study.items()}
        for key, (a, b) in self.scalar_layout.items():
            variant = key.split(".")[0]
            if variant not in ("unet", "block", "value"):
                counts[variant] = counts.get(variant, 0) + (b - a)
        return counts

    def matrix_params(self):
        """The hidden matrices Muon trains, with their weight-decay multipliers (study matrices: 1)."""
        out = []
        for block in self.blocks:
            if block.attn is not None:
                out.append((block.attn.qkvo_w, 1.0))
            out += [(block.mlp.fc_w, 2.0), (block.mlp.proj_w, 2.0)]
        out += [(p, 1.0) for p in self.study.parameters() if p.ndim >= 2]
        return out

    def embedding_params(self):
        return [self.embed1.weight, self.embed2.weight] + [e.weight for e in self.value_embeds]

    def masks(self, input_seq, window_blocks):
        """(long, short) masks for this sequence and window; short is half the long window, at least 1 block."""
        bs = self.cfg.block_size
        long_w, short_w = window_blocks, torch.clamp_min(window_blocks // 2, 1)
        if input_seq.is_cuda:
            return tuple(flex_block_masks(input_seq, [long_w, short_w], bs))
        return dense_window_mask(input_seq, long_w, bs), dense_window_mask(input_seq, short_w, bs)

    def hidden_states(self, input_seq, window_blocks):
        """Runs the blocks; returns the final residual, every layer's output, and x00."""
        pat = self.pattern
        ve_all = [e(input_seq)[None] for e in self.value_embeds]
        long_mask, short_mask = self.masks(input_seq, window_blocks)
        x00 = norm(self.embed1(input_seq)[None])
        x01 = norm(self.embed2(input_seq)[None])
        x = x00
        skip_w = self.scalar_slice("unet")
        lambdas = self.scalar_slice("block").view(-1, 3)
        v_lambdas = self.scalar_slice("value").view(-1, 2)
        skip_into = {dst: (j, src) for j, (src, dst) in enumerate(pat["unet_pairs"])}
        outputs = []
        for i, block in enumerate(self.blocks):
            if i in skip_into:
                j, src = skip_into[i]
                x = x + skip_w[j] * outputs[src]
            ve = ve_all[pat["ve_index"][i]] if pat["ve_index"][i] is not None else None
            mask = long_mask if i in pat["long_window_layers"] else short_mask
            x = block(x, x00, x01, ve, mask, lambdas[i], v_lambdas[i])
            outputs.append(x)
        return x, outputs, x00

    def head_input(self, x, outputs, x00):
        return norm(x)

    def forward(self, input_seq, target_seq, window_blocks, head_chunks=1):
        """Mean cross-entropy of the next-token predictions of one sequence (batch size 1)."""
        x, outputs, x00 = self.hidden_states(input_seq, window_blocks)
        x = self.head_input(x, outputs, x00)
        total = x.new_zeros((), dtype=torch.float32)
        for xc, tc in zip(x[0].chunk(head_chunks), target_seq.chunk(head_chunks)):
            logits = softcap(F.linear(xc, self.lm_head_w.type_as(xc)).float())
            total = total + F.cross_entropy(logits, tc, reduction="sum")
        return total / target_seq.numel()

    def named_scalars(self):
        """Every learned scalar a study plots, under readable names."""
        pat, out = self.pattern, {}
        for (src, dst), w in zip(pat["unet_pairs"], self.scalar_slice("unet").tolist()):
            out[f"skip.L{src}->L{dst}"] = w
        lam = self.scalar_slice("block").view(-1, 3).tolist()
        vl = self.scalar_slice("value").view(-1, 2).tolist()
        for i in range(self.cfg.num_layers):
            out[f"block{i}.a"], out[f"block{i}.b"], out[f"block{i}.c"] = lam[i]
            if self.blocks[i].attn is not None:
                out[f"block{i}.v_self"], out[f"block{i}.v_embed"] = vl[i]
        return out


# ----------------------------------------------------------------------------------------------------------------
# Optimisers

NS5_COEFFS = ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
              (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012))


def newton_schulz5(g, dtype=torch.bfloat16):
    """Approximately orthogonalises the last two dims of g (batched over leading dims), in bf16 (upstream)."""
    x = g.to(dtype)
    transposed = g.size(-2) > g.size(-1)
    if transposed:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for a, b, c in NS5_COEFFS:
        A = x @ x.mT
        B = b * A + c * A @ A
        x = a * x + B @ x
    return x.mT if transposed else x


def fp32_from_bf16_parts(high_bf16, low_bits):
    """The fp32 value whose top 16 bits are the bf16 parameter and bottom 16 bits the mantissa buffer."""
    bits = (high_bf16.view(torch.int16).to(torch.int32) << 16) | (low_bits.to(torch.int32) & 0xFFFF)
    return bits.view(torch.float32)


def split_fp32_into_bf16_parts(value_fp32, high_bf16, low_bits):
    bits = value_fp32.contiguous().view(torch.int32)
    high_bf16.view(torch.int16).copy_((bits >> 16).to(torch.int16))
    low_bits.copy_(bits.to(torch.int16))


class Muon(torch.optim.Optimizer):
    """Muon with Nesterov momentum, NS5, update smoothing and decoupled weight decay.

    Parameters are sorted by size and taken world_size at a time: each rank updates one and the group is
    all-gathered, so a parameter's state lives on its owning rank only. bf16 parameters are updated as if fp32 by
    keeping their low 16 bits in a separate buffer.
    """

    def __init__(self, params_with_wd_mul, lr, weight_decay, momentum, smoothing=0.2, rank=0, world_size=1,
                 ns_dtype=torch.bfloat16):
        params = [p for p, _ in params_with_wd_mul]
        super().__init__([dict(params=params)], dict(lr=lr, weight_decay=weight_decay, momentum=momentum))
        self.wd_mul = {p: m for p, m in params_with_wd_mul}
        self.smoothing, self.rank, self.world_size, self.ns_dtype = smoothing, rank, world_size, ns_dtype
        self.ordered = sorted(params, key=lambda p: p.numel(), reverse=True)
        self.position = {id(p): i for i, p in enumerate(self.ordered)}

    def owner(self, p):
        return self.position[id(p)] % self.world_size

    def _state(self, p):
        st = self.state[p]
        if not st:
            st["momentum"] = torch.zeros_like(p, dtype=torch.float32)
            st["smoothed"] = torch.zeros_like(p, dtype=torch.float32)
            if p.dtype == torch.bfloat16:
                st["mantissa"] = torch.zeros_like(p, dtype=torch.int16)
        return st

    def master_value(self, p):
        st = self._state(p)
        return fp32_from_bf16_parts(p.data, st["mantissa"]) if "mantissa" in st else p.data.float()

    def write_master(self, p, value_fp32):
        """Sets p to a fp32 value: truncated to bf16 on every rank (identical everywhere), low bits kept by owner."""
        if p.dtype == torch.bfloat16:
            if self.owner(p) == self.rank:
                split_fp32_into_bf16_parts(value_fp32, p.data, self._state(p)["mantissa"])
            else:
                p.data.view(torch.int16).copy_((value_fp32.contiguous().view(torch.int32) >> 16).to(torch.int16))
        else:
            p.data.copy_(value_fp32)

    @torch.no_grad()
    def step(self):
        group = self.param_groups[0]
        lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
        ws = self.world_size
        for base in range(0, len(self.ordered), ws):
            chunk = self.ordered[base:base + ws]
            if base + self.rank < len(self.ordered):
                p = self.ordered[base + self.rank]
                st = self._state(p)
                g = p.grad.float()
                st["momentum"].lerp_(g, 1 - mu)
                update = newton_schulz5(g.lerp(st["momentum"], mu), self.ns_dtype).float()
                st["smoothed"].mul_(self.smoothing).add_(update, alpha=1 - self.smoothing)
                scale = math.sqrt(max(1.0, p.size(-2) / p.size(-1)))
                value = self.master_value(p)
                value.mul_(1 - lr * wd * self.wd_mul[p]).add_(st["smoothed"], alpha=-lr * scale)
                self.write_master(p, value)
            if ws > 1:
                self._share(chunk)

    def _share(self, chunk):
        """Every rank receives the parameters updated by their owners."""
        ws = self.world_size
        if len({q.numel() for q in chunk}) == 1 and len({q.dtype for q in chunk}) == 1:
            flat = [q.data.view(-1) for q in chunk]
            flat += [torch.empty_like(flat[0]) for _ in range(ws - len(chunk))]
            dist.all_gather(flat, flat[self.rank].clone())
        else:
            for j, q in enumerate(chunk):
                dist.broadcast(q.data, j)

    def full_state(self):
        """This rank's owned states keyed by position in the sort order (merged across ranks by the caller)."""
        return {i: {k: v.clone() for k, v in self.state[p].items()} for i, p in enumerate(self.ordered)
                if self.state.get(p)}

    def load_full_state(self, merged):
        self.state.clear()
        for i, p in enumerate(self.ordered):
            if i in merged and self.owner(p) == self.rank:
                self.state[p] = {k: v.clone().to(p.device) for k, v in merged[i].items()}


class Snoo:
    """Outer optimiser: every `every`-th call (the first call included) treats (old - new) as a gradient, resets
    the parameters to the old copy and takes a Nesterov SGD step from there. The old copy is kept in fp32 and is
    identical on every rank."""

    def __init__(self, params, lr=0.68, momentum=0.37, every=28, write=None):
        self.params, self.lr, self.momentum, self.every = list(params), lr, momentum, every
        self.write = write or (lambda p, v: p.data.copy_(v))
        self.old = [p.detach().float().clone() for p in self.params]
        self.buf = [None] * len(self.params)
        self.calls = 0

    def fires(self, call_index):
        return call_index % self.every == 0

    @torch.no_grad()
    def step(self):
        fired = self.fires(self.calls)
        self.calls += 1
        if not fired:
            return False
        for i, p in enumerate(self.params):
            grad = self.old[i] - p.float()
            buf = grad.clone() if self.buf[i] is None else self.buf[i].mul_(self.momentum).add_(grad)
            self.buf[i] = buf
            self.old[i].sub_(grad.add(buf, alpha=self.momentum), alpha=self.lr)
            self.write(p, self.old[i])
        return True

    def state_dict(self):
        return dict(old=[t.clone() for t in self.old], buf=[None if b is None else b.clone() for b in self.buf],
                    calls=self.calls)

    def load_state_dict(self, sd):
        dev = self.params[0].device
        self.old = [t.clone().to(dev) for t in sd["old"]]
        self.buf = [None if b is None else b.clone().to(dev) for b in sd["buf"]]
        self.calls = sd["calls"]


def lr_factor(step, num_iterations, cooldown_frac=0.7, floor=0.01):
    x = step / num_iterations
    return 1.0 if x < 1 - cooldown_frac else (1 - x) / cooldown_frac * (1 - floor) + floor


def muon_momentum(step, warmup_steps=300):
    frac = min(step / warmup_steps, 1)
    return (1 - frac) * 0.85 + frac * 0.95


class Optimizers:
    """Muon for the hidden matrices, Adam for head/embeddings/scalars, and Snoo around everything."""

    MUON_LR, MUON_WD = 0.03, 0.01
    ADAM_LRS = dict(head=1 / 320, embed=0.3, scalar=0.015)

    def __init__(self, model: GPT, rank, world_size, fused_adam, ns_dtype=torch.bfloat16):
        self.model = model
        matrices = model.matrix_params()
        self.muon = Muon(matrices, lr=self.MUON_LR, weight_decay=self.MUON_WD, momentum=0.95,
                         rank=rank, world_size=world_size, ns_dtype=ns_dtype)
        muon_ids = {id(p) for p, _ in matrices}
        embed = model.embedding_params()
        groups = dict(head=[model.lm_head_w], embed=embed,
                      scalar=[p for p in model.parameters()
                              if id(p) not in muon_ids and all(p is not q for q in embed + [model.lm_head_w])])
        adam_groups = [dict(params=ps, lr=self.ADAM_LRS[name], initial_lr=self.ADAM_LRS[name], name=name)
                       for name, ps in groups.items() if ps]
        self.adam = torch.optim.Adam(adam_groups, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.0,
                                     fused=fused_adam)
        muon_set = set(id(p) for p, _ in matrices)
        self.snoo = Snoo(list(model.parameters()),
                         write=lambda p, v: self.muon.write_master(p, v) if id(p) in muon_set else p.data.copy_(v))

    def step(self, step, num_iterations):
        factor = lr_factor(step, num_iterations)
        for g in self.adam.param_groups:
            g["lr"] = g["initial_lr"] * factor
        mg = self.muon.param_groups[0]
        mg["lr"] = self.MUON_LR * factor
        mg["momentum"] = muon_momentum(step)
        self.muon.step()
        self.adam.step()
        self.snoo.step()
        self.model.zero_grad(set_to_none=True)

    def state_dict(self, gather_muon):
        return dict(adam=self.adam.state_dict(), muon=gather_muon(self.muon.full_state()),
                    snoo=self.snoo.state_dict())

    def load_state_dict(self, sd):
        self.adam.load_state_dict(sd["adam"])
        self.muon.load_full_state(sd["muon"])
        self.snoo.load_state_dict(sd["snoo"])


# ----------------------------------------------------------------------------------------------------------------
# Command line

def make_arg_parser():
    p = argparse.ArgumentParser(
        description="GPT-2 Medium speedrun (2.92 track). With no flags: the upstream baseline.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    run = p.add_argument_group("run")
    run.add_argument("--preset", choices=sorted(PRESETS), default="full",
                     help="model size and data defaults: full = the record run; tiny = CPU-sized, demo shards")
    run.add_argument("--seed", type=int, default=0, help="seed for initialisation and warm-up tokens")
    run.add_argument("--log-dir", default="logs", help="folder of the run log")
    run.add_argument("--run-name", default=None, help="log file is <log-dir>/<run-name>.txt (default: a uuid)")
    run.add_argument("--variant", default=None, help="short name of the study arm, for the config line")
    run.add_argument("--num-iterations", type=int, default=None, help="optimiser steps of the full schedule")
    run.add_argument("--stop-after", type=int, default=None,
                     help="run only the first N steps of the schedule (validates at the stop)")
    run.add_argument("--val-every", type=int, default=None, help="validate every N steps (0: only at the end)")
    run.add_argument("--val-tokens", type=int, default=None, help="validation tokens per validation")
    run.add_argument("--train-seq-len", type=int, default=None, help="tokens per virtual rank per step")
    run.add_argument("--val-seq-len", type=int, default=None, help="validation tokens per virtual rank per step")
    run.add_argument("--train-files", default=None, help="glob of training shards")
    run.add_argument("--val-files", default=None, help="glob of validation shards")
    run.add_argument("--num-layers", type=int, default=None,
                     help="transformer layers (the layer patterns follow the rule in layer_pattern)")
    run.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                     help="torch.compile the model (auto: on CUDA only)")
    run.add_argument("--coordinate-descent-tuning", choices=["on", "off"], default="on",
                     help="inductor coordinate-descent tuning (allowed on the medium track)")
    run.add_argument("--warmup-steps", type=int, default=None,
                     help="untimed kernel warm-up steps on random tokens, state restored afterwards "
                          "(default: 10 when compiled, else 0)")
    run.add_argument("--low-precision", choices=["auto", "bf16", "fp32"], default="auto",
                     help="dtype of embeddings, matrices and activations (auto: bf16 on CUDA, fp32 on CPU, "
                          "where bf16 matmuls are emulated and slow)")
    ck = p.add_argument_group("checkpoints")
    ck.add_argument("--checkpoint-every", type=int, default=0,
                    help="write <log-dir>/<run-name>.pt every K steps and at the end (0: off)")
    ck.add_argument("--save-final-checkpoint", action="store_true", help="write the checkpoint at the end")
    ck.add_argument("--resume", default=None, help="continue a run from its checkpoint")
    ck.add_argument("--init-from", default=None, help="start a new run from a checkpoint's model weights")
    return p


def resolve_args(argv=None):
    """Parses flags and fills preset defaults; raises UsageError on combinations that cannot work."""
    args = make_arg_parser().parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.run_name is None:
        args.run_name = str(uuid.uuid4())
    if args.variant is None:
        args.variant = "baseline"
    positive = ["num_iterations", "train_seq_len", "val_seq_len", "val_tokens", "num_layers"]
    for name in positive:
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    for name in ["val_every", "checkpoint_every"] + (["warmup_steps"] if args.warmup_steps is not None else []):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must not be negative")
    if args.stop_after is not None and not 0 < args.stop_after <= args.num_iterations:
        raise UsageError(f"--stop-after must be in 1..{args.num_iterations}")
    bs = PRESETS[args.preset]["block_size"]
    for name in ["train_seq_len", "val_seq_len"]:
        if getattr(args, name) % bs:
            raise UsageError(f"--{name.replace('_', '-')} must be a multiple of the attention block size {bs}")
    if args.val_tokens % (VIRTUAL_RANKS * args.val_seq_len):
        raise UsageError(f"--val-tokens must be a multiple of {VIRTUAL_RANKS} x --val-seq-len")
    layer_pattern(args.num_layers)
    if args.resume and args.init_from:
        raise UsageError("--resume and --init-from cannot be combined")
    for name in ["resume", "init_from"]:
        path = getattr(args, name)
        if path and not os.path.isfile(path):
            raise UsageError(f"--{name.replace('_', '-')}: no such file {path}")
    if "/" in args.run_name or not args.run_name.strip():
        raise UsageError("--run-name must be a plain file name")
    return args


def model_config(args):
    pre = PRESETS[args.preset]
    return ModelConfig(num_layers=args.num_layers, model_dim=pre["model_dim"], num_heads=pre["num_heads"],
                       head_dim=pre["head_dim"], block_size=pre["block_size"],
                       max_window_tokens=pre["max_window_tokens"])


# ----------------------------------------------------------------------------------------------------------------
# Distributed setup and logging

@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def grad_accum(self):
        return VIRTUAL_RANKS // self.world_size

    @property
    def virtual_ranks(self):
        return [self.rank * self.grad_accum + j for j in range(self.grad_accum)]

    def barrier(self):
        if self.world_size > 1:
            dist.barrier()


def setup_distributed():
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if VIRTUAL_RANKS % world_size:
        raise UsageError(f"world size {world_size} does not divide {VIRTUAL_RANKS}: use 1, 2, 4 or 8 processes")
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if world_size > 1:
        dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
    return Dist(rank, world_size, local_rank, device)


class RunLog:
    """Rank 0 writes the run log line by line (flushed); other ranks write nothing."""

    def __init__(self, path, enabled):
        self.enabled, self.path, self.lines = enabled, path, []
        self.file = None
        if enabled:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.file = open(path, "w")

    def write(self, line, echo=True, keep=False):
        if not self.enabled:
            return
        self.file.write(line + "\n")
        self.file.flush()
        if keep:
            self.lines.append(line)
        if echo:
            print(line, flush=True)

    def close(self):
        if self.file:
            self.file.close()


def environment_lines(ddp: Dist):
    lines = [f"Running Python {sys.version}", f"Running PyTorch {torch.__version__}"
             + (f" compiled for CUDA {torch.version.cuda}" if torch.version.cuda else "")]
    if ddp.device.type == "cuda":
        try:
            lines.append(subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout.rstrip())
        except (OSError, subprocess.SubprocessError):
            lines.append(f"GPU: {torch.cuda.get_device_name(ddp.device)}")
    else:
        lines.append(f"Hardware: CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    return lines


# ----------------------------------------------------------------------------------------------------------------
# Training

def sync_gradients(model, ddp: Dist):
    """Averages gradients across ranks: one flat all-reduce per dtype (SUM then divide: gloo has no AVG)."""
    if ddp.world_size == 1:
        return
    by_dtype = {}
    for p in model.parameters():
        if p.grad is not None:
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    pending = []
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        pending.append((grads, flat, dist.all_reduce(flat, async_op=True)))
    for grads, flat, handle in pending:
        handle.wait()
        flat /= ddp.world_size
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def train_step(model, batches, window, ddp: Dist):
    for inputs, targets in batches:
        loss = model(inputs.to(ddp.device), targets.to(ddp.device), window)
        (loss / len(batches)).backward()
    sync_gradients(model, ddp)


@torch.no_grad()
def validate(model, args, ddp: Dist, window):
    model.eval()
    stream = TokenStream(find_shards(args.val_files, "--val-files"), args.val_seq_len, "--val-files")
    steps = args.val_tokens // (VIRTUAL_RANKS * args.val_seq_len)
    total = torch.zeros((), device=ddp.device, dtype=torch.float32)
    for _ in range(steps):
        for inputs, targets in stream.next_batch(ddp.virtual_ranks):
            total += model(inputs.to(ddp.device), targets.to(ddp.device), window, head_chunks=4).float()
    if ddp.world_size > 1:
        dist.all_reduce(total)
    model.train()
    return (total / (steps * VIRTUAL_RANKS)).item()


def gather_to_rank0(obj, ddp: Dist):
    if ddp.world_size == 1:
        return [obj]
    out = [None] * ddp.world_size
    dist.all_gather_object(out, obj)
    return out


def merged_muon_state(local, ddp):
    merged = {}
    for part in gather_to_rank0({k: {n: t.cpu() for n, t in v.items()} for k, v in local.items()}, ddp):
        merged.update(part)
    return merged


def save_checkpoint(path, model, opt, stream, step, train_ms, args, log, ddp):
    state = dict(model={k: v.cpu() for k, v in model.state_dict().items()},
                 optimizers=opt.state_dict(lambda local: merged_muon_state(local, ddp)),
                 stream=stream.state(), step=step, train_ms=train_ms, config=vars(args),
                 rng=dict(cpu=torch.get_rng_state(),
                          cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None),
                 log_lines=list(log.lines))
    if ddp.rank == 0:
        tmp = f"{path}.tmp{os.getpid()}"
        torch.save(state, tmp)
        os.replace(tmp, path)
    ddp.barrier()


def load_checkpoint(path):
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # any unreadable file is bad input, named by its path
        raise UsageError(f"{path}: not a readable checkpoint ({type(e).__name__})")


def load_model_weights(model, state, path):
    own = model.state_dict()
    theirs = state.get("model", {}) if isinstance(state, dict) else {}
    mismatched = [k for k in own if k not in theirs or theirs[k].shape != own[k].shape]
    if mismatched or set(theirs) - set(own):
        raise UsageError(f"{path}: checkpoint model does not match this configuration "
                         f"(first difference: {(mismatched or sorted(set(theirs) - set(own)))[0]})")
    model.load_state_dict(theirs)


def cast_model(model, dtype):
    """Embeddings and hidden matrices in the low-precision dtype; the lm head and scalars stay fp32."""
    for p in model.parameters():
        if p is not model.lm_head_w and p.ndim >= 2:
            p.data = p.data.to(dtype)


def run(args, ddp: Dist):
    cfg = model_config(args)
    train_files = find_shards(args.train_files, "--train-files")
    find_shards(args.val_files, "--val-files")
    for f in train_files[:1]:
        read_shard(f)
    low = {"bf16": torch.bfloat16, "fp32": torch.float32}.get(
        args.low_precision, torch.bfloat16 if ddp.device.type == "cuda" else torch.float32)
    resume_state = load_checkpoint(args.resume) if args.resume else None
    init_state = load_checkpoint(args.init_from) if args.init_from else None

    torch.manual_seed(args.seed)
    model = GPT(cfg, max_seq_len=max(args.train_seq_len, args.val_seq_len)).to(ddp.device)
    cast_model(model, low)
    if init_state is not None:
        load_model_weights(model, init_state, args.init_from)
    if resume_state is not None:
        load_model_weights(model, resume_state, args.resume)
    for p in model.parameters():  # identical start on every rank
        if ddp.world_size > 1:
            dist.broadcast(p.data, 0)
    # With --low-precision fp32 (CPU default) the NS5 iteration runs in fp32 too: bf16 matmuls are slow on CPU.
    opt = Optimizers(model, ddp.rank, ddp.world_size, fused_adam=ddp.device.type == "cuda", ns_dtype=low)
    compiled = args.compile == "on" or (args.compile == "auto" and ddp.device.type == "cuda")
    if compiled:
        import torch._inductor.config as inductor_config
        inductor_config.coordinate_descent_tuning = args.coordinate_descent_tuning == "on"
        train_model = torch.compile(model, dynamic=False)
    else:
        train_model = model

    if args.warmup_steps is None:
        args.warmup_steps = 10 if compiled else 0
    log = RunLog(Path(args.log_dir) / f"{args.run_name}.txt", ddp.rank == 0)
    config = dict(vars(args), track=TRACK, world_size=ddp.world_size, device=ddp.device.type,
                  low_precision=str(low).replace("torch.", ""),
                  params=sum(p.numel() for p in model.parameters()))
    added = model.added_params()
    log.write(Path(__file__).read_text(), echo=False)
    log.write("=" * 100, echo=False)
    for line in environment_lines(ddp):
        log.write(line, echo=False)
    log.write("config: " + json.dumps(config, sort_keys=True))
    log.write(f"added_params: {json.dumps(added)} total {sum(added.values())}")
    log.write("=" * 100, echo=False)

    N = args.num_iterations
    last_step = args.stop_after or N

    # Kernel warm-up on random tokens, then every piece of training state back exactly as it was.
    if args.warmup_steps:
        saved = dict(model=copy.deepcopy(model.state_dict()), adam=copy.deepcopy(opt.adam.state_dict()),
                     muon=opt.muon.full_state(), snoo=opt.snoo.state_dict())
        gen = torch.Generator().manual_seed(args.seed + 1)
        for i in range(args.warmup_steps):
            window = torch.tensor(window_blocks_at(i * N // args.warmup_steps, N, cfg), device=ddp.device)
            batches = [(torch.randint(0, cfg.vocab_size, (args.train_seq_len,), generator=gen),
                        torch.randint(0, cfg.vocab_size, (args.train_seq_len,), generator=gen))
                       for _ in ddp.virtual_ranks]
            train_step(train_model, batches, window, ddp)
            opt.step(i, N)
        model.load_state_dict(saved["model"])
        opt.adam.load_state_dict(saved["adam"])
        opt.muon.load_full_state(saved["muon"])
        opt.snoo.load_state_dict(saved["snoo"])

    stream = TokenStream(train_files, args.train_seq_len, "--train-files")
    start_step, train_ms = 0, 0.0
    if resume_state is not None:
        opt.load_state_dict(resume_state["optimizers"])
        stream.restore(resume_state["stream"])
        start_step, train_ms = resume_state["step"], resume_state["train_ms"]
        torch.set_rng_state(resume_state["rng"]["cpu"])
        for line in resume_state["log_lines"]:
            log.write(line, echo=False, keep=True)
    ckpt_path = Path(args.log_dir) / f"{args.run_name}.pt"

    def sync():
        if ddp.device.type == "cuda":
            torch.cuda.synchronize()
        ddp.barrier()

    sync()
    t0 = time.perf_counter()
    for step in range(start_step, last_step + 1):
        is_last = step == last_step
        # A tensor, so the compiled model is not specialised on (and recompiled for) each window size.
        window = torch.tensor(window_blocks_at(step, N, cfg), device=ddp.device)
        if is_last or (args.val_every and step % args.val_every == 0):
            sync()
            train_ms += 1000 * (time.perf_counter() - t0)
            val_loss = validate(train_model, args, ddp, window)
            log.write(f"step:{step}/{N} val_loss:{val_loss:.6f} train_time:{train_ms:.0f}ms "
                      f"step_avg:{train_ms / max(step, 1):.2f}ms", keep=True)
            log.write(f"step:{step}/{N} scalars: {json.dumps(model.named_scalars())}", echo=False, keep=True)
            sync()
            t0 = time.perf_counter()
        if is_last:
            break
        train_step(train_model, stream.next_batch(ddp.virtual_ranks), window, ddp)
        opt.step(step, N)
        elapsed = train_ms + 1000 * (time.perf_counter() - t0)
        log.write(f"step:{step + 1}/{N} train_time:{elapsed:.0f}ms step_avg:{elapsed / (step + 1):.2f}ms",
                  echo=False, keep=True)
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 and step + 1 < last_step:
            train_ms += 1000 * (time.perf_counter() - t0)
            save_checkpoint(ckpt_path, model, opt, stream, step + 1, train_ms, args, log, ddp)
            t0 = time.perf_counter()
    if args.checkpoint_every or args.save_final_checkpoint:
        save_checkpoint(ckpt_path, model, opt, stream, last_step, train_ms, args, log, ddp)
    if ddp.device.type == "cuda":
        alloc = torch.cuda.max_memory_allocated() // 1024 // 1024
        reserved = torch.cuda.max_memory_reserved() // 1024 // 1024
    else:
        alloc = reserved = 0
    log.write(f"peak memory allocated: {alloc} MiB reserved: {reserved} MiB")
    log.close()


def main(argv=None):
    try:
        args = resolve_args(argv)
        ddp = setup_distributed()
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        run(args, ddp)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
