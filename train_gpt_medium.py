"""GPT-2 Medium speedrun (2.92 val-loss track), research fork.

With no flags this is the upstream medium-track baseline (the 2025-09-30 "Smoothed Snoo" record: 5590 steps on
8xH100). Study flags add the backout skip, LAuReL and DLO variants; every one of them is off by default.

Runs as `torchrun --standalone --nproc_per_node=N train_gpt_medium.py` (N in 1, 2, 4, 8; every world size sees the
same tokens per optimiser step through gradient accumulation) or as a plain `python train_gpt_medium.py`.
On CUDA: NCCL, FlexAttention, torch.compile. On CPU: gloo and an SDPA attention on the same mask (for tests and the
demo, `--preset tiny`). Importing this file runs nothing.
"""

import sys
from dataclasses import replace

import speedrun  # noqa: F401  (first: it sets the CUDA allocator's config before torch starts)
import torch
import torch.nn as nn
import torch.nn.functional as F

from speedrun.cli import make_parser, resolve_track_args, run_main, runs_r18
from speedrun.distributed import Dist
from speedrun.errors import UsageError
from speedrun.layers import chunked_cross_entropy, norm, window_in_blocks
from speedrun.model import GPTConfig, StudyBlock, StudyGPT, model_config_from_args, preset_config
from speedrun.muon import NS5_COEFFS
from speedrun.optimizers import TrackOptimizers
from speedrun.presets import record_preset, tiny_preset
from speedrun.studies import STUDIES
from speedrun.study import Flag
# check_data: the study runner's
from speedrun.training import Track, check_data, run_training, train_step  # noqa: F401

TRACK = "medium"


# ----------------------------------------------------------------------------------------------------------------
# Configuration

PRESETS = {
    "full": record_preset(num_layers=16, model_dim=1024, num_heads=8, head_dim=128, block_size=128,
                          max_window_tokens=3456, train_seq_len=64 * 1024, num_iterations=5590),
    "tiny": tiny_preset(num_layers=6),
}
ModelConfig = preset_config(PRESETS["full"], STUDIES)  # the record's model (its sizes as defaults)


def model_config(args):
    """The model of checked args: the preset's sizes, --num-layers and the study flags."""
    return model_config_from_args(PRESETS[args.preset], args, STUDIES)


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


class Block(StudyBlock):
    def __init__(self, cfg: GPTConfig, has_attention, max_seq_len):
        super().__init__(cfg, has_attention, max_seq_len, norm_v=True)

    def mix_and_attend(self, x, x_embed, x_embed2, ve, mask, lambdas, v_lambdas, *, augment=None):
        """Everything before the MLP: the embedding re-injection and the attention residual (on the raw x)."""
        x = lambdas[0] * x + lambdas[1] * x_embed + lambdas[2] * x_embed2
        if self.attn is not None:
            x = self.residual(x, self.attn(x, ve, mask, v_lambdas[0], v_lambdas[1]), "attn", augment)
        return x


def window_blocks_at(step, num_iterations, cfg: GPTConfig):
    x = step / num_iterations
    return window_in_blocks(cfg.max_window_tokens * (4 * x ** 3 - 6 * x ** 2 + 3 * x), cfg.block_size)


class GPT(StudyGPT):
    layer_pattern = staticmethod(layer_pattern)
    block_lambdas = (1.0, 0.0, 0.0)  # each layer's initial block lambdas

    def __init__(self, cfg: GPTConfig, max_seq_len):
        super().__init__(cfg, max_seq_len)
        self.embed1 = nn.Embedding(cfg.vocab_size, cfg.model_dim)
        self.embed2 = nn.Embedding(cfg.vocab_size, cfg.model_dim)
        self.add_layers_and_head(Block, max_seq_len)
        self.finish_init()

    def track_embedding_params(self):
        return [self.embed1.weight, self.embed2.weight] + [e.weight for e in self.value_embeds]

    def block_matrix_params(self, block):
        out = [(block.attn.qkvo_w, 1.0)] if block.attn is not None else []
        return out + [(block.mlp.fc_w, 2.0), (block.mlp.proj_w, 2.0)]

    def embed_inputs(self, input_seq):
        return norm(self.embed1(input_seq)[None]), norm(self.embed2(input_seq)[None])

    def head_loss(self, latents, target_seq, head_chunks=1):
        """Summed in head_chunks pieces of the sequence (validation: memory), then averaged."""
        return chunked_cross_entropy(latents, target_seq,
                                     lambda x: softcap(F.linear(x, self.lm_head_w.type_as(x)).float()), head_chunks)


# ----------------------------------------------------------------------------------------------------------------
# Optimisers

class Optimizers(TrackOptimizers):
    """Muon (lr 0.03, weight decay 0.01, update smoothing 0.2, the tuned NS5 coefficients) for the hidden
    matrices, Adam for head/embeddings/scalars, Snoo around everything; cooldown over the last 70% to 0.01."""

    MUON_LR, MUON_WD, MUON_SMOOTHING = 0.03, 0.01, 0.2
    NS_COEFFS = NS5_COEFFS
    ADAM_LRS = dict(head=1 / 320, embed=0.3, scalar=0.015)
    COOLDOWN_FRAC, LR_FLOOR = 0.7, 0.01
    USE_SNOO = True


# ----------------------------------------------------------------------------------------------------------------
# Command line

# One Flag per element, on lines of its own: an export prunes the tuple (docs/export.md, rule 12).
TRACK_FLAGS = (
    Flag("--coordinate-descent-tuning", "inductor coordinate-descent tuning (allowed on the medium track; default: on "
                                        "for r14 as its record, off for r18 as its record)",
         resume=False, kind=str, options=dict(choices=["on", "off"], default=None)),
    Flag("--base", "r14: the 2025-09-30 record this script reproduces; r18: the 2025-12-31 record (speedrun/r18: its "
                   "model, optimisers, batches and schedules; the study flags by the rule in speedrun/r18/studies.py; "
                   "--compile on compiles the whole model (fullgraph) for training and validation, regional is "
                   "refused; --warmup-steps: one per graph its schedule compiles, or 0)",
         resume=True, kind=str, options=dict(choices=["r14", "r18"], default="r14")),
    # resume=False: another attention computes the same function, so a run may resume on another node; its log then
    # names both kernels and the step between (speedrun.r18.attention.kernel_history)
    Flag("--attention", "record #18's attention (r18): auto = FA3 (the `kernels` package) when it loads, else PyTorch "
                        "varlen, else FlexAttention on CUDA; SDPA on CPU. The log says which ran; train_time is "
                        "comparable with the record's only on fa3",
         resume=False, kind=str, options=dict(choices=["auto", "fa3", "varlen", "flex", "sdpa"], default="auto")),
)


def make_arg_parser():
    return make_parser("GPT-2 Medium speedrun (2.92 track).", "the upstream baseline", PRESETS,
                       track_flags=TRACK_FLAGS)


def resolve_args(argv=None):
    """Parses flags and fills preset defaults; raises UsageError on combinations that cannot work."""
    parser = make_arg_parser()
    given = sys.argv[1:] if argv is None else argv
    parsed = vars(parser.parse_args(given))
    if runs_r18(parsed["base"]):
        return resolve_r18_args(parsed, given)
    config = resolve_track_args(parsed, PRESETS, __file__, layer_pattern, TRACK_FLAGS)
    config = replace(config, coordinate_descent_tuning=config.coordinate_descent_tuning or "on")
    if config.attention != "auto":
        raise UsageError(f"--attention {config.attention}: chooses --base r18's attention (the r14 path runs "
                         f"FlexAttention on CUDA, SDPA on CPU)")
    return config


def resolve_r18_args(parsed, given):
    """--base r18: the presets at #18's depth, the study flags that run there (speedrun.r18.studies states the
    rule), the attention checked on this machine."""
    # Imported here: only r18 runs import (and log) the r18 package.
    from speedrun.r18.attention import resolve_attention
    from speedrun.r18.model import NUM_LAYERS, layer_pattern as r18_layer_pattern
    from speedrun.r18.studies import check_r18_studies
    if parsed["num_layers"] not in (None, NUM_LAYERS):
        raise UsageError(f"--num-layers {parsed['num_layers']}: --base r18 has the record's {NUM_LAYERS} layers")
    # #18 validates every 250 steps (#14 every 125)
    presets = {name: dict(values, num_layers=NUM_LAYERS,
                          **(dict(val_every=R18_RECORD_VAL_EVERY) if name == "full" else {}))
               for name, values in PRESETS.items()}
    config = resolve_track_args(parsed, presets, __file__, r18_layer_pattern, TRACK_FLAGS)
    check_r18_studies(config)
    # #18 was timed without it (upstream banned it for new records: it makes compiling take ~30 min)
    config = replace(config, coordinate_descent_tuning=config.coordinate_descent_tuning or "off")
    if config.init_schedule == "continue":
        raise UsageError("--init-schedule continue: not on --base r18 yet (an r18 run from --init-from restarts "
                         "its schedules at step 0)")
    if config.compile == "regional":
        raise UsageError("--compile regional: not on --base r18, whose optimisers average the gradients after the "
                         "backward (nothing for regions to overlap); --compile on compiles the whole model")
    if config.warmup_steps:
        raise UsageError(f"--warmup-steps {config.warmup_steps}: --base r18 warms up one step per graph its "
                         f"schedule compiles, as many as that needs; only 0 (no warm-up) can be given")
    resolve_attention(config.attention, "cuda" if torch.cuda.is_available() else "cpu")
    if config.preset == "full" and "--num-iterations" not in given:
        config = replace(config, num_iterations=R18_RECORD_STEPS)
    return config


# ----------------------------------------------------------------------------------------------------------------
# Training

VAL_HEAD_CHUNKS = 4  # validation runs the head in at least this many pieces of the sequence (memory)


def random_token_steps(train_model, opt, args, proc: Dist, cfg: GPTConfig):
    """The kernel warm-up's steps: full training steps on random tokens, windows spread over the schedule."""
    N = args.num_iterations
    gen = torch.Generator().manual_seed(args.seed + 1)

    def take_step(i):
        window = torch.tensor(window_blocks_at(i * N // args.warmup_steps, N, cfg), device=proc.device)
        batches = [(torch.randint(0, cfg.vocab_size, (args.train_seq_len,), generator=gen),
                    torch.randint(0, cfg.vocab_size, (args.train_seq_len,), generator=gen))
                   for _ in proc.virtual_ranks]
        train_step(train_model, batches, window, proc, opt.reducer)
        opt.step(i, N)
    return take_step


MEDIUM = Track(name=TRACK, script=__file__, model_config=model_config, model_class=GPT, optimizers=Optimizers,
               window_blocks_at=window_blocks_at, warmup=random_token_steps,
               val_head_chunks=VAL_HEAD_CHUNKS,
               coordinate_descent_tuning=lambda args: args.coordinate_descent_tuning == "on")


R18_RECORD_STEPS = 4740  # record #18: 4700 scheduled + 40 extension steps
R18_RECORD_VAL_EVERY = 250


def run(args, proc: Dist):
    if runs_r18(args.base):
        from speedrun.r18.train import run_r18  # only r18 runs import (and log) the r18 package
        run_r18(args, proc, __file__)
    else:
        run_training(MEDIUM, args, proc)


def main(argv=None):
    return run_main(resolve_args, run, argv, script=__file__, track_flags=TRACK_FLAGS)


if __name__ == "__main__":
    sys.exit(main())
