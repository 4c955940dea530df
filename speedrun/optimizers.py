"""The optimiser set both tracks use: Muon on the hidden matrices, Adam on head / embeddings / scalars, optionally
Snoo around everything; the lr schedule (constant, then linear cooldown) and Muon's momentum warm-up. A track
subclasses TrackOptimizers and sets its numbers as class attributes."""

import torch
import torch.distributed as dist

from speedrun.distributed import GradientReducer, ReductionBucket, can_shard, slice_of
from speedrun.muon import Muon, Snoo


def lr_factor(step, num_iterations, cooldown_frac=0.7, floor=0.01):
    """1 until the last `cooldown_frac` of the steps, then linear down to `floor` at the end."""
    x = step / num_iterations
    return 1.0 if x < 1 - cooldown_frac else (1 - x) / cooldown_frac * (1 - floor) + floor


def muon_momentum(step, warmup_steps=300):
    frac = min(step / warmup_steps, 1)
    return (1 - frac) * 0.85 + frac * 0.95


def adam_params(bucket):
    """What Adam steps for a bucket: each rank's slices of a sharded one, else its parameters."""
    return bucket.shards if bucket.kind == "shard" else bucket.params


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
        muon_ids = {id(p) for p, _ in matrices}
        embed = model.embedding_params()
        head_and_embed = {id(p) for p in embed + [model.lm_head_w]}
        scalar = [p for p in model.parameters() if id(p) not in muon_ids and id(p) not in head_and_embed]
        self.world_size = world_size
        # The reductions' fixed order (reverse forward): the head, Muon's groups (owner only), the embeddings,
        # then the rest (the scalar vector and study vectors, read by every layer). The head's and embeddings'
        # gradients are reduce-scattered and Adam steps each rank's slice only (then all-gathered): the same
        # bytes on the wire as an all-reduce, 1/world_size of Adam's memory traffic and state.
        def sharded(params):
            return ReductionBucket("shard" if all(can_shard(p, world_size) for p in params) else "all",
                                   params, rank, world_size)
        self.head_bucket, self.embed_bucket = sharded([model.lm_head_w]), sharded(embed)
        buckets = ([self.head_bucket] + [ReductionBucket("owner", g, rank, world_size) for g in self.muon.groups]
                   + [self.embed_bucket, ReductionBucket("all", scalar)])
        self.reducer = GradientReducer([b for b in buckets if b.params], world_size)
        groups = dict(head=adam_params(self.head_bucket), embed=adam_params(self.embed_bucket), scalar=scalar)
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
        # In the reductions' order. A sharded group's all-gather follows its slice's step on the default group
        # (behind the reductions, which it must follow anyway); Muon's gathers run on their own group.
        gathers = self.step_adam_group("head")
        self.muon.step(wait_grads=self.reducer.wait)
        gathers += self.step_adam_group("embed")
        self.step_adam_group("scalar")
        self.reducer.wait_all()  # any reduction not consumed above (none today) completes before grads are freed
        for work in gathers:
            work.wait()
        if self.snoo is not None:
            self.snoo.step()
        self.model.zero_grad(set_to_none=True)
        for bucket in (self.head_bucket, self.embed_bucket):
            if bucket.kind == "shard":
                for shard in bucket.shards:
                    shard.grad = None

    def step_adam_group(self, name):
        """Adam on one parameter group, once its gradients' averages are ready; returns the launched all-gathers
        of a sharded group's parameters. torch's Adam keeps its state per parameter, so stepping the groups one
        at a time computes exactly what one step of all of them does."""
        groups = [g for g in self.adam.param_groups if g["name"] == name]
        if not groups:
            return []
        bucket = dict(head=self.head_bucket, embed=self.embed_bucket).get(name)
        self.reducer.wait(bucket.params if bucket is not None else groups[0]["params"])
        every_group = self.adam.param_groups
        self.adam.param_groups = groups
        try:
            self.adam.step()
        finally:
            self.adam.param_groups = every_group
        if bucket is None or bucket.kind != "shard" or self.world_size == 1:
            return []
        return [dist.all_gather_into_tensor(p.data.view(-1), shard.data, async_op=True)
                for p, shard in zip(bucket.params, bucket.shards)]

    def state_dict(self, gather_muon=None):
        """gather_muon(local Muon state) -> merged state: a checkpoint's full state, in the same layout whatever
        the world size (Adam's sharded states gathered to full tensors). Without it (the kernel warm-up's save
        and restore): this rank's own state, no collective."""
        adam = self.adam.state_dict()
        if gather_muon is not None:
            adam = self.adam_state_full(adam)
        state = dict(adam=adam, muon=(gather_muon or (lambda local: local))(self.muon.full_state()),
                     adam_local=gather_muon is None)
        if self.snoo is not None:
            state["snoo"] = self.snoo.state_dict()
        return state

    def sharded_positions(self):
        """{index of a parameter in Adam's state dict: (bucket, index in the bucket)} of Adam's sharded slices."""
        index = {id(p): i for i, p in enumerate(p for g in self.adam.param_groups for p in g["params"])}
        return {index[id(s)]: (b, k) for b in (self.head_bucket, self.embed_bucket) if b.kind == "shard"
                and self.world_size > 1 for k, s in enumerate(b.shards)}

    def adam_state_full(self, adam):
        for i, (bucket, k) in self.sharded_positions().items():
            st, p = adam["state"].get(i), bucket.params[k]
            if st is None:
                continue
            st = adam["state"][i] = dict(st)  # state_dict() hands out the live per-parameter dicts
            for name in ("exp_avg", "exp_avg_sq"):
                full = st[name].new_empty(p.numel())
                dist.all_gather_into_tensor(full, st[name].contiguous())
                st[name] = full.view_as(p)
        return adam

    def load_state_dict(self, sd):
        adam = sd["adam"]
        if not sd.get("adam_local"):  # a checkpoint's full state: this rank's slices
            adam = dict(adam, state=dict(adam["state"]))
            for i, (bucket, k) in self.sharded_positions().items():
                if i in adam["state"]:
                    p, cut = bucket.params[k], slice_of(bucket.params[k], bucket.rank, self.world_size)
                    adam["state"][i] = {n: v.reshape(-1)[cut].clone() if torch.is_tensor(v) and v.numel() == p.numel()
                                        else v for n, v in adam["state"][i].items()}
        self.adam.load_state_dict(adam)
        self.muon.load_full_state(sd["muon"])
        if self.snoo is not None:
            self.snoo.load_state_dict(sd["snoo"])
