"""The optimiser set both tracks use: Muon on the hidden matrices, Adam on head / embeddings / scalars, optionally
Snoo around everything; the lr schedule (constant, then linear cooldown) and Muon's momentum warm-up. A track
subclasses TrackOptimizers and sets its numbers as class attributes."""

import torch

from speedrun.distributed import GradientReducer
from speedrun.muon import Muon, Snoo


def lr_factor(step, num_iterations, cooldown_frac=0.7, floor=0.01):
    """1 until the last `cooldown_frac` of the steps, then linear down to `floor` at the end."""
    x = step / num_iterations
    return 1.0 if x < 1 - cooldown_frac else (1 - x) / cooldown_frac * (1 - floor) + floor


def muon_momentum(step, warmup_steps=300):
    frac = min(step / warmup_steps, 1)
    return (1 - frac) * 0.85 + frac * 0.95


class TrackOptimizers:
    """A subclass sets MUON_LR, MUON_WD, MUON_SMOOTHING (0: none), NS_COEFFS (the five NS5 (a, b, c) triples),
    ADAM_LRS (head, embed, scalar), COOLDOWN_FRAC, LR_FLOOR (see lr_factor) and USE_SNOO.

    `reducer` averages the gradients across ranks: train_step launches the averages during the last backward, and
    step() waits on each parameter's average just before that parameter is stepped."""

    def __init__(self, model, rank, world_size, fused_adam, ns_dtype=torch.bfloat16, compile_muon=False):
        self.model = model
        matrices = model.matrix_params()
        self.muon = Muon(matrices, lr=self.MUON_LR, weight_decay=self.MUON_WD, momentum=0.95,
                         smoothing=self.MUON_SMOOTHING, rank=rank, world_size=world_size, ns_dtype=ns_dtype,
                         ns_coeffs=self.NS_COEFFS, compile_update=compile_muon)
        # Only a matrix's owner reads its gradient (the others receive the updated matrix from it).
        self.reducer = GradientReducer(model.parameters(), world_size, rank=rank,
                                       owners={id(p): self.muon.owner(p) for p, _ in matrices})
        muon_ids = {id(p) for p, _ in matrices}
        embed = model.embedding_params()
        groups = dict(head=[model.lm_head_w], embed=embed,
                      scalar=[p for p in model.parameters()
                              if id(p) not in muon_ids and all(p is not q for q in embed + [model.lm_head_w])])
        adam_groups = [dict(params=ps, lr=self.ADAM_LRS[name], initial_lr=self.ADAM_LRS[name], name=name)
                       for name, ps in groups.items() if ps]
        self.adam = torch.optim.Adam(adam_groups, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.0,
                                     fused=fused_adam)
        self.snoo = self.make_snoo(model, muon_ids) if self.USE_SNOO else None

    def make_snoo(self, model, muon_ids):
        params = list(model.parameters())

        def read_all():
            masters = self.muon.master_values()
            return [masters[id(p)] if id(p) in muon_ids else p.detach().float() for p in params]

        # Muon matrices are compared at full precision (exact fp32 masters); others as their dtype holds them.
        return Snoo(params, read_all=read_all,
                    write=lambda p, v: self.muon.write_master(p, v) if id(p) in muon_ids else p.data.copy_(v),
                    stored=lambda p, v: v if id(p) in muon_ids else v.to(p.dtype).float())

    def step(self, step, num_iterations):
        factor = lr_factor(step, num_iterations, self.COOLDOWN_FRAC, self.LR_FLOOR)
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
        if self.snoo is not None:
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
        state = dict(adam=self.adam.state_dict(), muon=gather_muon(self.muon.full_state()))
        if self.snoo is not None:
            state["snoo"] = self.snoo.state_dict()
        return state

    def load_state_dict(self, sd):
        self.adam.load_state_dict(sd["adam"])
        self.muon.load_full_state(sd["muon"])
        if self.snoo is not None:
            self.snoo.load_state_dict(sd["snoo"])
