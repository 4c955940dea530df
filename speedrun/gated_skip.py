"""Gated skip to the head (study flag --gated-skip-layer K): the head reads its usual input plus sigmoid(g) * out[K],
out[K] the output of layer K and g one learned scalar. g starts at GATE_INIT, so the gate opens from 0.018: the
model starts next to the baseline and learns how much of layer K the head should see.

Written only against the study interface (speedrun/study.py): a Study with its flag, check, model field and name,
and a ModelPart with its scalar and the head-input hook. docs/adding-a-study.md walks through it."""

import torch

from speedrun.errors import UsageError
from speedrun.study import Flag, ModelPart, Study

GATE_INIT = -4.0  # sigmoid(-4) = 0.018


def resolve(config, pattern):
    """--gated-skip-layer K: a layer whose output is not already the head's input (0..L-2)."""
    k, last = config.gated_skip_layer, config.num_layers - 1
    if k is not None and not 0 <= k < last:
        raise UsageError(f"--gated-skip-layer must be in 0..{last - 1} (layer {last} is the head's input "
                         f"already), got {k}")
    return {}


class GatedSkip(ModelPart):
    """The gate's scalar lives in the model's scalar vector (Adam's scalar group, counted in added_params)."""

    def __init__(self, model, cfg):
        super().__init__()
        self.layer = cfg.gated_skip_layer
        model.add_scalars("gated_skip", torch.tensor([GATE_INIT]))

    def gate(self, model):
        return torch.sigmoid(model.scalar_slice("gated_skip")[0])

    def head_input(self, model, head_in, outputs, x_embed, input_seq):
        return head_in + self.gate(model).type_as(head_in) * outputs[self.layer]

    def named_scalars(self, model):
        return {"gated_skip.gate": self.gate(model).item()}


GATED_SKIP = Study(
    name="gated-skip", title="gated skip (speedrun/gated_skip.py)",
    flags=(Flag("--gated-skip-layer", "the head also reads sigmoid(g) * out[K], g learned (the gate starts at "
                                      "0.018)", resume=True, kind=int, options=dict(type=int, metavar="K")),),
    resolve=resolve,  # the flag is also the model field gated_skip_layer (default None: off), copied when given
    variant_name=lambda config: f"gated-skip-L{config.gated_skip_layer}",
    model_part=GatedSkip,
    excludes=("--dlo-groups",), excludes_why="layer indices of a DLO-expanded model are not the checkpoint's",
)
