"""Record #18's optimisers in plain torch (its Triton kernels and torch.compile regions become the same torch
ops, in the same order, so a CPU run follows the record's eager maths bit for bit).

- NorMuon on the hidden matrices and gates: Nesterov momentum, Polar Express orthogonalisation (bf16), NorMuon's
  per-row (or per-column) second-moment normalisation that keeps the update's norm, cautious weight decay, and an
  lr factor sqrt(max(1, rows/cols)) from the parameter's shape. Attention weights (q, k, v, o stacked as one
  [4*dim, dim] matrix) are orthogonalised as four square matrices. Parameters are grouped as the record does on 8
  GPUs (gates, value-embedding gates, attention, MLP of blocks 0-7, MLP of blocks 8-15) at every world size: rank
  r steps the r-th slice of each group after one reduce-scatter and shares it by one all-gather.
- Adam (bf16 moments, cautious weight decay scaled by lr^2 as the record does) on the head, embeddings, gates of
  the smear/skips and the scalars; it steps on odd steps only, on the sum of the two steps' gradients (they are not
  cleared after even steps). Sharded as the record: rank r steps (and keeps the moments of) the r-th 1/world_size
  of each large parameter's rows, then shares them by an all-gather (see OddStepAdam).

The arithmetic of both steps (Polar Express, the variance normalisation, the cautious update, Adam's update) runs
eager, or compiled as #18 compiles it (`StepArithmetic`: each function fullgraph, dynamic=False, so one
graph per shape and none per step: the values that change with the step reach it as 0-d tensors).
"""

import torch
import torch.distributed as dist

from speedrun.r18.studies import STUDY_MATRIX_LABEL

from speedrun.r18.schedule import R18Schedule

# Polar Express (Amsel et al. 2025) coefficients, 5 iterations, safety factor 2e-2, cushion 2.
POLAR_EXPRESS_COEFFS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)

ADAM_LABELS = ("lm_head", "value_embed", "smear_gate", "skip_gate", "x0_lambdas", "embed2", "embed")
SCALAR_LABELS = ("scalars",)
MUON_LABELS = ("attn_gate", "value_embed_gate", "attn", "mlp", STUDY_MATRIX_LABEL)
# The record's 8-GPU grouping: (label, how many of that label's parameters, in model order). 16 MLP matrices
# per group so a rank never holds both attention and MLP matrices.
MUON_GROUPS = (("attn_gate", None), ("value_embed_gate", None), ("attn", None), ("mlp", 16), ("mlp", None))


def polar_express(g, split_last_product=False):
    """Approximate orthogonal factor of g's last two dims (batched over leading dims), in bf16.
    split_last_product: x_next = B @ x + a*x as a product then an add (the record does this for the MLP
    matrices; rounding differs from the fused form)."""
    x = g.bfloat16()
    transposed = g.size(-2) > g.size(-1)
    if transposed:
        x = x.mT
    x = (x / (x.norm(dim=(-2, -1), keepdim=True) * (1 + 2e-2) + 1e-6)).contiguous()
    fused_product_add = torch.baddbmm if x.ndim > 2 else torch.addmm
    for a, b, c in POLAR_EXPRESS_COEFFS:
        gram = x @ x.mT
        poly = fused_product_add(gram, gram, gram, beta=b, alpha=c)  # b*A + c*A@A
        x = (poly @ x).add_(x, alpha=a) if split_last_product else fused_product_add(x, poly, x, beta=a)
    return x.mT if transposed else x


def normalise_variance(v, second_moment, beta2, reduce_dim):
    """NorMuon: divide each row (reduce_dim -1) or column of v by the root of its running mean square, then
    rescale so v keeps its Frobenius norm. Updates second_moment in place."""
    mean_square = v.float().square().mean(dim=reduce_dim, keepdim=True)
    n = v.size(reduce_dim)
    norm_before = (mean_square.sum(dim=(-2, -1), keepdim=True) * n).sqrt()
    second_moment.lerp_(mean_square.to(second_moment.dtype), 1 - beta2)
    inverse_rms = second_moment.clamp_min(1e-10).rsqrt()
    norm_after = ((mean_square * n) * inverse_rms.float().square()).sum(dim=(-2, -1), keepdim=True).sqrt()
    return v * (inverse_rms * (norm_before / norm_after.clamp_min(1e-10))).type_as(v)


def cautious_update_(p, v, weight_decay, lr):
    """p -= lr*v, decaying only the coordinates where the update agrees in sign with p (>= 0, as the record)."""
    agrees = (v * p) >= 0
    wd, lr = weight_decay.to(p.dtype), lr.to(p.dtype)
    p.copy_(p - p * agrees * wd * lr - v * lr)


def adam_update_(rows, g, exp_avg, exp_avg_sq, beta1, beta2, eps, step_size, decay):
    """One Adam step of `rows` (in place) by its gradient g: bf16 moments, the bias-corrected step_size, cautious
    weight decay `decay` (lr^2 * wd * wd_mul) where the update agrees in sign with the parameter (> 0).
    step_size and decay are numbers (eager) or 0-d float32 tensors (compiled: a number would be a constant of the
    graph, so each step's value would compile a new one); eager, both give the record's rounding (bitwise)."""
    exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    update = exp_avg.div(exp_avg_sq.sqrt().add_(eps)).mul_(step_size)
    agrees = (update * rows) > 0
    if isinstance(decay, torch.Tensor):  # addcmul's value= takes numbers only: the same sum, in fp32, rounded once
        update.copy_(update.float() + decay * (rows.float() * agrees))
    else:
        update.addcmul_(rows, agrees, value=decay)
    rows.add_(update, alpha=-1.0)


class StepArithmetic:
    """The optimisers' arithmetic: eager, or each function compiled as #18 compiles them (fullgraph, dynamic=False;
    `backend` None: torch.compile's default, inductor). The numbers that change with the step are handed over as
    0-d tensors when compiled (`scalar`), so the schedule's steps reuse the graphs of the first even and odd step."""

    def __init__(self, compiled=False, backend=None):
        self.compiled = compiled
        options = dict(dynamic=False, fullgraph=True, **({"backend": backend} if backend else {}))
        self.polar_express, self.normalise_variance, self.cautious_update_, self.adam_update_ = (
            torch.compile(f, **options) if compiled else f
            for f in (polar_express, normalise_variance, cautious_update_, adam_update_))

    def scalar(self, value):
        return torch.tensor(value, dtype=torch.float32) if self.compiled else value


def shape_lr_factor(p):
    """sqrt(rows/cols) for matrices with more rows (inputs along rows) than columns, else 1."""
    return max(1.0, p.shape[-2] / p.shape[-1]) ** 0.5 if p.ndim >= 2 else 1.0


def average_across_ranks(tensors):
    """All-reduce average; gloo has no AVG, so it sums and divides."""
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    if world_size == 1:
        return
    backend_averages = dist.get_backend() == "nccl"
    for t in tensors:
        dist.all_reduce(t, op=dist.ReduceOp.AVG if backend_averages else dist.ReduceOp.SUM)
        if not backend_averages:
            t.div_(world_size)


def average_rows_across_ranks(full, world_size):
    """Reduce-scatter average of `full` (its first dim a multiple of world_size): this rank's 1/world_size of its
    rows, averaged over the ranks (gloo has no AVG: summed, then divided)."""
    mine = full.new_empty((full.size(0) // world_size, *full.shape[1:]))
    nccl = dist.get_backend() == "nccl"
    dist.reduce_scatter_tensor(mine, full.contiguous(), op=dist.ReduceOp.AVG if nccl else dist.ReduceOp.SUM)
    return mine if nccl else mine.div_(world_size)


def gather_rows_from_ranks(mine, world_size):
    """All-gather: every rank's `mine`, stacked along the first dim in rank order."""
    full = mine.new_empty((mine.size(0) * world_size, *mine.shape[1:]))
    dist.all_gather_into_tensor(full, mine.contiguous())
    return full


def muon_groups(params):
    """MUON_GROUPS applied to `params` (each carries .label), in model order within a label."""
    by_label = {label: [p for p in params if p.label == label] for label in MUON_LABELS}
    unknown = [p.label for p in params if p.label not in MUON_LABELS]
    if unknown:
        raise ValueError(f"NorMuon got parameters labelled {sorted(set(unknown))}")
    groups = []
    for label, count in MUON_GROUPS:
        members = by_label[label][:count] if count else by_label[label]
        by_label[label] = by_label[label][len(members):]
        if members:
            groups.append(members)
    # Matrices a study adds (speedrun.r18.studies): one group per shape, in model order, after the record's.
    by_shape = {}
    for p in by_label[STUDY_MATRIX_LABEL]:
        by_shape.setdefault(tuple(p.shape), []).append(p)
    return groups + list(by_shape.values())


class NorMuon(torch.optim.Optimizer):
    """State per parameter on the rank that steps it: momentum (Nesterov) and the NorMuon second moment."""

    def __init__(self, params, lr=0.015, weight_decay=1.2, momentum=0.95, beta2=0.95, arithmetic=StepArithmetic()):
        params = list(params)
        self.arithmetic = arithmetic
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        groups = [dict(params=members) for members in muon_groups(params)]
        super().__init__(groups, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, beta2=beta2))
        self.lr_mul = {}  # per-parameter lr (and decay) multipliers, 0-d tensors: DLO's layer-wise rates; absent = 1

    def _my_slice(self, group):
        chunk = -(-len(group["params"]) // self.world_size)
        return chunk, group["params"][self.rank * chunk:(self.rank + 1) * chunk]

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            chunk, mine = self._my_slice(group)
            grads = self._reduce_scatter(group["params"], chunk)
            if mine:
                self._update(group, mine, grads[:len(mine)])
            self._all_gather(group["params"], chunk)

    def _reduce_scatter(self, params, chunk):
        """Stacked gradients averaged across ranks; this rank's `chunk` rows (zero-padded past the end)."""
        stacked = torch.zeros((chunk * self.world_size, *params[0].shape), dtype=params[0].dtype,
                              device=params[0].device)
        for i, p in enumerate(params):
            stacked[i].copy_(p.grad)
        return stacked if self.world_size == 1 else average_rows_across_ranks(stacked, self.world_size)

    def _all_gather(self, params, chunk):
        if self.world_size == 1:
            return
        mine = torch.zeros((chunk, *params[0].shape), dtype=params[0].dtype, device=params[0].device)
        for i, p in enumerate(params[self.rank * chunk:(self.rank + 1) * chunk]):
            mine[i].copy_(p)
        gathered = gather_rows_from_ranks(mine, self.world_size)
        for i, p in enumerate(params):
            p.copy_(gathered[i])

    def _update(self, group, params, grads):
        label, shape = params[0].label, params[0].shape
        is_gate = "gate" in label
        state = self.state[params[0]]  # the slice's state lives with its first parameter
        if "momentum" not in state:
            state["momentum"] = torch.zeros_like(grads)
        state["momentum"].lerp_(grads, 1 - group["momentum"])
        v = grads.lerp_(state["momentum"], group["momentum"])
        if label == "attn":  # q, k, v, o as four square matrices
            v = v.view(4 * v.size(0), shape[-2] // 4, shape[-1])
        elif v.ndim > 3:  # a study's stack of matrices (LAuReL's factors): each one orthogonalised
            v = v.flatten(0, -3)
        rows_at_least_cols = shape[-2] >= shape[-1]
        reduce_dim = -1 if is_gate or rows_at_least_cols else -2
        if "second_moment" not in state:
            state["second_moment"] = torch.zeros_like(v[..., :, :1] if reduce_dim == -1 else v[..., :1, :])
        v = self.arithmetic.polar_express(v, split_last_product=label == "mlp")
        v = self.arithmetic.normalise_variance(v, state["second_moment"], group["beta2"], reduce_dim).view(grads.shape)
        lr_factors = torch.tensor([shape_lr_factor(p) * p.lr_mul for p in params], dtype=torch.float32)
        wd_factors = torch.tensor([p.wd_mul for p in params], dtype=torch.float32)
        lrs, wds = lr_factors * group["lr"], wd_factors * group["weight_decay"] * group["lr"]
        for i, p in enumerate(params):
            scale = self.lr_mul.get(p)
            self.arithmetic.cautious_update_(p, v[i], wds[i] if scale is None else wds[i] * scale,
                             lrs[i] if scale is None else lrs[i] * scale)


# As the record: a parameter below this many elements is all-reduced and stepped whole on every rank (its state
# is tiny; a reduce-scatter per vector would cost more launches than it saves).
SHARD_MIN_NUMEL = 1024


def adam_shards_rows(p, world_size):
    """Whether OddStepAdam splits p's rows over the ranks (else p is all-reduced and stepped whole on each)."""
    return world_size > 1 and p.numel() >= SHARD_MIN_NUMEL and p.size(0) % world_size == 0


class OddStepAdam(torch.optim.Optimizer):
    """#18's Adam: bf16 moments, bias correction, cautious weight decay lr^2 * wd * wd_mul on coordinates whose
    update agrees in sign with the parameter (> 0). Parameters without a gradient are skipped (their step count
    stays).

    Sharded over ranks (#18's DistAdam): a parameter with at least SHARD_MIN_NUMEL elements whose first dim divides
    by the world size is reduce-scattered (gradient averaged), rank r steps rows [r*n/w, (r+1)*n/w) with the
    moments of those rows only, and the rows are all-gathered; any other parameter is all-reduced and stepped
    whole on every rank, with full moments. The collectives run at step time, one parameter after another: a
    reduce-scatter plus an all-gather moves the bytes of the all-reduce it replaces; the record launches its
    reduce-scatters from backward hooks to overlap them with the last backward, which matters only on GPUs."""

    def __init__(self, params, labels, lr, betas, eps=1e-8, weight_decay=0.005, arithmetic=StepArithmetic()):
        params = list(params)
        self.arithmetic = arithmetic
        groups = [dict(params=[p for p in params if p.label == label]) for label in labels]
        super().__init__([g for g in groups if g["params"]], dict(lr=lr, betas=betas, eps=eps,
                                                                  weight_decay=weight_decay))
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.sharded = {p for p in params if adam_shards_rows(p, self.world_size)}
        for p in params:
            mine = self.my_rows(p)
            self.state[p] = dict(step=0, exp_avg=torch.zeros_like(mine, dtype=torch.bfloat16),
                                 exp_avg_sq=torch.zeros_like(mine, dtype=torch.bfloat16))

    def my_rows(self, p, full=None):
        """This rank's rows of `full` (a tensor shaped like p; p itself by default): all of them when p is not
        sharded. A view: writing to it writes to `full`."""
        full = p if full is None else full
        if p not in self.sharded:
            return full
        rows = p.size(0) // self.world_size
        return full[self.rank * rows:(self.rank + 1) * rows]

    @torch.no_grad()
    def step(self):
        stepped = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        average_across_ranks([p.grad for p in stepped if p not in self.sharded])
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p in self.sharded:
                    grad = average_rows_across_ranks(p.grad, self.world_size)
                    self._update(p, self.my_rows(p), grad, group["lr"] * p.lr_mul, beta1, beta2, group)
                    p.copy_(gather_rows_from_ranks(self.my_rows(p), self.world_size))
                else:
                    self._update(p, p, p.grad, group["lr"] * p.lr_mul, beta1, beta2, group)

    def _update(self, p, rows, g, lr, beta1, beta2, group):
        """Steps `rows` (p or this rank's rows of it, a view) by g, its gradient, with p's state."""
        state = self.state[p]
        state["step"] += 1
        t = state["step"]
        step_size = lr * ((1 - beta2 ** t) ** 0.5 / (1 - beta1 ** t))
        decay = lr * group["weight_decay"] * p.wd_mul * lr
        scalar = self.arithmetic.scalar
        self.arithmetic.adam_update_(rows, g, state["exp_avg"], state["exp_avg_sq"], beta1, beta2, group["eps"],
                                     scalar(step_size), scalar(decay))

    def merged_state_dict(self):
        """state_dict() with every moment whole (a sharded parameter's rows gathered from all ranks), so it loads
        at any world size. Every rank must call it; only rank 0's copy is whole (the others keep their rows)."""
        saved = self.state_dict()
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in enumerate(params):
            if p in self.sharded:
                state = dict(saved["state"][i])  # a new dict: state_dict() hands out the live ones
                for key in ("exp_avg", "exp_avg_sq"):
                    full = gather_rows_from_ranks(state[key], self.world_size)
                    # on the host: the whole moments of every table (1.5 GiB at the full preset) stay off the GPU
                    state[key] = full.cpu() if self.rank == 0 else state[key]
                saved["state"][i] = state
        return saved

    def load_state_dict(self, state_dict):
        """Loads whole moments (merged_state_dict's, or a replicated run's from before the sharding) and keeps this
        rank's rows. torch casts loaded moments to each parameter's dtype; #18 keeps them in bf16 (exact: saved as
        bf16)."""
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in enumerate(params):
            saved = state_dict["state"].get(i)
            if saved is not None and saved["exp_avg"].shape != p.shape:
                raise ValueError(f"Adam state of parameter {i} ({p.label}) has shape {tuple(saved['exp_avg'].shape)}, "
                                 f"the parameter {tuple(p.shape)}: not a whole-moment state")
        super().load_state_dict(state_dict)
        for p, state in self.state.items():
            for key in ("exp_avg", "exp_avg_sq"):
                state[key] = self.my_rows(p, state[key]).to(torch.bfloat16).clone()

    def copy_state(self, source, target):
        self.state[target] = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in self.state[source].items()}


class R18Optimizers:
    """The record's three optimisers and when they step: NorMuon every step, the two Adams on odd steps (their
    gradients are kept across the even step, so they see both steps' sum), lr x schedule.lr(step), NorMuon's
    momentum from the schedule, and the untying of the embedding from the head after schedule.split_step."""

    def __init__(self, model, schedule: R18Schedule, compiled=False, backend=None):
        """compiled: the steps' arithmetic compiled as #18 compiles it (by torch.compile's `backend`, None: its
        default); else eager."""
        self.model, self.schedule = model, schedule
        arithmetic = StepArithmetic(compiled, backend)
        params = list(model.parameters())
        missing = {getattr(p, "label", None) for p in params} - set(ADAM_LABELS + SCALAR_LABELS + MUON_LABELS)
        if missing:
            raise ValueError(f"parameters without an r18 optimiser label: {sorted(map(str, missing))}")
        self.adam = OddStepAdam([p for p in params if p.label in ADAM_LABELS], ADAM_LABELS, lr=0.004,
                                betas=(0.8, 0.95), weight_decay=0.005, arithmetic=arithmetic)
        self.scalar_adam = OddStepAdam([p for p in params if p.label in SCALAR_LABELS], SCALAR_LABELS, lr=0.008,
                                       betas=(0.9, 0.99), weight_decay=0.005, arithmetic=arithmetic)
        self.muon = NorMuon([p for p in params if p.label in MUON_LABELS], lr=0.015, weight_decay=1.2,
                            momentum=0.95, beta2=0.95, arithmetic=arithmetic)
        self.all = (self.adam, self.scalar_adam, self.muon)
        if compiled:
            import torch._dynamo.config as dynamo_config
            # each compiled function meets one shape per group or parameter it steps, all in the first two steps
            dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, self.most_shapes_per_function())
        for opt in self.all:
            for group in opt.param_groups:
                group["initial_lr"] = group["lr"]

    def most_shapes_per_function(self):
        """The most input shapes one of the compiled step functions meets: Polar Express and the variance
        normalisation one per NorMuon group, the cautious update one per matrix shape, Adam one per (shape of the
        rows a rank steps, dtype)."""
        muon_shapes = {tuple(p.shape) for g in self.muon.param_groups for p in g["params"]}
        adam_shapes = {(tuple(opt.my_rows(p).shape), p.dtype) for opt in (self.adam, self.scalar_adam)
                       for g in opt.param_groups for p in g["params"]}
        return max(len(self.muon.param_groups), len(muon_shapes), len(adam_shapes))

    @staticmethod
    def adam_steps_at(step):
        return step % 2 == 1

    def step(self, step):
        lr_multiplier = self.schedule.lr(step)
        for group in self.muon.param_groups:
            group["momentum"] = self.schedule.muon_momentum(step)
        active = self.all if self.adam_steps_at(step) else (self.muon,)
        for opt in active:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * lr_multiplier
            opt.step()
            opt.zero_grad(set_to_none=True)
        if step == self.schedule.split_step:
            self.untie_embedding()

    @torch.no_grad()
    def untie_embedding(self):
        """From now on `embed` is its own table: a copy of the head, with the head's Adam state."""
        self.adam.copy_state(self.model.lm_head.weight, self.model.embed.weight)
        self.model.embed.weight.copy_(self.model.lm_head.weight)
        self.model.split_embed = True
