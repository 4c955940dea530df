"""GPT-2 Medium speedrun (2.92 val-loss track), research fork.

With no flags this is the upstream medium-track baseline (the 2025-09-30 "Smoothed Snoo" record: 5590 steps on
8xH100). Study flags add the backout skip, LAuReL and DLO variants; every one of them is off by default.

Runs as `torchrun --standalone --nproc_per_node=N train_gpt_medium.py` (N in 1, 2, 4, 8; every world size sees the
same tokens per optimiser step through gradient accumulation) or as a plain `python train_gpt_medium.py`.
On CUDA: NCCL, FlexAttention, torch.compile. On CPU: gloo and an SDPA attention on the same mask (for tests and the
demo, `--preset tiny`). Importing this file runs nothing.
"""

import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

if "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:  # must be set before torch starts; less fragmentation
    os.environ.setdefault("PYTORCH_ALLOC_CONF", "expandable_segments:True")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from speedrun.backout import add_backout_args, backout_config, check_backout_args  # noqa: E402
from speedrun.checkpoint import (cast_model, load_checkpoint, load_model_weights, load_resume_state,  # noqa: E402
                                 run_schedule_clock, save_checkpoint)
from speedrun.cli import make_parser, resolve_shared_args, run_main  # noqa: E402
from speedrun.data import TokenStream, find_shards, read_shard  # noqa: E402
from speedrun.distributed import Dist, GradientReducer  # noqa: E402
from speedrun.dlo import (add_dlo_args, check_dlo_args, dlo_after_step, dlo_before_step,  # noqa: E402
                          dlo_expand_from_checkpoint, dlo_model_config)
from speedrun.errors import UsageError  # noqa: E402
from speedrun.laurel import add_laurel_args, check_laurel_args, laurel_config  # noqa: E402
from speedrun.layers import MLP, CausalSelfAttention, norm  # noqa: E402
from speedrun.model import StudyConfig, StudyGPT  # noqa: E402
from speedrun.muon import Muon, Snoo  # noqa: E402
from speedrun.profiling import StepProfiler  # noqa: E402
from speedrun.runlog import RunLog, write_preamble  # noqa: E402
from speedrun.training import (kernel_warmup, log_train_step, log_validation, peak_memory_line,  # noqa: E402
                               train_step, validate)
from speedrun.variants import default_variant, given_study_flags  # noqa: E402

TRACK = "medium"


# ----------------------------------------------------------------------------------------------------------------
# Configuration

@dataclass
class ModelConfig(StudyConfig):
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
# Model

def softcap(logits):
    return 15 * logits * torch.rsqrt(logits.square() + 225)


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


def window_blocks_at(step, num_iterations, cfg: ModelConfig):
    x = step / num_iterations
    tokens = cfg.max_window_tokens * (4 * x ** 3 - 6 * x ** 2 + 3 * x)
    tokens = max(cfg.block_size, int(math.ceil(tokens / cfg.block_size)) * cfg.block_size)
    return tokens // cfg.block_size


class GPT(StudyGPT):
    layer_pattern = staticmethod(layer_pattern)

    def __init__(self, cfg: ModelConfig, max_seq_len):
        super().__init__(cfg, max_seq_len)
        L, D = cfg.num_layers, cfg.model_dim
        self.embed1 = nn.Embedding(cfg.vocab_size, D)
        self.embed2 = nn.Embedding(cfg.vocab_size, D)
        self.value_embeds = nn.ModuleList(nn.Embedding(cfg.vocab_size, cfg.num_heads * cfg.head_dim)
                                          for _ in range(self.pattern["num_value_embeds"]))
        self.blocks = nn.ModuleList(Block(cfg, i not in self.no_attention_layers, max_seq_len)
                                    for i in range(L))
        padded_vocab = ((cfg.vocab_size + 127) // 128) * 128
        self.lm_head_w = nn.Parameter(torch.zeros(padded_vocab, D))
        self.add_scalars("unet", torch.ones(len(self.pattern["unet_pairs"])))
        self.add_scalars("block", torch.tensor([1.0, 0.0, 0.0]).repeat(L))
        self.add_scalars("value", torch.tensor([0.5, 0.5]).repeat(L))
        self.finish_init()

    def track_embedding_params(self):
        return [self.embed1.weight, self.embed2.weight] + [e.weight for e in self.value_embeds]

    def block_matrix_params(self, block):
        out = [(block.attn.qkvo_w, 1.0)] if block.attn is not None else []
        return out + [(block.mlp.fc_w, 2.0), (block.mlp.proj_w, 2.0)]

    def embed_inputs(self, input_seq):
        return norm(self.embed1(input_seq)[None]), norm(self.embed2(input_seq)[None])

    def block_scalars(self):
        return self.scalar_slice("block").view(-1, 3), self.scalar_slice("value").view(-1, 2)

    def run_block(self, i, block, x, embeds, ve, mask, scalars, mlp_extra=None, laurel=None):
        lambdas, v_lambdas = scalars
        return block(x, *embeds, ve, mask, lambdas[i], v_lambdas[i], mlp_extra=mlp_extra, laurel=laurel)

    def mix_and_attend(self, i, block, x, embeds, ve, mask, scalars):
        lambdas, v_lambdas = scalars
        return block.mix_and_attend(x, *embeds, ve, mask, lambdas[i], v_lambdas[i])

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

    def block_named_scalars(self):
        out = {}
        lam = self.scalar_slice("block").view(-1, 3).tolist()
        vl = self.scalar_slice("value").view(-1, 2).tolist()
        for i in range(self.cfg.num_layers):
            out[f"block{i}.a"], out[f"block{i}.b"], out[f"block{i}.c"] = lam[i]
            if self.blocks[i].attn is not None:
                out[f"block{i}.v_self"], out[f"block{i}.v_embed"] = vl[i]
        return out


# ----------------------------------------------------------------------------------------------------------------
# Optimisers

def lr_factor(step, num_iterations, cooldown_frac=0.7, floor=0.01):
    x = step / num_iterations
    return 1.0 if x < 1 - cooldown_frac else (1 - x) / cooldown_frac * (1 - floor) + floor


def muon_momentum(step, warmup_steps=300):
    frac = min(step / warmup_steps, 1)
    return (1 - frac) * 0.85 + frac * 0.95


class Optimizers:
    """Muon for the hidden matrices, Adam for head/embeddings/scalars, and Snoo around everything. `reducer`
    averages the gradients across ranks (train_step launches it; step waits on each parameter's average just
    before the parameter is stepped)."""

    MUON_LR, MUON_WD = 0.03, 0.01
    ADAM_LRS = dict(head=1 / 320, embed=0.3, scalar=0.015)

    def __init__(self, model: GPT, rank, world_size, fused_adam, ns_dtype=torch.bfloat16, compile_muon=False):
        self.model = model
        self.reducer = GradientReducer(model.parameters(), world_size)
        matrices = model.matrix_params()
        self.muon = Muon(matrices, lr=self.MUON_LR, weight_decay=self.MUON_WD, momentum=0.95,
                         rank=rank, world_size=world_size, ns_dtype=ns_dtype, compile_update=compile_muon)
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
        # In the order the averages complete: the head's gradient is final first in the backward, the matrices
        # block by block, the embeddings and the scalar vector (used by every layer) last.
        self.step_adam_group("head")
        self.muon.step(wait_grads=self.reducer.wait)
        for name in ("scalar", "embed"):
            self.step_adam_group(name)
        self.reducer.wait_all()  # any reduction not consumed above (none today) completes before grads are freed
        self.snoo.step()
        self.model.zero_grad(set_to_none=True)

    def step_adam_group(self, name):
        """Adam on one parameter group, once its gradients' averages are ready. torch's Adam keeps its state per
        parameter, so stepping the groups one at a time computes exactly what one step of all of them does."""
        groups = [g for g in self.adam.param_groups if g["name"] == name]
        if not groups:
            return
        self.reducer.wait(groups[0]["params"])
        every_group = self.adam.param_groups
        self.adam.param_groups = groups
        try:
            self.adam.step()
        finally:
            self.adam.param_groups = every_group

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
    p, run = make_parser(
        "GPT-2 Medium speedrun (2.92 track). With no flags: the upstream baseline. Size and run "
                    "flags without a default take the --preset's value.", PRESETS)
    run.add_argument("--coordinate-descent-tuning", choices=["on", "off"], default="on",
                     help="inductor coordinate-descent tuning (allowed on the medium track)")
    run.add_argument("--profile-steps", type=int, default=0, metavar="N",
                     help="profile the last N training steps: optimiser-step time and exposed communication per "
                          "step, written to <log-dir>/<run-name>.profile.json (benchmarks)")
    add_backout_args(p)
    add_laurel_args(p)
    add_dlo_args(p)
    return p


def resolve_args(argv=None):
    """Parses flags and fills preset defaults; raises UsageError on combinations that cannot work."""
    parser = make_arg_parser()
    args = parser.parse_args(argv)
    given = given_study_flags(parser, args)
    resolve_shared_args(args, PRESETS, __file__)
    no_attention_layer = layer_pattern(args.num_layers)["no_attention_layer"]
    check_backout_args(args)
    check_laurel_args(args, PRESETS[args.preset]["model_dim"], no_attention_layer)
    check_dlo_args(args)
    if args.variant is None:
        # naive scaling is no study flag but is an arm of its own
        layers = [f"layers{args.num_layers}"] if args.num_layers != PRESETS[args.preset]["num_layers"] else []
        args.variant = default_variant(given, args, extra=layers)
    if args.profile_steps < 0:
        raise UsageError(f"--profile-steps must be at least 0, got {args.profile_steps}")
    return args


def model_config(args):
    pre = PRESETS[args.preset]
    cfg = ModelConfig(num_layers=args.num_layers, model_dim=pre["model_dim"], num_heads=pre["num_heads"],
                      head_dim=pre["head_dim"], block_size=pre["block_size"],
                      max_window_tokens=pre["max_window_tokens"], baseline_layers=pre["num_layers"],
                      **backout_config(args), **laurel_config(args))
    return dlo_model_config(cfg, args)


# ----------------------------------------------------------------------------------------------------------------
# Training

VAL_HEAD_CHUNKS = 4  # validation runs the head over a long sequence in this many pieces (memory)


def random_token_steps(train_model, opt, args, ddp: Dist, cfg: ModelConfig):
    """The kernel warm-up's steps: full training steps on random tokens, windows spread over the schedule."""
    N = args.num_iterations
    gen = torch.Generator().manual_seed(args.seed + 1)

    def take_step(i):
        window = torch.tensor(window_blocks_at(i * N // args.warmup_steps, N, cfg), device=ddp.device)
        batches = [(torch.randint(0, cfg.vocab_size, (args.train_seq_len,), generator=gen),
                    torch.randint(0, cfg.vocab_size, (args.train_seq_len,), generator=gen))
                   for _ in ddp.virtual_ranks]
        train_step(train_model, batches, window, ddp, opt.reducer)
        opt.step(i, N)
    return take_step


def run(args, ddp: Dist):
    cfg = model_config(args)
    train_files = find_shards(args.train_files, "--train-files")
    find_shards(args.val_files, "--val-files")
    read_shard(train_files[0])  # its token ids, before the log starts
    low = {"bf16": torch.bfloat16, "fp32": torch.float32}.get(
        args.low_precision, torch.bfloat16 if ddp.device.type == "cuda" else torch.float32)
    resume_state = load_resume_state(args)
    init_state = load_checkpoint(args.init_from) if args.init_from else None
    schedule_at = run_schedule_clock(args, init_state, resume_state)

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
    compiled = args.compile == "on" or (args.compile == "auto" and ddp.device.type == "cuda")
    # Muon's update is compiled where it pays (CUDA); on CPU the eager update keeps the bitwise reference.
    opt = Optimizers(model, ddp.rank, ddp.world_size, fused_adam=ddp.device.type == "cuda", ns_dtype=low,
                     compile_muon=compiled and ddp.device.type == "cuda")
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
    write_preamble(log, __file__, ddp, config, [f"added_params: {json.dumps(added)} total {sum(added.values())}"])

    N = args.num_iterations
    last_step = args.stop_after or N

    if args.warmup_steps:
        kernel_warmup(args.warmup_steps, model, opt, random_token_steps(train_model, opt, args, ddp, cfg))
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

    profiler = StepProfiler(max(start_step, last_step - args.profile_steps), ddp.device) \
        if args.profile_steps else None
    sync()
    t0 = time.perf_counter()
    for step in range(start_step, last_step + 1):
        is_last = step == last_step
        # A tensor, so the compiled model is not specialised on (and recompiled for) each window size; one per
        # value, made once, so no step waits on a host-to-device copy.
        blocks = window_blocks_at(*schedule_at(step), cfg)
        if blocks not in window_tensors:
            window_tensors[blocks] = torch.tensor(blocks, device=ddp.device)
        window = window_tensors[blocks]
        if is_last or (args.val_every and step % args.val_every == 0):
            sync()
            train_ms += 1000 * (time.perf_counter() - t0)
            val_loss = validate(train_model, args, ddp, window, head_chunks=VAL_HEAD_CHUNKS)
            log_validation(log, step, N, val_loss, train_ms, model.named_scalars())
            sync()
            t0 = time.perf_counter()
        if is_last:
            break
        if profiler is not None:
            profiler.begin_step(step)
        dlo_before_step(model, args, step)
        train_step(train_model, stream.next_batch(ddp.virtual_ranks), window, ddp, opt.reducer)
        dlo_after_step(model, opt, args, ddp)
        with profiler.optimizer() if profiler is not None else nullcontext():
            opt.step(*schedule_at(step))
        elapsed = train_ms + 1000 * (time.perf_counter() - t0)
        log_train_step(log, step + 1, N, elapsed)
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 and step + 1 < last_step:
            train_ms += 1000 * (time.perf_counter() - t0)
            save_checkpoint(ckpt_path, model, opt, stream, step + 1, train_ms, args, log, ddp)
            t0 = time.perf_counter()
    if args.checkpoint_every or args.save_final_checkpoint:
        save_checkpoint(ckpt_path, model, opt, stream, last_step, train_ms, args, log, ddp)
    if profiler is not None:
        profiler.finish(Path(args.log_dir) / f"{args.run_name}.profile.json" if ddp.rank == 0 else None)
    log.write(peak_memory_line(ddp))
    log.close()


def main(argv=None):
    return run_main(resolve_args, run, argv)


if __name__ == "__main__":
    sys.exit(main())
