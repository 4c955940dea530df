"""The study model machinery both tracks share: the named scalar vector, the calls of the study parts' hooks
(ModelPart, speedrun/study.py; the model names no study), parameter counts and groups, and the generic layer loop
(U-net skips, value embeddings, masks). A track's GPT subclasses StudyGPT with its embeddings,
blocks, per-layer scalars and head. The studies a model may hold come with its config (GPTConfig.studies: the
registry the run passes in), never from an import here."""

from dataclasses import dataclass, field, make_dataclass, replace
from functools import cache, partial

import torch
import torch.nn as nn

from speedrun.layers import (MLP, CausalSelfAttention, dense_window_mask, flex_block_masks, norm,
                             padded_vocab)
from speedrun.study import StudyHost, added_params_by_study


def cast_model(model, dtype):
    """Embeddings and hidden matrices in the low-precision dtype; the lm head and scalars stay fp32."""
    for p in model.parameters():
        if p is not model.lm_head_w and p.ndim >= 2:
            p.data = p.data.to(dtype)


PRESET_SIZE_FIELDS = ("model_dim", "num_heads", "head_dim", "block_size", "max_window_tokens")


@dataclass(kw_only=True)
class GPTConfig:
    """A model: its sizes (a track's preset gives them), and the studies it may hold, whose fields join it
    (model_config_class). baseline_layers: the preset's layer count (added_params reports extra layers against it)."""
    num_layers: int
    model_dim: int
    num_heads: int
    head_dim: int
    block_size: int  # attention windows are counted in blocks of this many tokens
    max_window_tokens: int
    vocab_size: int = 50257
    mlp_ratio: int = 4
    attn_scale: float = 0.12
    baseline_layers: int | None = None
    studies = ()  # the run's registry (model_config_class): no study, no part


@cache
def model_config_class(studies):
    """GPTConfig with the run's registry (`studies`: each study's part is built when it is on) and the model fields
    its studies declare (Study.model_fields; every default means off)."""
    return make_dataclass("ModelConfig", [("studies", tuple, field(default=studies, repr=False)),
                                          *((name, kind, field(default=default)) for study in studies
                                            for name, kind, default in study.model_fields)],
                          bases=(GPTConfig,), kw_only=True)


def preset_config(preset, studies):
    """The model config with the preset's sizes as defaults (a track's ModelConfig: its record model)."""
    return partial(model_config_class(tuple(studies)) if studies else GPTConfig, num_layers=preset["num_layers"],
                   **{k: preset[k] for k in PRESET_SIZE_FIELDS})


def model_config_from_args(preset, args, studies):
    """The model for checked args and the run's studies: the preset's sizes, --num-layers, and the study flags
    (with DLO, num_layers becomes the expanded depth)."""
    cfg = preset_config(preset, studies)(num_layers=args.num_layers, baseline_layers=preset["num_layers"])
    for study in studies:
        cfg = replace(cfg, **study.model_values(cfg, args))
    return cfg


def study_parts(cfg):
    """The study parts a model of this config holds: (study name, ModelPart class) of each study on in it, in build
    order (registry order, built_last parts after the others). Every model a run builds holds the run's parts but a
    part's base (ModelPart.base_config: DLO's has no DLO part), so an export writes this list for the run where no
    part has a base (docs/export.md, rule 31)."""
    on = [study for study in cfg.studies if study.in_model(cfg)]
    return [(study.name, study.model_part) for study in sorted(on, key=lambda study: study.model_part.built_last)]


TRACK_SCALARS = ("unet", "block", "value")  # scalar slices of the baseline architecture (not added params)


class StudyBlock(nn.Module):
    """A block whose residuals the study variants reach: the track's mix_and_attend(x, *mix_inputs, augment=...) (its
    input mix and attention residual), then the MLP residual on norm(x).
    mlp_extra: features concatenated to the MLP input (ModelPart.mlp_extra); None for every baseline block.
    augment: None (plain residuals) or a function (x, f(x), site) -> the augmented residual (ModelPart.residuals)."""

    def __init__(self, cfg, has_attention, max_seq_len, norm_v):
        super().__init__()
        self.attn = CausalSelfAttention(cfg, max_seq_len, norm_v) if has_attention else None
        self.mlp = MLP(cfg.model_dim, cfg.mlp_ratio * cfg.model_dim)

    @staticmethod
    def residual(x, fx, site, augment):
        return x + fx if augment is None else augment(x, fx, site)

    @staticmethod
    def add_skip(x, skip):
        """The U-net skip into a block: skip = (weight, an earlier layer's output), or None."""
        return x if skip is None else x + skip[0] * skip[1]

    def forward(self, x, *mix_inputs, skip=None, mlp_extra=None, augment=None):
        # The skip is added here rather than before the call so that --compile regional fuses it into the mix.
        x = self.mix_and_attend(self.add_skip(x, skip), *mix_inputs, augment=augment)
        fx = self.mlp(norm(x) if mlp_extra is None else torch.cat([norm(x), mlp_extra.type_as(x)], dim=-1))
        return self.residual(x, fx, "mlp", augment)


class StudyGPT(StudyHost, nn.Module):
    """Track-independent part of the GPT. A subclass's __init__ creates its token embedding(s), then calls
    add_layers_and_head(its block class, max_seq_len) and finish_init().
    It also provides:
      block_lambdas (class attribute): each layer's initial block lambdas;
      layer_pattern(num_layers) (staticmethod): ve_index, num_value_embeds, long_window_layers, no_attention_layer,
        unet_pairs;
      track_embedding_params(): its token and value embedding tables;
      block_matrix_params(block): [(matrix, weight-decay multiplier)] in Muon's order;
      embed_inputs(input_seq): the embedding streams, the first starts the residual (x_embed in the hooks);
      blocks whose forward / mix_and_attend take (x, *embeds, ve, mask, block lambdas, value lambdas).
    The "block" scalars hold the same number of lambdas per layer (named a, b, c, ...), "value" two per layer.
    """

    def __init__(self, cfg, max_seq_len):
        super().__init__()
        self.cfg = cfg
        # A study part may change the depth and each layer's structure (ModelPart.model_layer_pattern).
        own = [pattern for pattern in (part.model_layer_pattern(cfg, self.layer_pattern)
                                       for _, part in study_parts(cfg)) if pattern is not None]
        self.pattern = own[0] if own else self.layer_pattern(cfg.num_layers)
        self.no_attention_layers = self.pattern.get("no_attention_layers", [self.pattern["no_attention_layer"]])
        # Every learned scalar lives in one vector; `scalar_layout` names the slices.
        self.begin_scalars()

    def add_layers_and_head(self, block_class, max_seq_len):
        """The value embeddings, the blocks and the zero lm head (rows padded to a multiple of 128), after the
        track's token embeddings: the random init draws in the records' order."""
        cfg = self.cfg
        self.value_embeds = nn.ModuleList(nn.Embedding(cfg.vocab_size, cfg.num_heads * cfg.head_dim)
                                          for _ in range(self.pattern["num_value_embeds"]))
        self.blocks = nn.ModuleList(block_class(cfg, i not in self.no_attention_layers, max_seq_len)
                                    for i in range(cfg.num_layers))
        self.lm_head_w = nn.Parameter(torch.zeros(padded_vocab(cfg.vocab_size), cfg.model_dim))

    def finish_init(self):
        """The baseline's scalars - one weight per U-net skip (1), the track's block lambdas for every layer, one
        (v_self, v_embed) pair per layer (0.5, 0.5; the no-attention layer's is unused, so the slice indexes by
        layer) - then the study variants, and the scalar vector."""
        L = self.cfg.num_layers
        self.add_scalars("unet", torch.ones(len(self.pattern["unet_pairs"])))
        self.add_scalars("block", torch.tensor(self.block_lambdas).repeat(L))
        self.add_scalars("value", torch.tensor([0.5, 0.5]).repeat(L))
        # Study variants keep their modules in self.study (key = variant name) and their scalars in the shared
        # vector, so parameter counts, optimiser groups and logging find them without special cases.
        if study_parts(self.cfg):
            self.build_parts(study_parts(self.cfg), self.cfg)
        self.scalars = nn.Parameter(torch.cat(self._scalar_inits))
        del self._scalar_inits

    def added_params(self):
        """Parameters added by each study variant (study_params), and by the layers beyond the preset's."""
        counts = self.study_params()
        # A part that grows the model from a base config counts everything beyond it, its new layers included.
        grown = {name: part.base_config(self.cfg) for name, part in self.named_parts()
                 if part.base_config(self.cfg) is not None}
        for name, base in grown.items():
            counts[name] = sum(p.numel() for p in self.parameters()) - self.param_count(base)
        if self.cfg.baseline_layers and self.cfg.num_layers != self.cfg.baseline_layers and not grown:
            counts["layers"] = self.extra_layer_params()
        return counts

    def param_count(self, cfg):
        """Parameters of this architecture at another configuration (built on the meta device: no memory)."""
        with torch.device("meta"):
            return sum(p.numel() for p in type(self)(cfg, max_seq_len=1).parameters())

    def study_params(self):
        """What each study variant adds to the flagless model of this depth: its modules, its scalar slices ("name"
        or "name.*") and what it changes outside self.study (extra_param_counts)."""
        if not self.parts:
            return {}
        counts = added_params_by_study(self.study, self.scalar_layout, TRACK_SCALARS)
        for variant, n in self.extra_param_counts.items():
            counts[variant] = counts.get(variant, 0) + n
        return counts

    def flagless_params(self):
        """Parameters of the flagless model of this depth: this model's, less what its studies add."""
        total = sum(p.numel() for p in self.parameters())
        return total - sum(self.study_params().values()) if self.parts else total

    def extra_layer_params(self):
        """Parameters the baseline architecture gains at cfg.num_layers over cfg.baseline_layers (naive scaling).
        The model at the preset's depth is this run's model, its studies included (built on the meta device), so
        that every model a run builds holds the run's study parts: in an exported file they are constants."""
        with torch.device("meta"):
            at_preset_depth = type(self)(replace(self.cfg, num_layers=self.cfg.baseline_layers), max_seq_len=1)
        return self.flagless_params() - at_preset_depth.flagless_params()

    def cast_low_precision(self, dtype):
        """Embeddings and hidden matrices stored in the low-precision dtype (a track may keep more in fp32)."""
        cast_model(self, dtype)

    def matrix_params(self):
        """The hidden matrices Muon trains, with their weight-decay multipliers (study matrices: 1)."""
        out = []
        for block in self.blocks:
            out += self.block_matrix_params(block)
        if self.parts:  # the study parts' matrices; their embedding tables train as embeddings
            tables = {id(p) for p in self.embedding_params()}
            out += [(p, 1.0) for p in self.study.parameters() if p.ndim >= 2 and id(p) not in tables]
        return out

    def embedding_params(self):
        """The tables Adam trains as embeddings: the track's, then the study parts' nn.Embedding tables."""
        tables = self.track_embedding_params()
        if self.parts:
            tables += [m.weight for m in self.study.modules() if isinstance(m, nn.Embedding)]
        return tables

    def masks(self, input_seq, window_blocks):
        """(long, short) masks for this sequence and window; short is half the long window, at least 1 block."""
        bs = self.cfg.block_size
        long_w, short_w = window_blocks, torch.clamp_min(window_blocks // 2, 1)
        if input_seq.is_cuda:
            return tuple(flex_block_masks(input_seq, [long_w, short_w], bs))
        return dense_window_mask(input_seq, long_w, bs), dense_window_mask(input_seq, short_w, bs)

    def hidden_states(self, input_seq, window_blocks, aux_losses=None):
        """Runs the blocks; returns the final residual, every layer's output, and the embedding the residual
        started from. Variants that train with an extra loss append it to aux_losses."""
        pat = self.pattern
        ve_all = [e(input_seq)[None] for e in self.value_embeds]
        long_mask, short_mask = self.masks(input_seq, window_blocks)
        embeds = self.embed_inputs(input_seq)
        x = x_embed = embeds[0]
        skip_w = self.scalar_slice("unet")
        scalars = self.block_scalars()
        skip_into = {dst: (j, src) for j, (src, dst) in enumerate(pat["unet_pairs"])}
        router = self.parts_mlp_router()
        outputs = []
        residuals = self.parts_residuals()
        for i, block in enumerate(self.blocks):
            x = self.parts_block_input(i, x, outputs, x_embed)
            skip = (skip_w[skip_into[i][0]], outputs[skip_into[i][1]]) if i in skip_into else None
            ve = ve_all[pat["ve_index"][i]] if pat["ve_index"][i] is not None else None
            mask = long_mask if i in pat["long_window_layers"] else short_mask
            if router is None:
                extra = self.parts_mlp_extra(i, outputs, x_embed, input_seq)
                x = self.run_block(i, block, x, embeds, ve, mask, scalars, skip=skip, mlp_extra=extra,
                                   augment=None if residuals is None else residuals(i))
            else:
                before_mlp = self.layer_before_mlp(i, block, StudyBlock.add_skip(x, skip), embeds, ve, mask, scalars)
                x = router(i, block, before_mlp)
            x = self.parts_block_output(i, x, outputs)
            outputs.append(x)
        if router is not None:
            router.finish(input_seq, window_blocks, aux_losses)
        return x, outputs, x_embed

    def head_input(self, x, outputs, x_embed, input_seq=None):
        return self.parts_head_input(norm(x), outputs, x_embed, input_seq)

    def block_scalars(self):
        """(block lambdas, value lambdas), each indexed by layer."""
        L = self.cfg.num_layers
        return self.scalar_slice("block").view(L, -1), self.scalar_slice("value").view(L, 2)

    def run_block(self, i, block, x, embeds, ve, mask, scalars, skip=None, mlp_extra=None, augment=None):
        lambdas, v_lambdas = scalars
        return block(x, *embeds, ve, mask, lambdas[i], v_lambdas[i], skip=skip, mlp_extra=mlp_extra,
                     augment=augment)

    def layer_before_mlp(self, i, block, x, embeds, ve, mask, scalars):
        """Everything before the MLP (for a part that routes the MLP itself)."""
        lambdas, v_lambdas = scalars
        return block.mix_and_attend(x, *embeds, ve, mask, lambdas[i], v_lambdas[i])

    def forward(self, input_seq, target_seq, window_blocks, **head_kwargs):
        """Mean cross-entropy of the next-token predictions of one sequence (batch size 1), plus the auxiliary
        losses a variant trains with. The track's head_loss(latents, target_seq, **head_kwargs) gives the first."""
        aux_losses = []
        x, outputs, x_embed = self.hidden_states(input_seq, window_blocks, aux_losses)
        loss = self.head(x, outputs, x_embed, input_seq, target_seq, **head_kwargs)
        for extra in aux_losses:
            loss = loss + extra
        return loss

    def head(self, x, outputs, x_embed, input_seq, target_seq, **head_kwargs):
        """The last region: the final norm, the parts' head_input hooks, the lm head and its loss."""
        return self.head_loss(self.head_input(x, outputs, x_embed, input_seq), target_seq, **head_kwargs)

    def compile_whole(self):
        """--compile on: the whole forward (and its backward) as one graph; returns the compiled module."""
        if self.routes_mlp():
            # Validation may route a data-dependent number of tokens through each MLP (nonzero): traced into the
            # graph with a size symbol instead of a graph break at it.
            import torch._dynamo.config as dynamo_config
            dynamo_config.capture_dynamic_output_shape_ops = True
        return torch.compile(self, dynamic=False)

    def compile_regions(self):
        """--compile regional: each block (with the U-net skip it receives) and the head (norm, head_input hooks,
        lm head, loss) compiled on their own, the glue between them (embeddings, masks) eager. Each region's backward
        is then its own autograd node, so a parameter's gradient is final, and its hook launches its average, as
        soon as its region's backward has run: the reductions overlap the backward of the regions below (a
        whole-model graph has one backward node and launches them all at its end). The blocks share one compiled
        code object; it compiles once per kind of block (attention or not, value embedding or not, a variant's
        per-layer form), training and eval."""
        import torch._dynamo.config as dynamo_config
        kinds_bound = 4 * len(self.blocks) + 8  # every block its own kind, train and eval, and margin
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, kinds_bound)
        dynamo_config.fail_on_recompile_limit_hit = True  # not a silent fall-back to eager blocks
        for block in self.blocks:
            if self.routes_mlp():  # a part routes each MLP itself, so a block's forward never runs
                block.mix_and_attend = torch.compile(block.mix_and_attend, dynamic=False)
                block.mlp.compile(dynamic=False)
            else:
                block.compile(dynamic=False)
        self.head = torch.compile(self.head, dynamic=False)

    def block_named_scalars(self):
        out = {}
        lambdas, v_lambdas = (t.tolist() for t in self.block_scalars())
        for i in range(self.cfg.num_layers):
            for letter, value in zip("abcdefgh", lambdas[i]):
                out[f"block{i}.{letter}"] = value
            if self.blocks[i].attn is not None:
                out[f"block{i}.v_self"], out[f"block{i}.v_embed"] = v_lambdas[i]
        return out

    def named_scalars(self):
        """Every learned scalar a study plots, under readable names."""
        out = {}
        for (src, dst), w in zip(self.pattern["unet_pairs"], self.scalar_slice("unet").tolist()):
            out[f"skip.L{src}->L{dst}"] = w
        out.update(self.block_named_scalars())
        out.update(self.parts_named_scalars())
        return out
