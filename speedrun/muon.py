"""Muon (Newton-Schulz orthogonalised momentum, owner-sharded across ranks) and the Snoo outer optimiser."""

import math

import torch
import torch.distributed as dist

# Per-iteration coefficients (the medium track's); the small track uses one constant triple five times.
NS5_COEFFS = ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
              (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012))


def newton_schulz5(g, dtype=torch.bfloat16, coeffs=NS5_COEFFS):
    """Approximately orthogonalises the last two dims of g (batched over leading dims), in bf16 (upstream)."""
    x = g.to(dtype)
    transposed = g.size(-2) > g.size(-1)
    if transposed:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for a, b, c in coeffs:
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


def muon_direction(grad, momentum, smoothed, mu, one_minus_mu, smoothing, ns_dtype, ns_coeffs):
    """One matrix's Nesterov momentum, NS5 and update smoothing, in place on momentum and smoothed. mu and
    1 - mu come as 0-d tensors: compiled, a changing momentum is then data, not a constant that recompiles."""
    momentum.lerp_(grad, one_minus_mu)
    update = newton_schulz5(grad.lerp(momentum, mu), ns_dtype, ns_coeffs).float()
    smoothed.mul_(smoothing).add_(update, alpha=1 - smoothing)


def owner_groups(matrices, world_size):
    """Muon's groups, in the order their gradients become final: the matrices by size (largest first), within a
    size in reverse forward order (`matrices` come in forward order), world_size at a time; rank j owns (reads the
    averaged gradient of, steps, and shares) each group's j-th matrix. A group of world_size matrices of one size
    is one reduce-scatter and one all-gather."""
    order = sorted(reversed(matrices), key=lambda p: p.numel(), reverse=True)
    return [order[i:i + world_size] for i in range(0, len(order), world_size)]


class Muon(torch.optim.Optimizer):
    """Muon with Nesterov momentum, NS5, update smoothing and decoupled weight decay.

    Parameters are grouped world_size at a time (owner_groups): each rank updates one and the group is
    all-gathered, so a parameter's state lives on its owning rank only. bf16 parameters are updated as if fp32 by
    keeping their low 16 bits in a separate buffer. Each group's all-gather is asynchronous and overlaps the next
    group's Newton-Schulz. compile_update=True compiles the per-matrix direction (momentum, NS5, smoothing) into
    fused kernels (for CUDA: on CPU the eager update is the bitwise reference).
    """

    def __init__(self, params_with_wd_mul, lr, weight_decay, momentum, smoothing=0.2, rank=0, world_size=1,
                 ns_dtype=torch.bfloat16, ns_coeffs=NS5_COEFFS, compile_update=False):
        params = [p for p, _ in params_with_wd_mul]
        super().__init__([dict(params=params)], dict(lr=lr, weight_decay=weight_decay, momentum=momentum))
        self.wd_mul = {p: m for p, m in params_with_wd_mul}
        self.lr_mul = {}  # per-parameter lr multipliers as 0-d tensors (DLO layer-wise rates); absent = 1
        self.smoothing, self.rank, self.world_size, self.ns_dtype = smoothing, rank, world_size, ns_dtype
        self.ns_coeffs = ns_coeffs
        self.direction = torch.compile(muon_direction, dynamic=False) if compile_update else muon_direction
        self.momentum_scalars = None  # [mu, 1 - mu] on the parameters' device, refilled each step (no host sync)
        # Checkpoints key each matrix's state by its place in this order (size, then the given order).
        self.ordered = sorted(params, key=lambda p: p.numel(), reverse=True)
        self.groups = owner_groups(params, world_size)
        self.owner_rank = {id(p): j for group in self.groups for j, p in enumerate(group)}
        # The parameter all-gathers run on their own process group (on CUDA: their own NCCL stream), so they
        # do not queue behind the gradient reductions still in flight on the default group (the embeddings').
        self.gather_group = dist.new_group() if world_size > 1 and dist.is_initialized() else None

    def owner(self, p):
        return self.owner_rank[id(p)]

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
    def step(self, wait_grads=None):
        """wait_grads(params), if given, is called before a gradient is read (a GradientReducer's wait)."""
        group = self.param_groups[0]
        lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
        ws = self.world_size
        if not self.ordered:
            return
        if self.momentum_scalars is None:
            self.momentum_scalars = torch.empty(2, device=self.ordered[0].device)
        self.momentum_scalars[0].fill_(mu)
        self.momentum_scalars[1].fill_(1 - mu)
        in_flight, shared_directions = [], []
        for group in self.groups:  # the order their gradients are reduced in
            share_direction = ws > 1 and self.direction_is_exact_in_ns_dtype(group)
            if self.rank < len(group):
                p = group[self.rank]
                if wait_grads is not None:
                    wait_grads([p])
                st = self._state(p)
                self.direction(p.grad.float(), st["momentum"], st["smoothed"], *self.momentum_scalars,
                               self.smoothing, self.ns_dtype, self.ns_coeffs)
                if not share_direction:
                    self._apply(p, st["smoothed"], lr, wd)
            if share_direction:  # every rank applies every matrix's (exactly representable) direction itself
                directions = [self.state[q]["smoothed"].to(self.ns_dtype) if j == self.rank
                              else torch.empty_like(q, dtype=self.ns_dtype) for j, q in enumerate(group)]
                shared_directions.append((self._exchange(directions), group, directions))
            elif ws > 1:
                in_flight += self._exchange([q.data for q in group])
        for works, group, directions in shared_directions:
            for work in works:
                work.wait()
            for q, d in zip(group, directions):
                self._apply(q, d.float(), lr, wd)
        for work in in_flight:
            work.wait()

    def direction_is_exact_in_ns_dtype(self, group):
        """fp32 matrices without update smoothing: the step's direction is the Newton-Schulz output, exact in its
        (narrower) dtype, so the group can share its directions in that dtype (bf16 on CUDA: half the bytes of
        the fp32 parameters) and every rank apply them. The owner applies the shared bf16 values too, so the ranks
        agree even where a compiled update keeps more bits than the bf16 output."""
        return (self.smoothing == 0 and self.ns_dtype.itemsize < 4
                and all(q.dtype == torch.float32 for q in group))

    def _apply(self, p, direction, lr, wd):
        """Decoupled weight decay and the step along `direction`, on p's full-precision value."""
        p_lr = lr * self.lr_mul.get(p, 1.0)  # a 0-d device tensor where a multiplier is set (no sync)
        scale = math.sqrt(max(1.0, p.size(-2) / p.size(-1)))
        value = p.data if p.dtype == torch.float32 else self.master_value(p)
        # Outside the compiled part: add's alpha must be a Python number, which torch.compile would specialise
        # on (a recompile at every lr change), and a tensor factor would round differently.
        if torch.is_tensor(p_lr):
            value.mul_(1 - p_lr * wd * self.wd_mul[p]).sub_(direction * (p_lr * scale))
        else:
            value.mul_(1 - p_lr * wd * self.wd_mul[p]).add_(direction, alpha=-p_lr * scale)
        self.write_master(p, value)

    def _exchange(self, tensors):
        """Launches the sharing of tensors[j], authoritative on rank j (the owner of position base+j), with every
        rank; returns the asynchronous works, which the caller waits on before reading the tensors."""
        if len({t.numel() for t in tensors}) == 1 and len({t.dtype for t in tensors}) == 1:
            flat = [t.view(-1) for t in tensors]
            flat += [torch.empty_like(flat[0]) for _ in range(self.world_size - len(tensors))]
            return [dist.all_gather(flat, flat[self.rank].clone(), group=self.gather_group, async_op=True)]
        return [dist.broadcast(t, j, group=self.gather_group, async_op=True) for j, t in enumerate(tensors)]

    def master_values(self):
        """{id(p): fp32 value} of every matrix on every rank: the bf16 parameter plus its owner's low bits."""
        lows, in_flight = {}, []
        for chunk in self.groups:  # chunk[j] is owned by rank j
            if all(p.dtype != torch.bfloat16 for p in chunk):
                continue  # fp32 matrices are their own masters: nothing to gather
            for p in chunk:
                st = self.state.get(p, {})
                owned = self.owner(p) == self.rank and "mantissa" in st
                lows[id(p)] = st["mantissa"].clone() if owned else torch.zeros_like(p, dtype=torch.int16)
            if self.world_size > 1:  # every group's gather in flight at once; same bits (gloo has no int16)
                in_flight += self._exchange([lows[id(p)].view(torch.bfloat16) for p in chunk])
        for work in in_flight:
            work.wait()
        return {id(p): fp32_from_bf16_parts(p.data, lows[id(p)]) if p.dtype == torch.bfloat16 else p.data.float()
                for p in self.ordered}

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
        # Multi-tensor (_foreach) kernels: a handful of launches for all parameters instead of a few per parameter.
        grads = torch._foreach_sub([self.stored(p, old) for p, old in zip(self.params, self.old)], self.read_all())
        if self.buf[0] is None:
            self.buf = [g.clone() for g in grads]
        else:
            torch._foreach_mul_(self.buf, self.momentum)
            torch._foreach_add_(self.buf, grads)
        torch._foreach_add_(grads, self.buf, alpha=self.momentum)  # Nesterov: grad + momentum * buf
        torch._foreach_sub_(self.old, grads, alpha=self.lr)
        for p, old in zip(self.params, self.old):
            self.write(p, old)
        return True

    def state_dict(self):
        return dict(old=[t.clone() for t in self.old], buf=[None if b is None else b.clone() for b in self.buf],
                    calls=self.calls)

    def load_state_dict(self, sd):
        dev = self.params[0].device
        self.old = [t.clone().to(dev) for t in sd["old"]]
        self.buf = [None if b is None else b.clone().to(dev) for b in sd["buf"]]
        self.calls = sd["calls"]

