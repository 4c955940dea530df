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
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

if "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:  # must be set before torch starts; less fragmentation
    os.environ.setdefault("PYTORCH_ALLOC_CONF", "expandable_segments:True")
import torch  # noqa: E402
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
    # backout (docs/backout.md): empty backout_layers = off. Entries are layer indices, "embed" or "new-embed".
    backout_layers: tuple = ()
    backout_mode: str = "sum"
    backout_transform: str = "none"
    backout_x_init: float = 1.0
    backout_skip_init: float = 0.0
    backout_fixed_x: bool = False
    backout_freeze: bool = False
    backout_norm_after_sum: bool = False
    backout_concat_dim: int = 128
    backout_mlp_ratio: float = 1.0
    rolling_skip: bool = False
    baseline_layers: int = None  # the preset's layer count: added_params reports extra layers against it
    # LAuReL (docs/laurel.md); laurel=None is off
    laurel: str = None
    laurel_rank: int = 32
    laurel_k: int = 3
    laurel_rw_form: str = "softmax"
    laurel_rw_scale: float = 2.0
    laurel_pa_h: str = "identity"
    laurel_where: str = "mlp"
    laurel_layers: tuple = None
    # DLO (off when dlo_groups == 0): num_layers is then the expanded depth, dlo_base_layers the checkpoint's.
    dlo_groups: int = 0
    dlo_add: int = 0
    dlo_base_layers: int = 0
    dlo_score_scale: float = 1.0
    dlo_threshold: float = 1.0
    dlo_skip_loss_weight: float = 0.0
    dlo_train_gating: str = "soft"


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

def read_shard(path, pin=False):
    """The shard's tokens as a uint16 tensor (in pinned memory with pin=True, for asynchronous copies to the GPU)."""
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
            if num_tokens < 0:
                raise UsageError(f"{path}: malformed shard (negative token count {num_tokens})")
            tokens = torch.empty(num_tokens, dtype=torch.uint16, pin_memory=pin)
            got = f.readinto(tokens.numpy()) // 2
            extra = len(f.read(2))
    except OSError as e:
        raise UsageError(f"{path}: cannot read shard ({e.strerror})")
    if got != num_tokens:
        raise UsageError(f"{path}: truncated shard ({got} tokens present, header says {num_tokens})")
    if extra:
        raise UsageError(f"{path}: malformed shard (longer than the {num_tokens} tokens its header says)")
    return tokens


def find_shards(pattern, flag):
    files = sorted(glob.glob(pattern))
    if not files:
        raise UsageError(f"{flag}: no files match {pattern!r}")
    return files


class TokenStream:
    """The upstream stream: files in name order, no wrap-around; each step takes VIRTUAL_RANKS sequences of
    seq_len(+1) tokens from `pos`, virtual rank v taking [pos + v*T, pos + (v+1)*T + 1)."""

    def __init__(self, files, seq_len, what, device="cpu"):
        self.files, self.seq_len, self.what = files, seq_len, what
        self.device = torch.device(device)
        self.file_index, self.pos, self.tokens = -1, 0, None
        self._advance_file()

    def _advance_file(self):
        self.file_index += 1
        if self.file_index >= len(self.files):
            raise UsageError(f"{self.what}: ran out of tokens after {len(self.files)} file(s); "
                             f"download more shards or train for fewer steps")
        self.tokens, self.pos = read_shard(self.files[self.file_index], pin=self.device.type == "cuda"), 0

    def state(self):
        return dict(file_index=self.file_index, pos=self.pos)

    def restore(self, state):
        self.file_index = state["file_index"] - 1
        self._advance_file()
        self.pos = state["pos"]

    def next_batch(self, virtual_ranks):
        """Returns [(inputs, targets)] (int64, on the stream's device) for the given virtual ranks of the next step,
        and advances the stream. Copies from pinned memory are asynchronous: no host sync per step."""
        span = VIRTUAL_RANKS * self.seq_len
        if self.pos + span + 1 >= len(self.tokens):
            self._advance_file()
            if span + 1 >= len(self.tokens):
                raise UsageError(f"{self.files[self.file_index]}: shard has {len(self.tokens)} tokens, "
                                 f"fewer than one step's {span + 1}")
        out = []
        for v in virtual_ranks:
            start = self.pos + v * self.seq_len
            chunk = self.tokens[start:start + self.seq_len + 1].to(self.device, non_blocking=True).long()
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
    def __init__(self, dim, hidden, in_dim=None):
        super().__init__()
        self.fc_w = nn.Parameter(uniform_init_(torch.empty(hidden, in_dim or dim)))
        self.proj_w = nn.Parameter(torch.zeros(dim, hidden))

    def forward(self, x):
        x = F.linear(x, self.fc_w.type_as(x))
        return F.linear(F.relu(x).square(), self.proj_w.type_as(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, has_attention, max_seq_len):
        super().__init__()
        self.attn = CausalSelfAttention(cfg, max_seq_len) if has_attention else None
        self.mlp = MLP(cfg.model_dim, cfg.mlp_ratio * cfg.model_dim)

    def mix_and_attend(self, x, x00, x01, ve, mask, lambdas, v_lambdas, laurel=None):
        """Everything before the MLP: the embedding re-injection and the attention residual."""
        x = lambdas[0] * x + lambdas[1] * x00 + lambdas[2] * x01
        if self.attn is not None:
            fx = self.attn(x, ve, mask, v_lambdas[0], v_lambdas[1])
            x = x + fx if laurel is None else laurel(x, fx, "attn")
        return x

    def forward(self, x, x00, x01, ve, mask, lambdas, v_lambdas, mlp_extra=None, laurel=None):
        # mlp_extra: features concatenated to the MLP input (backout concat-mlp); None for every baseline block.
        # laurel: None (plain residuals) or a function (x, f(x), site) -> the augmented residual
        x = self.mix_and_attend(x, x00, x01, ve, mask, lambdas, v_lambdas, laurel)
        fx = self.mlp(norm(x) if mlp_extra is None else torch.cat([norm(x), mlp_extra.type_as(x)], dim=-1))
        return x + fx if laurel is None else laurel(x, fx, "mlp")


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


_compiled_flex_attention = None


def attend(q, k, v, mask, scale):
    if isinstance(mask, torch.Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    global _compiled_flex_attention
    if _compiled_flex_attention is None:
        # Always compiled, also under --compile off: eager FlexAttention ignores the block sparsity (the window)
        # and materialises the whole score matrix.
        from torch.nn.attention.flex_attention import flex_attention
        _compiled_flex_attention = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex_attention(q, k, v, block_mask=mask, scale=scale)


SIMILARITY_TOKENS = 8192  # tokens of each eval sequence the backout similarity is measured on


def backout_mlp_hidden(cfg: ModelConfig):
    return max(1, round(cfg.backout_mlp_ratio * cfg.model_dim))


class BackoutParts(nn.Module):
    """The backout's own tensors: transform matrices, down-projections, a fresh embedding, frozen lambdas and the
    similarity record. Its learned lambdas live in GPT.scalars like every other scalar."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        D, k = cfg.model_dim, len(cfg.backout_layers)
        if cfg.backout_transform == "relu-linear":
            self.transform_w = nn.Parameter(uniform_init_(torch.empty(k, D, D)))
        if cfg.backout_mode == "concat-mlp":
            self.down_w = nn.Parameter(uniform_init_(torch.empty(k, cfg.backout_concat_dim, D)))
        if "new-embed" in cfg.backout_layers:
            self.new_embed = nn.Embedding(cfg.vocab_size, D)
        if cfg.backout_transform != "none":
            # (cos, relative L2) per source, overwritten by each eval forward: the last validation batch's values.
            self.register_buffer("similarity", torch.zeros(k, 2))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, max_seq_len):
        super().__init__()
        self.cfg = cfg
        self.pattern = dlo_layer_pattern(cfg) if cfg.dlo_groups else layer_pattern(cfg.num_layers)
        no_attention = self.pattern.get("no_attention_layers", [self.pattern["no_attention_layer"]])
        L, D = cfg.num_layers, cfg.model_dim
        self.embed1 = nn.Embedding(cfg.vocab_size, D)
        self.embed2 = nn.Embedding(cfg.vocab_size, D)
        self.value_embeds = nn.ModuleList(nn.Embedding(cfg.vocab_size, cfg.num_heads * cfg.head_dim)
                                          for _ in range(self.pattern["num_value_embeds"]))
        self.blocks = nn.ModuleList(Block(cfg, i not in no_attention, max_seq_len)
                                    for i in range(L))
        padded_vocab = ((cfg.vocab_size + 127) // 128) * 128
        self.lm_head_w = nn.Parameter(torch.zeros(padded_vocab, D))
        # Study variants keep their modules here (key = variant name) and their scalars in the shared vector,
        # so parameter counts, optimiser groups and logging find them without special cases.
        self.study = nn.ModuleDict()
        # Parameters a variant adds outside self.study (e.g. widened lm-head columns), or removes (negative).
        self.extra_param_counts = {}
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
        if cfg.backout_layers:
            self.add_backout(cfg)
        if cfg.rolling_skip:
            # Per layer i >= 3: (a, b) in `a*out[i-3] + b*out[i-1]`; (0, 1) is the baseline's input out[i-1].
            self.add_scalars("rolling", torch.tensor([0.0, 1.0]).repeat(cfg.num_layers - 3))
        attach_laurel(self, cfg)
        if cfg.dlo_groups:
            self.study["dlo"] = DLORouters(cfg)

    # --- backout (docs/backout.md) ----------------------------------------------------------------------------

    def add_backout(self, cfg):
        D, k = cfg.model_dim, len(cfg.backout_layers)
        backout = BackoutParts(cfg)
        self.study["backout"] = backout
        frozen = cfg.backout_freeze
        if cfg.backout_mode == "sum":
            x_init = torch.tensor(cfg.backout_x_init)
            if frozen or cfg.backout_fixed_x:
                backout.register_buffer("x_lambda", x_init)
            else:
                self.add_scalars("backout.x", x_init)
        if cfg.backout_mode in ("sum", "subtract"):
            skip_init = torch.full((k,), float(cfg.backout_skip_init))
            if frozen:
                backout.register_buffer("skip_lambdas", skip_init)
            else:
                self.add_scalars("backout.skip", skip_init)
        elif cfg.backout_mode == "concat-head":
            # The head reads [norm(x), source 1, ...]: widen the (all-zero) lm head, so the new columns start at
            # zero and train exactly like the old ones (same Adam group, fp32).
            rows = self.lm_head_w.size(0)
            self.lm_head_w = nn.Parameter(torch.zeros(rows, D * (1 + k)))
            self.extra_param_counts["backout"] = rows * D * k
        elif cfg.backout_mode == "concat-mlp":
            old = self.blocks[-1].mlp
            new = MLP(D, backout_mlp_hidden(cfg), in_dim=D + k * cfg.backout_concat_dim)
            self.blocks[-1].mlp = new
            self.extra_param_counts["backout"] = (sum(p.numel() for p in new.parameters())
                                                  - sum(p.numel() for p in old.parameters()))

    def backout_lambdas(self):
        """(x_lambda or None, [skip lambda per source]) as 0-dim tensors (0-dim: they keep the activation dtype)."""
        backout = self.study["backout"]
        if "backout.x" in self.scalar_layout:
            x_lambda = self.scalar_slice("backout.x")[0]
        else:
            x_lambda = getattr(backout, "x_lambda", None)
        skips = self.scalar_slice("backout.skip") if "backout.skip" in self.scalar_layout else backout.skip_lambdas
        return x_lambda, list(skips.unbind(0))

    def backout_mixed(self, outputs, x00, input_seq, normed=True):
        """The vectors the backout mixes in, one per source: norm(T(source)) (normed) or T(source).

        In eval mode also records, per source, cos and relative L2 between norm(source) and norm(T(source)) on the
        first SIMILARITY_TOKENS tokens."""
        cfg, backout = self.cfg, self.study["backout"]
        mixed = []
        for j, name in enumerate(cfg.backout_layers):
            if name == "embed":
                source = x00
            elif name == "new-embed":
                source = backout.new_embed(input_seq)[None]
            else:
                source = outputs[name]
            t = cfg.backout_transform
            if t == "detach":
                moved = source.detach()
            elif t == "relu":
                moved = F.relu(source)
            elif t == "tanh":
                moved = torch.tanh(source)
            elif t == "relu-linear":
                moved = F.linear(F.relu(source), backout.transform_w[j].type_as(source))
            else:
                moved = source
            moved_normed = norm(moved)
            if t != "none" and not self.training:
                # The first tokens suffice and keep the fp32 copies small (a val sequence is 262144 tokens).
                a = norm(source[:, :SIMILARITY_TOKENS].float())
                b = moved_normed[:, :SIMILARITY_TOKENS].float()
                cos = F.cosine_similarity(a, b, dim=-1).mean()
                rel_l2 = torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(a).clamp_min(1e-12)
                backout.similarity[j].copy_(torch.stack([cos, rel_l2]).detach())
            mixed.append(moved_normed if normed else moved)
        return mixed

    def backout_head(self, x, outputs, x00, input_seq):
        cfg = self.cfg
        if cfg.backout_mode == "concat-head":
            return torch.cat([norm(x)] + self.backout_mixed(outputs, x00, input_seq), dim=-1)
        x_lambda, skip_lambdas = self.backout_lambdas()
        if cfg.backout_mode == "subtract":
            for lam, v in zip(skip_lambdas, self.backout_mixed(outputs, x00, input_seq, normed=False)):
                x = x - lam * v
            return norm(x)
        out = x_lambda * norm(x)
        for lam, v in zip(skip_lambdas, self.backout_mixed(outputs, x00, input_seq)):
            out = out + lam * v
        return norm(out) if cfg.backout_norm_after_sum else out

    def backout_mlp_input(self, outputs, x00, input_seq):
        """concat-mlp: each source's norm(T(source)) projected down to backout_concat_dim, concatenated."""
        down = self.study["backout"].down_w
        mixed = self.backout_mixed(outputs, x00, input_seq)
        return torch.cat([F.linear(v, down[j].type_as(v)) for j, v in enumerate(mixed)], dim=-1)

    def backout_named_scalars(self):
        cfg, out = self.cfg, {}
        if "backout" in self.study:
            backout = self.study["backout"]
            labels = [name if isinstance(name, str) else f"L{name}" for name in cfg.backout_layers]
            if cfg.backout_mode in ("sum", "subtract"):
                x_lambda, skip_lambdas = self.backout_lambdas()
                if x_lambda is not None:
                    out["backout.x"] = x_lambda.item()
                for label, lam in zip(labels, skip_lambdas):
                    out[f"backout.{label}"] = lam.item()
            if cfg.backout_transform != "none":
                for label, (cos, rel_l2) in zip(labels, backout.similarity.tolist()):
                    out[f"backout.{label}.cos"], out[f"backout.{label}.rel_l2"] = cos, rel_l2
        if cfg.rolling_skip:
            for i, (a, b) in enumerate(self.scalar_slice("rolling").view(-1, 2).tolist(), start=3):
                out[f"rolling.L{i}.a"], out[f"rolling.L{i}.b"] = a, b
        return out

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
        for variant, n in self.extra_param_counts.items():
            counts[variant] = counts.get(variant, 0) + n
        if self.cfg.baseline_layers and self.cfg.num_layers != self.cfg.baseline_layers \
                and not self.cfg.dlo_groups:  # DLO counts its new layers itself
            counts["layers"] = extra_layer_params(self.cfg)
        if "dlo" in self.study:  # the expanded layers are added parameters too
            counts["dlo"] += sum(p.numel() for i in self.pattern["dlo_new_layers"] for p in self.blocks[i].parameters())
        return counts

    def matrix_params(self):
        """The hidden matrices Muon trains, with their weight-decay multipliers (study matrices: 1)."""
        out = []
        for block in self.blocks:
            if block.attn is not None:
                out.append((block.attn.qkvo_w, 1.0))
            out += [(block.mlp.fc_w, 2.0), (block.mlp.proj_w, 2.0)]
        study_embeds = {id(p) for p in self.study_embedding_params()}
        out += [(p, 1.0) for p in self.study.parameters() if p.ndim >= 2 and id(p) not in study_embeds]
        return out

    def study_embedding_params(self):
        """nn.Embedding tables under self.study train as embeddings (Adam), not as Muon matrices."""
        return [m.weight for m in self.study.modules() if isinstance(m, nn.Embedding)]

    def embedding_params(self):
        return ([self.embed1.weight, self.embed2.weight] + [e.weight for e in self.value_embeds]
                + self.study_embedding_params())

    def masks(self, input_seq, window_blocks):
        """(long, short) masks for this sequence and window; short is half the long window, at least 1 block."""
        bs = self.cfg.block_size
        long_w, short_w = window_blocks, torch.clamp_min(window_blocks // 2, 1)
        if input_seq.is_cuda:
            return tuple(flex_block_masks(input_seq, [long_w, short_w], bs))
        return dense_window_mask(input_seq, long_w, bs), dense_window_mask(input_seq, short_w, bs)

    def hidden_states(self, input_seq, window_blocks, aux_losses=None):
        """Runs the blocks; returns the final residual, every layer's output, and x00. Variants that train with
        an extra loss append it to aux_losses."""
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
        rolling = self.scalar_slice("rolling").view(-1, 2) if self.cfg.rolling_skip else None
        concat_mlp = "backout" in self.study and self.cfg.backout_mode == "concat-mlp"
        dlo = self.study["dlo"] if "dlo" in self.study else None
        dlo_records = []
        outputs = []
        laurel = self.study["laurel"].begin(self) if "laurel" in self.study else None
        for i, block in enumerate(self.blocks):
            if rolling is not None and i >= 3:
                # Replaces the plain hand-over of out[i-1]; the U-net skip and the block's own mix follow as usual.
                x = rolling[i - 3, 0] * outputs[i - 3] + rolling[i - 3, 1] * x
            if i in skip_into:
                j, src = skip_into[i]
                x = x + skip_w[j] * outputs[src]
            ve = ve_all[pat["ve_index"][i]] if pat["ve_index"][i] is not None else None
            mask = long_mask if i in pat["long_window_layers"] else short_mask
            if dlo is None:
                extra = (self.backout_mlp_input(outputs, x00, input_seq)
                         if concat_mlp and i == len(self.blocks) - 1 else None)
                x = block(x, x00, x01, ve, mask, lambdas[i], v_lambdas[i], mlp_extra=extra,
                          laurel=laurel and laurel.for_layer(i))
            else:
                x = dlo.routed_mlp(i, block, block.mix_and_attend(x, x00, x01, ve, mask, lambdas[i], v_lambdas[i]),
                                   dlo_records)
            outputs.append(x)
        if dlo is not None:
            dlo.finish_forward(dlo_records, input_seq, window_blocks, aux_losses)
        return x, outputs, x00

    def head_input(self, x, outputs, x00, input_seq=None):
        if "backout" in self.study and self.cfg.backout_mode != "concat-mlp":
            return self.backout_head(x, outputs, x00, input_seq)
        return norm(x)

    def forward(self, input_seq, target_seq, window_blocks, head_chunks=1):
        """Mean cross-entropy of the next-token predictions of one sequence (batch size 1)."""
        aux_losses = []
        x, outputs, x00 = self.hidden_states(input_seq, window_blocks, aux_losses)
        x = self.head_input(x, outputs, x00, input_seq)
        total = x.new_zeros((), dtype=torch.float32)
        for xc, tc in zip(x[0].chunk(head_chunks), target_seq.chunk(head_chunks)):
            logits = softcap(F.linear(xc, self.lm_head_w.type_as(xc)).float())
            total = total + F.cross_entropy(logits, tc, reduction="sum")
        loss = total / target_seq.numel()
        for extra in aux_losses:
            loss = loss + extra
        return loss

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
        out.update(self.backout_named_scalars())
        out.update(laurel_named_scalars(self))
        if "dlo" in self.study:
            out.update(self.study["dlo"].named_scalars(self))
        return out


# ----------------------------------------------------------------------------------------------------------------
# LAuReL: learned augmented residuals (study flags --laurel*, docs/laurel.md)
#
# A LAuReL'd residual replaces x + f(x) by  alpha*f(x) + g(x, history). Sites are the attention and MLP residuals
# of a block; x is the stream entering that residual (after the U-net skip and the block's own a/b/c mix for the
# attention site, after the attention residual for the MLP site). The PA history holds the inputs of the last k
# LAuReL'd residuals, the current one included (history[j] = x_{i-j}).

LAUREL_VARIANTS = ("rw", "lr", "pa", "rw+lr", "rw+pa", "rw+lr+pa")
LAUREL_RW_FORMS = ("softmax", "sigmoid", "single", "vector")
LAUREL_PA_H = ("identity", "lowrank")
LAUREL_WHERE = ("attn", "mlp", "both")
LAUREL_DEFAULTS = dict(laurel_rank=32, laurel_k=3, laurel_rw_form="softmax", laurel_rw_scale=2.0,
                       laurel_where="mlp")


def laurel_sites(num_layers, no_attention_layer, where, layers=None):
    """The (layer, site) pairs that get LAuReL, in execution order; the no-attention layer has no attn site."""
    names = ("attn", "mlp") if where == "both" else (where,)
    chosen = range(num_layers) if layers is None else sorted(layers)
    return [(i, s) for i in chosen for s in names if not (s == "attn" and i == no_attention_layer)]


def laurel_parts(variant, pa_h):
    """(rw, lr, pa, pa_lowrank). In rw+lr+pa the low-rank products are PA's h (eq. 6): no separate LR term."""
    parts = set(variant.split("+"))
    pa = "pa" in parts
    return "rw" in parts, "lr" in parts and not pa, pa, pa and pa_h == "lowrank"


def laurel_down_init(count, rank, dim):
    """The paper's column-orthogonal A (D x r, A[i, j] = 1/sqrt(rD) iff i mod r == j) for `count` products, stored
    as F.linear weights [count, r, D]: A is the down-projection D -> r, read first."""
    a = torch.zeros(rank, dim)
    i = torch.arange(dim)
    a[i % rank, i] = 1 / math.sqrt(rank * dim)
    return a.repeat(count, 1, 1)


def laurel_rw_weights(raw, form, scale):
    """(alpha, beta) per site from the raw RW scalars, each bounded in (0, scale); raw = 0 gives scale/2 each."""
    if form == "softmax":  # raw [n, 2]
        w = scale * torch.softmax(raw, dim=-1)
        return w[:, 0], w[:, 1]
    if form == "single":  # raw [n, 1]: one sigmoid sets both
        s = torch.sigmoid(raw[:, 0])
        return scale * s, scale * (1 - s)
    w = scale * torch.sigmoid(raw)  # sigmoid: raw [n, 2]; vector: raw [n, 2, D]
    return w[:, 0], w[:, 1]


class LaurelResiduals(nn.Module):
    """Parameters of every LAuReL'd residual: low-rank products stacked in two tensors (one Muon batch each);
    the RW and PA scalars live in the model's scalar vector ("laurel.rw", "laurel.gamma")."""

    def __init__(self, cfg: ModelConfig, no_attention_layer):
        super().__init__()
        self.rw, self.lr, self.pa, self.pa_lowrank = laurel_parts(cfg.laurel, cfg.laurel_pa_h)
        self.k, self.rw_form, self.rw_scale = cfg.laurel_k, cfg.laurel_rw_form, cfg.laurel_rw_scale
        self.sites = laurel_sites(cfg.num_layers, no_attention_layer, cfg.laurel_where, cfg.laurel_layers)
        self.index = {site: n for n, site in enumerate(self.sites)}
        self.layers = {layer for layer, _ in self.sites}
        self.products_per_site = 1 if self.lr else (self.k if self.pa_lowrank else 0)
        if self.products_per_site:
            count = len(self.sites) * self.products_per_site
            self.down = nn.Parameter(laurel_down_init(count, cfg.laurel_rank, cfg.model_dim))
            self.up = nn.Parameter(torch.zeros(count, cfg.model_dim, cfg.laurel_rank))  # B = 0: starts as x

    def scalar_inits(self, dim):
        n, out = len(self.sites), {}
        if self.rw:
            out["rw"] = torch.zeros({"single": (n, 1), "vector": (n, 2, dim)}.get(self.rw_form, (n, 2)))
        if self.pa:
            out["gamma"] = torch.zeros(n, self.k)
        return out

    def rw_shape(self, dim):
        return {"single": (-1, 1), "vector": (-1, 2, dim)}.get(self.rw_form, (-1, 2))

    def weights(self, model):
        """(alpha, beta, gamma) tensors from the model's scalar vector (None where the variant has none)."""
        alpha = beta = gamma = None
        if self.rw:
            raw = model.scalar_slice("laurel.rw").view(self.rw_shape(model.cfg.model_dim))
            alpha, beta = laurel_rw_weights(raw, self.rw_form, self.rw_scale)
        if self.pa:
            gamma = model.scalar_slice("laurel.gamma").view(-1, self.k)
        return alpha, beta, gamma

    def begin(self, model):
        return LaurelPass(self, *self.weights(model))

    def product(self, index, x):
        """B A x for the index-th low-rank product."""
        return F.linear(F.linear(x, self.down[index].type_as(x)), self.up[index].type_as(x))


class LaurelPass:
    """One forward pass: the bounded weights, computed once, and the PA history (a deque of at most k inputs)."""

    def __init__(self, module: LaurelResiduals, alpha, beta, gamma):
        self.m, self.alpha, self.beta, self.gamma = module, alpha, beta, gamma
        self.history = deque(maxlen=module.k) if module.pa else None

    def for_layer(self, layer):
        if layer not in self.m.layers:
            return None
        return lambda x, fx, site: self.residual(layer, site, x, fx)

    def residual(self, layer, site, x, fx):
        m = self.m
        n = m.index.get((layer, site))
        if n is None:  # the other site of a layer LAuReL'd at one site only
            return x + fx
        g = x
        if m.lr:  # eq. 3
            g = x + m.product(n, x)
        if m.pa:  # eq. 4: x_i + sum_j gamma_j h_j(x_{i-j}) over the inputs in the history
            self.history.appendleft(x)
            extra = None
            for j, earlier in enumerate(self.history):
                h = m.product(n * m.k + j, earlier) if m.pa_lowrank else earlier
                term = self.gamma[n, j] * h
                extra = term if extra is None else extra + term
            g = x + extra
        if m.rw:  # eqs. 5 and 6: alpha f(x) + beta g
            alpha, beta = self.alpha[n], self.beta[n]
            if alpha.ndim:  # vector form: per-dimension weights in the activation dtype
                alpha, beta = alpha.type_as(fx), beta.type_as(x)
            return alpha * fx + beta * g
        return g + fx


def attach_laurel(model, cfg: ModelConfig):
    if cfg.laurel is None:
        return
    module = LaurelResiduals(cfg, model.pattern["no_attention_layer"])
    model.study["laurel"] = module
    for name, init in module.scalar_inits(cfg.model_dim).items():
        model.add_scalars(f"laurel.{name}", init)


@torch.no_grad()
def laurel_named_scalars(model):
    """alpha, beta (bounded values; the mean for the vector form) and gamma_j per LAuReL'd residual."""
    if "laurel" not in model.study:
        return {}
    m, out = model.study["laurel"], {}
    alpha, beta, gamma = m.weights(model)
    if alpha is not None and alpha.ndim > 1:
        alpha, beta = alpha.mean(dim=-1), beta.mean(dim=-1)
    suffix = ".mean" if m.rw_form == "vector" else ""
    alpha, beta = (None, None) if alpha is None else (alpha.tolist(), beta.tolist())
    gamma = None if gamma is None else gamma.tolist()
    for n, (layer, site) in enumerate(m.sites):
        key = f"laurel.L{layer}.{site}"
        if alpha is not None:
            out[f"{key}.alpha{suffix}"], out[f"{key}.beta{suffix}"] = alpha[n], beta[n]
        if gamma is not None:
            for j, value in enumerate(gamma[n]):
                out[f"{key}.gamma{j}"] = value
    return out


def extra_layer_params(cfg: ModelConfig):
    """Parameters the baseline architecture gains at cfg.num_layers over cfg.baseline_layers (naive scaling)."""
    base = ModelConfig(vocab_size=cfg.vocab_size, model_dim=cfg.model_dim, num_heads=cfg.num_heads,
                       head_dim=cfg.head_dim, mlp_ratio=cfg.mlp_ratio, block_size=cfg.block_size,
                       max_window_tokens=cfg.max_window_tokens, attn_scale=cfg.attn_scale)
    with torch.device("meta"):
        counts = [sum(p.numel() for p in GPT(replace(base, num_layers=n), max_seq_len=1).parameters())
                  for n in (cfg.num_layers, cfg.baseline_layers)]
    return counts[0] - counts[1]


def add_laurel_args(parser):
    g = parser.add_argument_group("laurel", "LAuReL residuals (docs/laurel.md); every flag needs --laurel")
    g.add_argument("--laurel", default=None, metavar="VARIANT",
                   help=f"LAuReL variant: {', '.join(LAUREL_VARIANTS)} (default: off)")
    g.add_argument("--laurel-rank", default=None, metavar="R",
                   help="rank r of the low-rank products B A (LR, low-rank PA; 0 < r < model dim; default 32)")
    g.add_argument("--laurel-k", default=None, metavar="K",
                   help="PA: previous activations used, the current input included (default 3)")
    g.add_argument("--laurel-rw-form", default=None, metavar="FORM",
                   help=f"RW bound: {', '.join(LAUREL_RW_FORMS)} (default softmax)")
    g.add_argument("--laurel-rw-scale", default=None, metavar="S",
                   help="RW: alpha, beta lie in (0, S) and start at S/2 (default 2: the plain residual at init)")
    g.add_argument("--laurel-pa-h", default=None, metavar="H",
                   help="PA: h is identity or lowrank (default identity; rw+lr+pa is eq. 6: lowrank)")
    g.add_argument("--laurel-where", default=None, metavar="SITE",
                   help="residuals LAuReL'd: attn, mlp or both (default mlp: one per layer, as the paper)")
    g.add_argument("--laurel-layers", default=None, metavar="LIST",
                   help="comma-separated layer indices to LAuReL (default: every layer)")


def parse_int_flag(value, flag):
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"{flag}: expected an integer, got {value!r}")


def check_laurel_args(args):
    """Validates the --laurel* flags and fills their defaults (only when --laurel is given)."""
    names = ["laurel_rank", "laurel_k", "laurel_rw_form", "laurel_rw_scale", "laurel_pa_h", "laurel_where",
             "laurel_layers"]
    flag = {n: "--" + n.replace("_", "-") for n in names}
    if args.laurel is None:
        for n in names:
            if getattr(args, n) is not None:
                raise UsageError(f"{flag[n]} needs --laurel")
        return
    if args.laurel not in LAUREL_VARIANTS:
        raise UsageError(f"--laurel: unknown variant {args.laurel!r} (choose from {', '.join(LAUREL_VARIANTS)})")
    for n, allowed in [("laurel_rw_form", LAUREL_RW_FORMS), ("laurel_pa_h", LAUREL_PA_H),
                       ("laurel_where", LAUREL_WHERE)]:
        if getattr(args, n) is not None and getattr(args, n) not in allowed:
            raise UsageError(f"{flag[n]}: unknown value {getattr(args, n)!r} (choose from {', '.join(allowed)})")
    pa_h = args.laurel_pa_h or ("lowrank" if args.laurel == "rw+lr+pa" else "identity")
    if args.laurel == "rw+lr+pa" and pa_h != "lowrank":
        raise UsageError("--laurel-pa-h identity: rw+lr+pa is eq. 6 (low-rank h); use --laurel rw+pa for identity h")
    rw, lr, pa, pa_lowrank = laurel_parts(args.laurel, pa_h)
    unused = {"laurel_rank": not (lr or pa_lowrank), "laurel_k": not pa, "laurel_pa_h": not pa,
              "laurel_rw_form": not rw, "laurel_rw_scale": not rw}
    for n, is_unused in unused.items():
        if is_unused and getattr(args, n) is not None:
            raise UsageError(f"{flag[n]} has no effect with --laurel {args.laurel}")
    for n, value in LAUREL_DEFAULTS.items():
        if getattr(args, n) is None:
            setattr(args, n, value)
    args.laurel_pa_h = pa_h
    args.laurel_rank = parse_int_flag(args.laurel_rank, "--laurel-rank")
    args.laurel_k = parse_int_flag(args.laurel_k, "--laurel-k")
    try:
        args.laurel_rw_scale = float(args.laurel_rw_scale)
    except ValueError:
        raise UsageError(f"--laurel-rw-scale: expected a number, got {args.laurel_rw_scale!r}")
    if not args.laurel_rw_scale > 0 or math.isinf(args.laurel_rw_scale):
        raise UsageError(f"--laurel-rw-scale must be a positive number, got {args.laurel_rw_scale}")
    dim, num_layers = PRESETS[args.preset]["model_dim"], args.num_layers
    if not 0 < args.laurel_rank < dim:
        raise UsageError(f"--laurel-rank must be in 1..{dim - 1} (below the model dim {dim}), got {args.laurel_rank}")
    no_attention = layer_pattern(num_layers)["no_attention_layer"]
    if args.laurel_layers is not None:
        items = [s.strip() for s in str(args.laurel_layers).split(",")]
        layers = [parse_int_flag(s, "--laurel-layers") for s in items]
        for i in layers:
            if not 0 <= i < num_layers:
                raise UsageError(f"--laurel-layers: layer {i} is outside the model (layers 0..{num_layers - 1})")
        if len(set(layers)) != len(layers):
            raise UsageError("--laurel-layers: a layer is listed twice")
        if args.laurel_where == "attn" and no_attention in layers:
            raise UsageError(f"--laurel-layers: layer {no_attention} has no attention residual "
                             f"(use --laurel-where mlp or both)")
        args.laurel_layers = sorted(layers)
    sites = laurel_sites(num_layers, no_attention, args.laurel_where, args.laurel_layers)
    if pa and not 0 < args.laurel_k <= len(sites):
        raise UsageError(f"--laurel-k must be in 1..{len(sites)} (the number of LAuReL'd residuals), "
                         f"got {args.laurel_k}")


def laurel_config(args):
    """ModelConfig fields of the LAuReL flags ({} when off: the dataclass defaults mean off)."""
    if args.laurel is None:
        return {}
    return dict(laurel=args.laurel, laurel_rank=args.laurel_rank, laurel_k=args.laurel_k,
                laurel_rw_form=args.laurel_rw_form, laurel_rw_scale=args.laurel_rw_scale,
                laurel_pa_h=args.laurel_pa_h, laurel_where=args.laurel_where,
                laurel_layers=None if args.laurel_layers is None else tuple(args.laurel_layers))


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
        self.lr_mul = {}  # per-parameter learning-rate multipliers (DLO's layer-wise rates); absent = 1
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
                p_lr = lr * self.lr_mul.get(p, 1.0)
                value.mul_(1 - p_lr * wd * self.wd_mul[p]).add_(st["smoothed"], alpha=-p_lr * scale)
                self.write_master(p, value)
            if ws > 1:
                self._share(chunk)

    def _share(self, chunk):
        """Every rank receives the parameters updated by their owners."""
        self._exchange([q.data for q in chunk])

    def _exchange(self, tensors):
        """tensors[j] is authoritative on rank j (the owner of position base+j); afterwards on every rank."""
        if len({t.numel() for t in tensors}) == 1 and len({t.dtype for t in tensors}) == 1:
            flat = [t.view(-1) for t in tensors]
            flat += [torch.empty_like(flat[0]) for _ in range(self.world_size - len(tensors))]
            dist.all_gather(flat, flat[self.rank].clone())
        else:
            for j, t in enumerate(tensors):
                dist.broadcast(t, j)

    def master_values(self):
        """{id(p): fp32 value} of every matrix on every rank: the bf16 parameter plus its owner's low bits."""
        out = {}
        for base in range(0, len(self.ordered), self.world_size):
            chunk = self.ordered[base:base + self.world_size]
            lows = []
            for p in chunk:
                st = self.state.get(p, {})
                owned = self.owner(p) == self.rank and "mantissa" in st
                lows.append(st["mantissa"] if owned else torch.zeros_like(p, dtype=torch.int16))
            if self.world_size > 1 and any(p.dtype == torch.bfloat16 for p in chunk):
                lows = [t.clone() for t in lows]
                self._exchange([t.view(torch.bfloat16) for t in lows])  # same bits; gloo has no int16
            for p, low in zip(chunk, lows):
                out[id(p)] = fp32_from_bf16_parts(p.data, low) if p.dtype == torch.bfloat16 else p.data.float()
        return out

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
    identical on every rank.

    `read_all()` gives the parameters' current fp32 values (for bf16 Muon matrices, the full-precision master, so
    the truncated bf16 copy is not mistaken for motion), `write(p, v)` stores a fp32 value into p, and
    `stored(p, v)` is what p then holds, so (old - new) compares like with like."""

    def __init__(self, params, lr=0.68, momentum=0.37, every=28, write=None, stored=None, read_all=None):
        self.params, self.lr, self.momentum, self.every = list(params), lr, momentum, every
        self.write = write or (lambda p, v: p.data.copy_(v))
        self.stored = stored or (lambda p, v: v.to(p.dtype).float())
        self.read_all = read_all or (lambda: [p.detach().float() for p in self.params])
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
        for i, (p, current) in enumerate(zip(self.params, self.read_all())):
            grad = self.stored(p, self.old[i]) - current
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
        params = list(model.parameters())

        def read_all():
            masters = self.muon.master_values()
            return [masters[id(p)] if id(p) in muon_set else p.detach().float() for p in params]

        # Muon matrices are compared at full precision (exact fp32 masters); others as their dtype holds them.
        self.snoo = Snoo(params, read_all=read_all,
                         write=lambda p, v: self.muon.write_master(p, v) if id(p) in muon_set else p.data.copy_(v),
                         stored=lambda p, v: v if id(p) in muon_set else v.to(p.dtype).float())

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
# DLO: depth expansion of a trained checkpoint and per-token routed MLP skipping (docs/dlo.md)

DLO_POLICIES = ("random", "copy", "identity", "merge", "slerp", "strict-identity")


def dlo_layer_pattern(cfg: ModelConfig):
    """Per-layer structure of the expanded model. The checkpoint's L layers are cut into G groups of n = L/G and P
    new layers are appended to each group. Every layer of the expanded model has a source layer of the checkpoint
    (itself, or for a new layer the last original layer of its group) and inherits the source's value embedding,
    window length and attention presence; U-net pairs connect the expanded positions of the original pairs."""
    L, G, P = cfg.dlo_base_layers, cfg.dlo_groups, cfg.dlo_add
    base, n = layer_pattern(L), L // G
    position = [(i // n) * (n + P) + i % n for i in range(L)]
    new_layers = {g * (n + P) + n + k: g * n + n - 1 for g in range(G) for k in range(P)}
    source = {position[i]: i for i in range(L)} | new_layers
    total = L + G * P
    return dict(num_value_embeds=base["num_value_embeds"],
                ve_index=[base["ve_index"][source[j]] for j in range(total)],
                long_window_layers=[j for j in range(total) if source[j] in base["long_window_layers"]],
                no_attention_layer=position[base["no_attention_layer"]],
                no_attention_layers=[j for j in range(total) if source[j] == base["no_attention_layer"]],
                unet_pairs=[(position[s], position[d]) for s, d in base["unet_pairs"]],
                dlo_position=position, dlo_new_layers=new_layers,
                dlo_group_members={q: list(range(s - n + 1, s + 1)) for q, s in new_layers.items()})


def dlo_skip_rate(step, start, target, anneal_steps):
    """Overall skip rate at a step: linear from `start` to `target` over `anneal_steps`, then constant."""
    if anneal_steps <= 0:
        return target
    return start + (target - start) * min(1.0, step / anneal_steps)


def similarity_labels(similarity, skip_rate):
    """Router labels (True = active) for a [layers, tokens] similarity table: ranked over all layers and tokens
    together, the round((1 - skip_rate) * count) least similar entries are active. Static shapes (compile-friendly)."""
    flat = similarity.flatten()
    n = flat.numel()
    num_active = torch.round((1 - torch.as_tensor(skip_rate, dtype=torch.float64, device=flat.device)) * n)
    rank = torch.empty(n, dtype=torch.int64, device=flat.device).scatter_(
        0, flat.argsort(), torch.arange(n, device=flat.device))
    return (rank < num_active).view_as(similarity)


def skip_loss(router_logits, labels):
    """The router supervision: binary cross-entropy of sigmoid(logit) against the similarity-induced labels."""
    return F.binary_cross_entropy_with_logits(router_logits, labels.to(router_logits.dtype))


def forward_flops_per_token(cfg: ModelConfig, pattern, window_blocks, seq_len, mlp_active=None, routers=False):
    """Forward FLOPs per token (2 per multiply-add) counted by hand: per layer with attention the q/k/v/o
    projections and the score and value products over the keys a query may see (its window, capped at the
    sequence; causal and document masking are ignored); each MLP times its active fraction (1 if not given);
    the routers' dot products when `routers`; the lm head over the padded vocabulary."""
    D, hdim = cfg.model_dim, cfg.num_heads * cfg.head_dim
    padded_vocab = ((cfg.vocab_size + 127) // 128) * 128
    keys = dict(long=min(window_blocks * cfg.block_size, seq_len),
                short=min(max(window_blocks // 2, 1) * cfg.block_size, seq_len))
    no_attention = pattern.get("no_attention_layers", [pattern["no_attention_layer"]])
    total = 2 * D * padded_vocab
    for i in range(cfg.num_layers):
        if i not in no_attention:
            k = keys["long"] if i in pattern["long_window_layers"] else keys["short"]
            total += 2 * 4 * hdim * D + 2 * 2 * hdim * k
        total += (1.0 if mlp_active is None else mlp_active[i]) * 2 * 2 * D * cfg.mlp_ratio * D
        if routers:
            total += 2 * D
    return total


class DLORouters(nn.Module):
    """One linear router (D -> 1, no bias, zero-initialised) per layer of the expanded model, gating its MLP.

    gate = 1 + scale * (sigmoid(w . norm(h) / sqrt(D)) - 0.5): exactly 1 at zero weights, in (1 - scale/2,
    1 + scale/2) otherwise. Training: h + gate * MLP(norm(h)) ("soft") or, with hard gating, only where
    gate >= threshold. Evaluation: only tokens with gate >= threshold go through the MLP (gathered, scattered back).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        L, D = cfg.num_layers, cfg.model_dim
        self.num_layers, self.dim = L, D
        self.scale, self.threshold = cfg.dlo_score_scale, cfg.dlo_threshold
        self.skip_loss_weight, self.hard_gating = cfg.dlo_skip_loss_weight, cfg.dlo_train_gating == "hard"
        # One flat 1-D vector, so the baseline's optimiser split sends it to Adam (not Muon).
        self.router_w = nn.Parameter(torch.zeros(L * D))
        for name, shape, dtype in [("skip_rate", (), torch.float64), ("label_active_sum", (L,), torch.float32),
                                   ("label_count", (), torch.float32), ("val_active", (L,), torch.int64),
                                   ("val_tokens", (), torch.int64), ("val_window", (), torch.int64),
                                   ("val_seq_len", (), torch.int64)]:
            self.register_buffer(name, torch.zeros(shape, dtype=dtype), persistent=False)

    def router_logits(self, layer, z):
        w = self.router_w[layer * self.dim:(layer + 1) * self.dim]
        return (z.float() @ w) * self.dim ** -0.5

    def gate(self, logits):
        return 1 + self.scale * (torch.sigmoid(logits) - 0.5)

    def routed_mlp(self, layer, block, h, records):
        z = norm(h)
        logits = self.router_logits(layer, z)
        gate = self.gate(logits)
        if self.training:
            m = block.mlp(z)
            if self.hard_gating:
                gate = gate * (gate >= self.threshold)
            with torch.no_grad():  # the label feature: the residual stream before and after the (ungated) MLP
                similarity = F.cosine_similarity(h.float(), (h + m).float(), dim=-1)
            records.append((logits, similarity))
            return h + gate[..., None].type_as(m) * m
        active = (gate[0] >= self.threshold).nonzero().squeeze(1)
        out = block.mlp(z[0].index_select(0, active)) * gate[0].index_select(0, active)[:, None].type_as(z)
        self.val_active[layer] += active.numel()
        return h[0].index_add(0, active, out)[None]

    def finish_forward(self, records, input_seq, window_blocks, aux_losses):
        if not self.training:
            self.val_tokens += input_seq.numel()
            self.val_window.copy_(torch.as_tensor(window_blocks))
            self.val_seq_len.fill_(input_seq.numel())
            return
        logits = torch.cat([r[0] for r in records])
        labels = similarity_labels(torch.cat([r[1] for r in records]), self.skip_rate)
        with torch.no_grad():
            self.label_active_sum += labels.float().mean(dim=1)
            self.label_count += 1
        if aux_losses is not None and self.skip_loss_weight:
            aux_losses.append(self.skip_loss_weight * skip_loss(logits, labels))

    def label_active_fractions(self):
        return self.label_active_sum / self.label_count.clamp_min(1)

    def named_scalars(self, model):
        """Skip rate, the last step's label active fractions, and (after a validation, then reset) each layer's
        measured active fraction and the effective FLOPs relative to the dense expanded model."""
        out = {"dlo.skip_rate": float(self.skip_rate)}
        if self.label_count > 0:
            for i, a in enumerate(self.label_active_fractions().tolist()):
                out[f"dlo.L{i}.label_active"] = a
        counts = torch.cat([self.val_active, self.val_tokens.view(1)])
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(counts)
        if counts[-1] > 0:
            active = (counts[:-1].double() / counts[-1].double()).tolist()
            for i, a in enumerate(active):
                out[f"dlo.L{i}.active"] = a
            window, seq_len = int(self.val_window), int(self.val_seq_len)
            out["dlo.flops_rel"] = (
                forward_flops_per_token(model.cfg, model.pattern, window, seq_len, active, routers=True)
                / forward_flops_per_token(model.cfg, model.pattern, window, seq_len))
        self.val_active.zero_()
        self.val_tokens.zero_()
        return out


def slerp(a, b, t, eps=1e-8):
    """Spherical interpolation between two weight tensors seen as flat vectors (t=0: a, t=1: b); plain linear
    interpolation when either is zero or they are parallel."""
    na, nb = a.norm(), b.norm()
    if na < eps or nb < eps:
        return torch.lerp(a, b, t)
    omega = torch.arccos(((a * b).sum() / (na * nb)).clamp(-1, 1))
    if torch.sin(omega) < 1e-6:
        return torch.lerp(a, b, t)
    return (torch.sin((1 - t) * omega) * a + torch.sin(t * omega) * b) / torch.sin(omega)


def init_expanded_block(block, members, policy, slerp_t):
    """Initialises a new layer from its group's original layers `members` (the last one is its source)."""
    source = members[-1]
    if policy == "random":  # Xavier uniform on every matrix (each of q, k, v, o on its own)
        for p in block.parameters():
            for matrix in (p if p.ndim == 3 else [p]):
                nn.init.xavier_uniform_(matrix)
    elif policy in ("copy", "identity", "strict-identity"):
        block.load_state_dict(source.state_dict())
        if policy != "copy" and block.attn is not None:
            block.attn.qkvo_w[3].zero_()
        if policy == "strict-identity":
            block.mlp.proj_w.zero_()
    elif policy == "merge":  # uniform mean over the group's original layers that have the parameter
        for name, p in block.named_parameters():
            parts = [dict(m.named_parameters())[name].float() for m in members
                     if name in dict(m.named_parameters())]
            p.copy_(torch.stack(parts).mean(0))
    elif policy == "slerp":  # between the group's last two original layers
        first, second = dict(members[-2].named_parameters()), dict(members[-1].named_parameters())
        for name, p in block.named_parameters():
            if name not in first:  # the earlier layer has no attention: take the source's
                p.copy_(second[name])
                continue
            a, b = first[name].float(), second[name].float()
            p.copy_(torch.stack([slerp(x, y, slerp_t) for x, y in zip(a, b)]) if p.ndim == 3
                    else slerp(a, b, slerp_t))


@torch.no_grad()
def expand_model(base, model, policy, slerp_t):
    """Writes the unexpanded model `base` into the expanded `model`: shared weights copied, original layers at
    their expanded positions with their scalars, new layers by `policy` with block scalars (1, 0, 0) (the residual
    passes unchanged) and, except for random, the source's value scalars. Routers stay at zero."""
    pat = model.pattern
    own = model.state_dict()
    for key, value in base.state_dict().items():
        if not key.startswith("blocks.") and key != "scalars":
            own[key].copy_(value)
    model.scalar_slice("unet").copy_(base.scalar_slice("unet"))
    lam, base_lam = model.scalar_slice("block").view(-1, 3), base.scalar_slice("block").view(-1, 3)
    vlam, base_vlam = model.scalar_slice("value").view(-1, 2), base.scalar_slice("value").view(-1, 2)
    lam.copy_(torch.tensor([1.0, 0.0, 0.0]).expand_as(lam))
    for i, p in enumerate(pat["dlo_position"]):
        model.blocks[p].load_state_dict(base.blocks[i].state_dict())
        lam[p], vlam[p] = base_lam[i], base_vlam[i]
    for q, src in pat["dlo_new_layers"].items():
        init_expanded_block(model.blocks[q], [base.blocks[j] for j in pat["dlo_group_members"][q]], policy, slerp_t)
        if policy != "random":
            vlam[q] = base_vlam[src]


def dlo_base_config(cfg: ModelConfig):
    return replace(cfg, num_layers=cfg.dlo_base_layers, dlo_groups=0, dlo_add=0, dlo_base_layers=0)


def dlo_expand_from_checkpoint(model, state, args, max_seq_len):
    """Builds the unexpanded model, loads the checkpoint into it (strict shapes), then expands into `model`."""
    base = GPT(dlo_base_config(model.cfg), max_seq_len).to(model.lm_head_w.device)
    cast_model(base, model.embed1.weight.dtype)
    load_model_weights(base, state, args.init_from)
    expand_model(base, model, args.dlo_init, args.dlo_slerp_t)


def dlo_layer_lr_multipliers(model):
    """Layer-wise rates: layer l's hidden matrices get lr * a_l / mean(a), a_l = its label active fraction
    (1 - its sparsity factor); the mean rate is the base rate."""
    active = model.study["dlo"].label_active_fractions()
    mean = active.mean()
    mul = (active / mean if mean > 0 else torch.ones_like(active)).tolist()
    out = {}
    for i, block in enumerate(model.blocks):
        for p in ([block.attn.qkvo_w] if block.attn is not None else []) + [block.mlp.fc_w, block.mlp.proj_w]:
            out[p] = mul[i]
    return out


def dlo_before_step(model, args, step):
    if not args.dlo_groups:
        return
    routers = model.study["dlo"]
    routers.skip_rate.fill_(dlo_skip_rate(step, args.dlo_anneal_start, args.dlo_sparsity, args.dlo_anneal_steps))
    routers.label_active_sum.zero_()
    routers.label_count.zero_()


def dlo_after_step(model, opt, args, ddp):
    if not args.dlo_groups:
        return
    routers = model.study["dlo"]
    if ddp.world_size > 1:  # the labels' layer statistics over the whole batch
        stats = torch.cat([routers.label_active_sum, routers.label_count.view(1)])
        dist.all_reduce(stats)
        routers.label_active_sum.copy_(stats[:-1])
        routers.label_count.copy_(stats[-1])
    if args.dlo_layer_lr:
        opt.muon.lr_mul.update(dlo_layer_lr_multipliers(model))


DLO_DEFAULTS = dict(dlo_add=1, dlo_init="identity", dlo_slerp_t=0.5, dlo_sparsity=0.1, dlo_anneal_start=0.0,
                    dlo_anneal_steps=None, dlo_skip_loss_weight=0.1, dlo_threshold=1.0, dlo_score_scale=1.0,
                    dlo_train_gating="soft")


def add_dlo_args(parser):
    g = parser.add_argument_group(
        "dlo", "Dynamic Layer Operation (docs/dlo.md): expand a trained checkpoint (--init-from) in depth and learn "
               "per token which MLPs to skip. Off unless --dlo-groups is given.")
    g.add_argument("--dlo-groups", type=int, default=None, help="G: cut the checkpoint's layers into G groups")
    g.add_argument("--dlo-add", type=int, default=None, help="P: new layers appended to each group (default 1)")
    g.add_argument("--dlo-init", default=None,
                   help=f"new layers' initialisation, one of {', '.join(DLO_POLICIES)} (default identity)")
    g.add_argument("--dlo-slerp-t", type=float, default=None,
                   help="SLERP position between the group's last two layers (default 0.5)")
    g.add_argument("--dlo-sparsity", type=float, default=None, help="target overall skip rate in [0, 1) (default 0.1)")
    g.add_argument("--dlo-anneal-start", type=float, default=None, help="skip rate at step 0 (default 0)")
    g.add_argument("--dlo-anneal-steps", type=int, default=None,
                   help="steps of the linear skip-rate ramp (default half of --num-iterations)")
    g.add_argument("--dlo-skip-loss-weight", type=float, default=None,
                   help="weight of the router BCE skip loss added to the task loss (default 0.1)")
    g.add_argument("--dlo-layer-lr", action="store_true",
                   help="layer-wise Muon learning rates scaled by each layer's label active fraction")
    g.add_argument("--dlo-threshold", type=float, default=None,
                   help="an MLP runs for a token iff its gate >= this at evaluation (default 1.0)")
    g.add_argument("--dlo-score-scale", type=float, default=None,
                   help="gate = 1 + scale*(sigmoid(logit) - 0.5), scale in (0, 2] (default 1)")
    g.add_argument("--dlo-train-gating", default=None,
                   help="training MLP output: soft = gate * MLP for every token, hard = only where gate >= "
                        "threshold (default soft)")


def check_dlo_args(args):
    """Fills the DLO defaults and rejects values that cannot work (UsageError, one line)."""
    given = [k for k in list(DLO_DEFAULTS) + ["dlo_layer_lr"] if getattr(args, k) not in (None, False)]
    if args.dlo_groups is None:
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} needs --dlo-groups")
        return
    for key, value in DLO_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.dlo_anneal_steps is None:
        args.dlo_anneal_steps = args.num_iterations // 2
    combined = [flag for flag, on in (("--backout-layers", args.backout_layers), ("--rolling-skip", args.rolling_skip),
                                      ("--laurel", args.laurel)) if on]
    if combined:  # expansion copies the baseline's per-layer parts only
        raise UsageError(f"--dlo-groups cannot be combined with {combined[0]} (DLO expands baseline checkpoints)")
    G, L = args.dlo_groups, args.num_layers
    if G < 1 or L % G:
        raise UsageError(f"--dlo-groups {G} must be a positive divisor of --num-layers {L} (the checkpoint's depth)")
    checks = [
        (args.dlo_add >= 1, f"--dlo-add must be at least 1 (got {args.dlo_add})"),
        (args.dlo_init in DLO_POLICIES, f"--dlo-init: unknown policy {args.dlo_init!r} "
                                        f"(choose from {', '.join(DLO_POLICIES)})"),
        (0 <= args.dlo_sparsity < 1, f"--dlo-sparsity must be in [0, 1) (got {args.dlo_sparsity})"),
        (0 <= args.dlo_anneal_start <= args.dlo_sparsity,
         f"--dlo-anneal-start must be in [0, --dlo-sparsity] (got {args.dlo_anneal_start})"),
        (args.dlo_anneal_steps >= 0, f"--dlo-anneal-steps must not be negative (got {args.dlo_anneal_steps})"),
        (args.dlo_skip_loss_weight >= 0, f"--dlo-skip-loss-weight must not be negative "
                                         f"(got {args.dlo_skip_loss_weight})"),
        (0 <= args.dlo_slerp_t <= 1, f"--dlo-slerp-t must be in [0, 1] (got {args.dlo_slerp_t})"),
        (args.dlo_init != "slerp" or L // G >= 2, "--dlo-init slerp needs at least 2 layers per group"),
        (0 < args.dlo_score_scale <= 2, f"--dlo-score-scale must be in (0, 2] (got {args.dlo_score_scale})"),
        (1 - args.dlo_score_scale / 2 < args.dlo_threshold <= 1,
         f"--dlo-threshold must be in (1 - scale/2, 1] so tokens start active and can drop out "
         f"(got {args.dlo_threshold})"),
        (args.dlo_train_gating in ("soft", "hard"), f"--dlo-train-gating must be soft or hard "
                                                    f"(got {args.dlo_train_gating!r})"),
        (bool(args.init_from or args.resume), "--dlo-groups needs --init-from CHECKPOINT (DLO expands a trained "
                                              "model) or --resume"),
    ]
    for ok, message in checks:
        if not ok:
            raise UsageError(message)


def dlo_model_config(cfg: ModelConfig, args):
    if not getattr(args, "dlo_groups", None):
        return cfg
    return replace(cfg, num_layers=cfg.num_layers + args.dlo_groups * args.dlo_add, dlo_groups=args.dlo_groups,
                   dlo_add=args.dlo_add, dlo_base_layers=cfg.num_layers, dlo_score_scale=args.dlo_score_scale,
                   dlo_threshold=args.dlo_threshold, dlo_skip_loss_weight=args.dlo_skip_loss_weight,
                   dlo_train_gating=args.dlo_train_gating)


# ----------------------------------------------------------------------------------------------------------------
# Command line

class HelpWithDefaults(argparse.HelpFormatter):
    """Shows a flag's default only when it has a real one (None means "preset's value" or "off")."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            text += " (default: %(default)s)"
        return text


class OneLineErrorParser(argparse.ArgumentParser):
    """Bad flags end the process with one line and exit 2 (not the whole usage text)."""

    def error(self, message):
        self.exit(2, f"error: {message} (see --help)\n")


def make_arg_parser():
    p = OneLineErrorParser(
        description="GPT-2 Medium speedrun (2.92 track). With no flags: the upstream baseline. Size and run "
                    "flags without a default take the --preset's value.",
        formatter_class=HelpWithDefaults)
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
    add_backout_args(p)
    add_laurel_args(p)
    add_dlo_args(p)
    return p


BACKOUT_MODES = ["sum", "subtract", "concat-head", "concat-mlp"]
BACKOUT_TRANSFORMS = ["none", "detach", "relu", "tanh", "relu-linear"]


def add_backout_args(parser):
    g = parser.add_argument_group("backout (docs/backout.md; every flag but --rolling-skip needs --backout-layers)")
    g.add_argument("--backout-layers", nargs="+", default=None, metavar="SOURCE",
                   help="sources mixed into the final latents: 0-based layer indices, `embed` (x00) or `new-embed` "
                        "(a fresh embedding table); comma- or space-separated. The record: 11")
    g.add_argument("--backout-mode", choices=BACKOUT_MODES, default=None,
                   help="sum: x_lambda*norm(x) + sum_L lambda_L*norm(out[L]) (default); subtract: "
                        "norm(x - sum_L lambda_L*out[L]); concat-head: the head reads [norm(x), norm(out[L]), ...]; "
                        "concat-mlp: a down-projection of norm(out[L]) joins the last MLP's input")
    g.add_argument("--backout-transform", choices=BACKOUT_TRANSFORMS, default=None,
                   help="applied to each source before its norm (default none); relu-linear = ReLU then a learned "
                        "DxD matrix (Muon)")
    g.add_argument("--backout-x-init", type=float, default=None, help="initial x_lambda (sum mode; default 1.0)")
    g.add_argument("--backout-skip-init", type=float, default=None,
                   help="initial lambda of every source (default 0.0 in sum mode, 0.5 in subtract mode)")
    g.add_argument("--backout-fixed-x", action="store_true", help="x_lambda is a constant (its init), not learned")
    g.add_argument("--backout-freeze", action="store_true", help="every backout lambda stays at its init")
    g.add_argument("--backout-norm-after-sum", action="store_true",
                   help="sum mode: norm(x_lambda*norm(x) + sum_L lambda_L*norm(out[L]))")
    g.add_argument("--backout-concat-dim", type=int, default=None,
                   help="concat-mlp: width each source is projected down to (default 128)")
    g.add_argument("--backout-mlp-ratio", type=float, default=None,
                   help="concat-mlp: hidden width of the last MLP as a multiple of the model dim (default 1.0)")
    g.add_argument("--rolling-skip", action="store_true",
                   help="from layer 3 on, layer i's input is a*out[i-3] + b*out[i-1] (learned, init a=0, b=1)")


def check_backout_args(args):
    """Validates the backout flags and fills their defaults; args.backout_layers becomes a list of ints/names."""
    L, last = args.num_layers, args.num_layers - 1
    if args.rolling_skip and L < 4:
        raise UsageError(f"--rolling-skip needs at least 4 layers (got --num-layers {L})")
    dependent = dict(mode=args.backout_mode, transform=args.backout_transform, x_init=args.backout_x_init,
                     skip_init=args.backout_skip_init, fixed_x=args.backout_fixed_x or None,
                     freeze=args.backout_freeze or None, norm_after_sum=args.backout_norm_after_sum or None,
                     concat_dim=args.backout_concat_dim, mlp_ratio=args.backout_mlp_ratio)
    given = [f"--backout-{k.replace('_', '-')}" for k, v in dependent.items() if v is not None]
    if not args.backout_layers:
        if given:
            raise UsageError(f"{given[0]} needs --backout-layers (no backout source given)")
        args.backout_layers = []
        return
    sources = []
    for item in ",".join(args.backout_layers).split(","):
        item = item.strip()
        if item in ("embed", "new-embed"):
            source = item
        else:
            try:
                source = int(item)
            except ValueError:
                raise UsageError(f"--backout-layers: {item!r} is not a layer index, `embed` or `new-embed`")
            if not 0 <= source <= last:
                raise UsageError(f"--backout-layers: layer {source} is outside the model (layers 0..{last})")
        if source in sources:
            raise UsageError(f"--backout-layers: {item} is listed twice")
        sources.append(source)
    mode = args.backout_mode = args.backout_mode or "sum"
    transform = args.backout_transform = args.backout_transform or "none"
    if last in sources and mode in ("sum", "subtract"):
        raise UsageError(f"--backout-layers: layer {last} is the last layer; mixing out[{last}] into x = out[{last}] "
                         f"only rescales it (use --backout-mode concat-head for that control)")
    if last in sources and mode == "concat-mlp":
        raise UsageError(f"--backout-layers: layer {last} is not computed yet when the last MLP runs (concat-mlp)")
    if transform == "detach" and "new-embed" in sources:
        raise UsageError("--backout-transform detach: the new-embed table would never receive a gradient")
    for flag, value, modes in [("--backout-x-init", args.backout_x_init, ["sum"]),
                               ("--backout-fixed-x", dependent["fixed_x"], ["sum"]),
                               ("--backout-norm-after-sum", dependent["norm_after_sum"], ["sum"]),
                               ("--backout-skip-init", args.backout_skip_init, ["sum", "subtract"]),
                               ("--backout-freeze", dependent["freeze"], ["sum", "subtract"]),
                               ("--backout-concat-dim", args.backout_concat_dim, ["concat-mlp"]),
                               ("--backout-mlp-ratio", args.backout_mlp_ratio, ["concat-mlp"])]:
        if value is not None and mode not in modes:
            raise UsageError(f"{flag} does not apply to --backout-mode {mode} (only {'/'.join(modes)})")
    for flag, value in [("--backout-x-init", args.backout_x_init), ("--backout-skip-init", args.backout_skip_init),
                        ("--backout-mlp-ratio", args.backout_mlp_ratio)]:
        if value is not None and not math.isfinite(value):
            raise UsageError(f"{flag} must be finite")
    if args.backout_concat_dim is not None and args.backout_concat_dim <= 0:
        raise UsageError("--backout-concat-dim must be positive")
    if args.backout_mlp_ratio is not None and args.backout_mlp_ratio <= 0:
        raise UsageError("--backout-mlp-ratio must be positive")
    args.backout_layers = sources
    if args.backout_x_init is None:
        args.backout_x_init = 1.0
    if args.backout_skip_init is None:
        args.backout_skip_init = 0.5 if mode == "subtract" else 0.0
    if args.backout_concat_dim is None:
        args.backout_concat_dim = 128
    if args.backout_mlp_ratio is None:
        args.backout_mlp_ratio = 1.0


def backout_config(args):
    """The ModelConfig fields of the backout flags (args already checked; no sources: the off defaults)."""
    if not args.backout_layers:
        return dict(rolling_skip=args.rolling_skip)
    return dict(backout_layers=tuple(args.backout_layers), backout_mode=args.backout_mode,
                backout_transform=args.backout_transform, backout_x_init=args.backout_x_init,
                backout_skip_init=args.backout_skip_init, backout_fixed_x=args.backout_fixed_x,
                backout_freeze=args.backout_freeze, backout_norm_after_sum=args.backout_norm_after_sum,
                backout_concat_dim=args.backout_concat_dim, backout_mlp_ratio=args.backout_mlp_ratio,
                rolling_skip=args.rolling_skip)


def resolve_args(argv=None):
    """Parses flags and fills preset defaults; raises UsageError on combinations that cannot work."""
    args = make_arg_parser().parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key, None) is None:
            if key in ("train_files", "val_files"):  # the preset's data lives next to this script
                value = os.path.relpath(Path(__file__).resolve().parent / value)
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
    check_backout_args(args)
    if args.resume and args.init_from:
        raise UsageError("--resume and --init-from cannot be combined")
    for name in ["resume", "init_from"]:
        path = getattr(args, name)
        if path and not os.path.isfile(path):
            raise UsageError(f"--{name.replace('_', '-')}: no such file {path}")
    if "/" in args.run_name or not args.run_name.strip():
        raise UsageError("--run-name must be a plain file name")
    check_laurel_args(args)
    check_dlo_args(args)
    return args


def model_config(args):
    pre = PRESETS[args.preset]
    cfg = ModelConfig(num_layers=args.num_layers, model_dim=pre["model_dim"], num_heads=pre["num_heads"],
                      head_dim=pre["head_dim"], block_size=pre["block_size"],
                      max_window_tokens=pre["max_window_tokens"], baseline_layers=pre["num_layers"],
                      **backout_config(args), **laurel_config(args))
    return dlo_model_config(cfg, args)


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
        loss = model(inputs.to(ddp.device), targets.to(ddp.device), window)  # no-ops for stream batches
        (loss / len(batches)).backward()
    sync_gradients(model, ddp)


@torch.no_grad()
def validate(model, args, ddp: Dist, window):
    model.eval()
    stream = TokenStream(find_shards(args.val_files, "--val-files"), args.val_seq_len, "--val-files", ddp.device)
    steps = args.val_tokens // (VIRTUAL_RANKS * args.val_seq_len)
    total = torch.zeros((), device=ddp.device, dtype=torch.float32)
    for _ in range(steps):
        for inputs, targets in stream.next_batch(ddp.virtual_ranks):
            total += model(inputs, targets, window, head_chunks=4).float()
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


def kernel_warmup(train_model, model, opt, args, ddp: Dist, cfg: ModelConfig):
    """Untimed steps on random tokens (compiles the kernels), then every piece of training state restored
    exactly as it was."""
    saved = dict(model=copy.deepcopy(model.state_dict()), adam=copy.deepcopy(opt.adam.state_dict()),
                 muon=opt.muon.full_state(), snoo=opt.snoo.state_dict())
    N = args.num_iterations
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
    if init_state is not None and cfg.dlo_groups:
        dlo_expand_from_checkpoint(model, init_state, args, max(args.train_seq_len, args.val_seq_len))
    elif init_state is not None:
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
    log.write(Path(__file__).read_text().rstrip("\n"), echo=False)
    log.write("=" * 100, echo=False)
    for line in environment_lines(ddp):
        log.write(line, echo=False)
    log.write("config: " + json.dumps(config, sort_keys=True))
    log.write(f"added_params: {json.dumps(added)} total {sum(added.values())}")
    log.write("=" * 100, echo=False)

    N = args.num_iterations
    last_step = args.stop_after or N

    if args.warmup_steps:
        kernel_warmup(train_model, model, opt, args, ddp, cfg)
    if ddp.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()  # the figure reports training, not the warm-up
    window_tensors = {}

    stream = TokenStream(train_files, args.train_seq_len, "--train-files", ddp.device)
    start_step, train_ms = 0, 0.0
    if resume_state is not None:
        opt.load_state_dict(resume_state["optimizers"])
        stream.restore(resume_state["stream"])
        start_step, train_ms = resume_state["step"], resume_state["train_ms"]
        torch.set_rng_state(resume_state["rng"]["cpu"])
        cuda_rng = resume_state["rng"]["cuda"]
        if torch.cuda.is_available() and cuda_rng is not None and len(cuda_rng) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_rng)
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
        # A tensor, so the compiled model is not specialised on (and recompiled for) each window size; one per
        # value, made once, so no step waits on a host-to-device copy.
        blocks = window_blocks_at(step, N, cfg)
        if blocks not in window_tensors:
            window_tensors[blocks] = torch.tensor(blocks, device=ddp.device)
        window = window_tensors[blocks]
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
        dlo_before_step(model, args, step)
        train_step(train_model, stream.next_batch(ddp.virtual_ranks), window, ddp)
        dlo_after_step(model, opt, args, ddp)
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
    else:  # CPU: no allocator statistics; the process's peak resident memory stands in for both
        import resource
        alloc = reserved = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
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
