"""GPT-2 small speedrun (3.28 val-loss track), research fork.

With no flags this is upstream small-track record #21 as re-timed on 2025-02-01 (1770 steps, ~3.0 min on 8xH100):
FlexAttention, value embeddings, U-net skips, the lm head in FP8 on H100. Study flags add the backout skip,
LAuReL and DLO variants; every one of them is off by default.

Runs as `torchrun --standalone --nproc_per_node=N train_gpt.py` (N in 1, 2, 4, 8; every world size sees the same
tokens per optimiser step through gradient accumulation) or as a plain `python train_gpt.py`. On CUDA: NCCL,
FlexAttention, torch.compile. On CPU: gloo and an SDPA attention on the same mask (for tests and the demo,
`--preset tiny`). Importing this file runs nothing.
"""

import sys

import speedrun  # noqa: F401  (first: it sets the CUDA allocator's config before torch starts)
import torch
import torch.nn as nn
import torch.nn.functional as F

from speedrun.cli import make_parser, resolve_track_args, run_main
from speedrun.data import TokenStream, find_shards
from speedrun.distributed import Dist
from speedrun.errors import UsageError
from speedrun.layers import chunked_cross_entropy, norm, window_in_blocks
from speedrun.model import GPTConfig, StudyBlock, StudyGPT, model_config_from_args, preset_config
from speedrun.optimizers import TrackOptimizers
from speedrun.presets import record_preset, tiny_preset
from speedrun.studies import STUDIES
from speedrun.study import Flag
# check_data: the study runner's
from speedrun.training import Track, check_data, run_training, train_step  # noqa: F401

TRACK = "small"


# ----------------------------------------------------------------------------------------------------------------
# Configuration

PRESETS = {
    "full": record_preset(num_layers=12, model_dim=768, num_heads=6, head_dim=128, block_size=128,
                          max_window_tokens=1728, train_seq_len=48 * 1024, num_iterations=1770),
    "tiny": tiny_preset(num_layers=12),
}
ModelConfig = preset_config(PRESETS["full"], STUDIES)  # the record's model (its sizes as defaults)


def model_config(args):
    """The model of checked args: the preset's sizes, --num-layers and the study flags."""
    return model_config_from_args(PRESETS[args.preset], args, STUDIES)


def layer_pattern(num_layers):
    """Per-layer structure derived from the layer count; gives exactly the record's values at 12 layers.

    - value embeddings: n_ve = max(1, L//4); layers 0..n_ve-1 and L-n_ve..L-1 use ve[0..n_ve-1] (0-2, 9-11).
    - long attention windows: layers 0, L//3 and L-1 (0, 4, 11).
    - the layer without attention: L//2 + 1 (7).
    - U-net skips: the first L//2 layers push their outputs, the last L//2 pop them: layer L//2 + k receives
      layer L//2 - 1 - k (5->6, 4->7, ..., 0->11).
    """
    if num_layers < 2:
        raise UsageError(f"--num-layers must be at least 2 (got {num_layers})")
    n_ve = max(1, num_layers // 4)
    ve_index = [None] * num_layers
    for i in range(n_ve):
        ve_index[i] = i
        ve_index[num_layers - n_ve + i] = i
    half = num_layers // 2
    unet = [(half - 1 - k, num_layers - half + k) for k in range(half)]
    return dict(num_value_embeds=n_ve, ve_index=ve_index,
                long_window_layers=sorted({0, num_layers // 3, num_layers - 1}),
                no_attention_layer=min(half + 1, num_layers - 1), unet_pairs=unet)


# ----------------------------------------------------------------------------------------------------------------
# Model

def softcap(logits):
    return 30 * torch.sigmoid(logits / 7.5)


def window_blocks_at(step, num_iterations, cfg: GPTConfig):
    """Linear window schedule: ceil to blocks of max_window_tokens * step / num_iterations, at least one block."""
    return window_in_blocks(cfg.max_window_tokens * step / num_iterations, cfg.block_size)


class Block(StudyBlock):
    def __init__(self, cfg: GPTConfig, has_attention, max_seq_len):
        super().__init__(cfg, has_attention, max_seq_len, norm_v=False)

    def mix_and_attend(self, x, x0, ve, mask, lambdas, v_lambdas, *, augment=None):
        """Everything before the MLP: the embedding re-injection and the attention residual (on norm(x))."""
        x = lambdas[0] * x + lambdas[1] * x0
        if self.attn is not None:
            x = self.residual(x, self.attn(norm(x), ve, mask, v_lambdas[0], v_lambdas[1]), "attn", augment)
        return x


# --- the FP8 lm head -------------------------------------------------------------------------------------------
# Training multiplies norm(x) by 2 and the fp32 head weight by 2^9 and casts both to e4m3; the output gradient is
# multiplied by 2^19 and cast to e5m2. Each scaled matmul divides its operands' scales back out.

FP8_INPUT_SCALE, FP8_WEIGHT_SCALE, FP8_GRAD_SCALE = 2.0, 2.0 ** 9, 2.0 ** 19


def fp8_head_available(device):
    """FP8 matmuls need CUDA compute capability 8.9 or newer (Ada, Hopper) and torch._scaled_mm."""
    return (device.type == "cuda" and hasattr(torch, "_scaled_mm")
            and torch.cuda.get_device_capability(device) >= (8, 9))


def inverse_scale(scale, like):
    return torch.tensor(1 / scale, dtype=torch.float32, device=like.device)


# An opaque custom op (forward and backward each one node, with fake implementations for tracing): torch.compile
# keeps it whole instead of lowering torch._scaled_mm and the fp8 casts itself. The forward returns the fp8 operands
# too, so the backward reuses them rather than casting again.
@torch.library.custom_op("speedrun::fp8_head_matmul", mutates_args=())
def fp8_head_matmul(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x @ w.T, x in e4m3, w in e4m3) for x [T, D] (bf16) and w [V, D] (fp32): a bf16 product, fast accumulation."""
    x_f8 = (x * FP8_INPUT_SCALE).to(torch.float8_e4m3fn)
    w_f8 = (w * FP8_WEIGHT_SCALE).to(torch.float8_e4m3fn)
    # _scaled_mm wants its first operand row-major and its second column-major: w_f8.t() is.
    out = torch._scaled_mm(x_f8, w_f8.t(), scale_a=inverse_scale(FP8_INPUT_SCALE, x),
                           scale_b=inverse_scale(FP8_WEIGHT_SCALE, x), out_dtype=torch.bfloat16, use_fast_accum=True)
    return out, x_f8, w_f8


@fp8_head_matmul.register_fake
def _(x, w):
    return (x.new_empty(x.shape[0], w.shape[0], dtype=torch.bfloat16), torch.empty_like(x, dtype=torch.float8_e4m3fn),
            torch.empty_like(w, dtype=torch.float8_e4m3fn))


@torch.library.custom_op("speedrun::fp8_head_matmul_backward", mutates_args=())
def fp8_head_matmul_backward(grad_out: torch.Tensor, x_f8: torch.Tensor,
                             w_f8: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(bf16 input gradient, fp32 weight gradient) from the output gradient cast to e5m2; exact accumulation."""
    grad_f8 = (grad_out.contiguous() * FP8_GRAD_SCALE).to(torch.float8_e5m2)
    grad_scale = inverse_scale(FP8_GRAD_SCALE, grad_out)
    grad_x = torch._scaled_mm(grad_f8, w_f8.t().contiguous().t(), scale_a=grad_scale,
                              scale_b=inverse_scale(FP8_WEIGHT_SCALE, grad_out), out_dtype=torch.bfloat16,
                              use_fast_accum=False)
    grad_w = torch._scaled_mm(x_f8.t().contiguous(), grad_f8.t().contiguous().t(),
                              scale_a=inverse_scale(FP8_INPUT_SCALE, grad_out), scale_b=grad_scale,
                              out_dtype=torch.float32, use_fast_accum=False).t()
    return grad_x, grad_w


@fp8_head_matmul_backward.register_fake
def _(grad_out, x_f8, w_f8):
    return (torch.empty_like(x_f8, dtype=torch.bfloat16),
            grad_out.new_empty(w_f8.shape[1], w_f8.shape[0], dtype=torch.float32).t())


def _fp8_head_save(ctx, inputs, output):
    ctx.save_for_backward(*output[1:])


def _fp8_head_backward(ctx, grad_out, _grad_x_f8, _grad_w_f8):
    return fp8_head_matmul_backward(grad_out, *ctx.saved_tensors)


fp8_head_matmul.register_autograd(_fp8_head_backward, setup_context=_fp8_head_save)


class GPT(StudyGPT):
    layer_pattern = staticmethod(layer_pattern)
    block_lambdas = (1.0, 0.0)  # each layer's initial block lambdas

    def __init__(self, cfg: GPTConfig, max_seq_len):
        super().__init__(cfg, max_seq_len)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.model_dim)
        self.add_layers_and_head(Block, max_seq_len)
        self.finish_init()
        self.fp8_head = False  # set by the run where FP8 matmuls exist (training forward only)

    def cast_low_precision(self, dtype):
        """Only the embeddings are stored in the low-precision dtype; matrices stay fp32 and are cast in forward."""
        for p in self.embedding_params():
            p.data = p.data.to(dtype)

    def track_embedding_params(self):
        return [self.embed.weight] + [e.weight for e in self.value_embeds]

    def block_matrix_params(self, block):
        # no weight decay on this track: the multipliers are unused
        return [(p, 1.0) for p in ([block.attn.qkvo_w] if block.attn is not None else [])
                + [block.mlp.fc_w, block.mlp.proj_w]]

    def embed_inputs(self, input_seq):
        return (norm(self.embed(input_seq)[None]),)

    def head_loss(self, latents, target_seq, head_chunks=1):
        """Summed in head_chunks pieces of the sequence (validation: memory), then averaged."""
        def logits_of(x):  # x [T, D]: _scaled_mm takes 2-D operands
            if self.training and self.fp8_head:
                # by its registered name: a process that loads the script twice (tests, benchmarks) keeps only the
                # later registration, and the handle the earlier copy took may point at an entry that is gone
                return softcap(torch.ops.speedrun.fp8_head_matmul.default(x, self.lm_head_w)[0].float())
            return softcap(F.linear(x, self.lm_head_w.type_as(x)).float())
        return chunked_cross_entropy(latents, target_seq, logits_of, head_chunks)


def choose_lm_head(model, args, proc: Dist):
    """Turns the FP8 head on where it can run (and --fp8-head is not off); returns the log line saying which ran."""
    available = fp8_head_available(proc.device)
    model.fp8_head = available and args.fp8_head == "auto"
    if model.fp8_head:
        return ["lm_head: fp8 (e4m3 input and weight, e5m2 gradient, torch._scaled_mm) in training; bf16 in eval"]
    dtype = str(model.embedding_params()[0].dtype).replace("torch.", "")
    why = "--fp8-head off" if available else f"no FP8 matmul on {proc.device.type}"
    return [f"lm_head: {dtype} matmul ({why})"]


# ----------------------------------------------------------------------------------------------------------------
# Optimisers

class Optimizers(TrackOptimizers):
    """Muon (lr 0.05, no weight decay, no smoothing, constant NS5 coefficients) for the hidden matrices, Adam for
    head/embeddings/scalars, no outer optimiser; cooldown over the last 40% to 0.1."""

    MUON_LR, MUON_WD, MUON_SMOOTHING = 0.05, 0.0, 0.0
    NS_COEFFS = ((3.4445, -4.7750, 2.0315),) * 5
    ADAM_LRS = dict(head=0.008, embed=0.6, scalar=0.04)
    COOLDOWN_FRAC, LR_FLOOR = 0.4, 0.1
    USE_SNOO = False


def first_batch_steps(train_model, opt, args, proc: Dist, cfg: GPTConfig):
    """The kernel warm-up's steps: full training steps on the first training batches, window one block (the run
    then restarts the loader from the beginning)."""
    stream = TokenStream(find_shards(args.train_files, "--train-files"), args.train_seq_len, "--train-files",
                         proc.device)
    window = torch.tensor(1, device=proc.device)

    def take_step(i):
        train_step(train_model, stream.next_batch(proc.virtual_ranks), window, proc, opt.reducer)
        opt.step(i, args.num_iterations)
    return take_step


# ----------------------------------------------------------------------------------------------------------------
# Command line

TRACK_FLAGS = (Flag("--fp8-head", "lm head matmul in FP8 where the GPU supports it (auto), or never (off)",
                    resume=False, kind=str, options=dict(choices=["auto", "off"], default="auto")),)


def make_arg_parser():
    return make_parser("GPT-2 small speedrun (3.28 track).", "upstream record #21", PRESETS,
                       track_flags=TRACK_FLAGS)


def resolve_args(argv=None):
    """Parses flags and fills preset defaults; raises UsageError on combinations that cannot work."""
    parsed = vars(make_arg_parser().parse_args(argv))
    return resolve_track_args(parsed, PRESETS, __file__, layer_pattern, TRACK_FLAGS)


# ----------------------------------------------------------------------------------------------------------------
# Training

SMALL = Track(name=TRACK, script=__file__, model_config=model_config, model_class=GPT, optimizers=Optimizers,
              window_blocks_at=window_blocks_at, warmup=first_batch_steps, val_decimals=4,
              barrier_around_validation=False, prepare_model=choose_lm_head)


def run(args, proc: Dist):
    run_training(SMALL, args, proc)


def main(argv=None):
    return run_main(resolve_args, run, argv, script=__file__, track_flags=TRACK_FLAGS)


if __name__ == "__main__":
    sys.exit(main())
