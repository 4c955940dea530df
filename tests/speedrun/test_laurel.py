"""LAuReL flags of train_gpt_medium.py: equations, parameter counts, init, memory, optimiser, errors, log."""
import gc
import json
import math
import sys
import types
import weakref

import pytest
import torch

from conftest import ROOT, launch_script

sys.path.insert(0, str(ROOT))
import train_gpt_medium as tgm  # noqa: E402
from speedrun.laurel import LAUREL, LaurelPass, LaurelResiduals, laurel_rw_weights

TINY = ["--preset", "tiny"]

# (flags, description) for every variant and form the study can ask for
VARIANT_FLAGS = [
    ["--laurel", "rw"],
    ["--laurel", "rw", "--laurel-rw-form", "sigmoid"],
    ["--laurel", "rw", "--laurel-rw-form", "single"],
    ["--laurel", "rw", "--laurel-rw-form", "vector"],
    ["--laurel", "lr"],
    ["--laurel", "pa"],
    ["--laurel", "pa", "--laurel-pa-h", "lowrank", "--laurel-rank", "4"],
    ["--laurel", "rw+lr", "--laurel-rank", "8"],
    ["--laurel", "rw+pa", "--laurel-k", "2"],
    ["--laurel", "rw+pa", "--laurel-pa-h", "lowrank", "--laurel-rw-form", "single"],
    ["--laurel", "rw+lr+pa", "--laurel-rw-form", "vector", "--laurel-rank", "4"],
    ["--laurel", "rw+lr+pa", "--laurel-pa-h", "lowrank-shared", "--laurel-rank", "4"],
    ["--laurel", "pa", "--laurel-pa-h", "lowrank-shared", "--laurel-zero-factor", "down"],
    ["--laurel", "lr", "--laurel-factor-init", "xavier", "--laurel-zero-factor", "down"],
]
WHERE_FLAGS = [[], ["--laurel-where", "attn"], ["--laurel-where", "both", "--laurel-layers", "1,2,4"],
               ["--laurel-where", "block"]]


def build(argv, seed=0):
    args = tgm.resolve_args(TINY + argv)
    torch.manual_seed(seed)
    return tgm.GPT(tgm.model_config(args), max_seq_len=128), args


def randomise_baseline_weights(model, seed):
    """Non-zero values for every baseline matrix (the zero-initialised heads make any init loss trivial)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith("study") and name != "scalars":
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.size(-1)))


def tokens(seed, n=64):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2000, (n,), generator=gen), torch.randint(0, 2000, (n,), generator=gen)


# ---------------------------------------------------------------------------------------------------------------
# Reference implementation: the paper's equations written out with plain loops over tokens and dimensions.

def ref_sigmoid(v):
    return 1 / (1 + math.exp(-v))


def ref_rw(raw, form, scale):
    """(alpha, beta) for one site; lists of D values for the vector form."""
    if form == "softmax":
        ea, eb = math.exp(raw[0]), math.exp(raw[1])
        return scale * ea / (ea + eb), scale * eb / (ea + eb)
    if form == "sigmoid":
        return scale * ref_sigmoid(raw[0]), scale * ref_sigmoid(raw[1])
    if form == "single":
        s = ref_sigmoid(raw[0])
        return scale * s, scale * (1 - s)
    return [scale * ref_sigmoid(v) for v in raw[0]], [scale * ref_sigmoid(v) for v in raw[1]]


def ref_low_rank(down, up, vec):
    """B A x with A the D->r down-projection (down[j][i]) and B the r->D up-projection (up[d][j])."""
    rank, dim = len(down), len(vec)
    hidden = [sum(down[j][i] * vec[i] for i in range(dim)) for j in range(rank)]
    return [sum(up[d][j] * hidden[j] for j in range(rank)) for d in range(dim)]


def ref_scale(w, vec):
    return [w[d] * vec[d] for d in range(len(vec))] if isinstance(w, list) else [w * v for v in vec]


def ref_add(*vecs):
    return [sum(vals) for vals in zip(*vecs)]


def ref_residual(variant, pa_h, form, scale, k, params, history, x, fx):
    """One LAuReL'd residual on one token: x, fx are lists of D floats; history (newest first) is updated. PA's
    h_j is the j-th low-rank product (eq. 6) or the site's only one (section 2.3's shared h)."""
    rw, pa = "rw" in variant, "pa" in variant
    lr = "lr" in variant and not pa
    g = x
    if lr:  # eq. 3
        g = ref_add(x, ref_low_rank(params["down"][0], params["up"][0], x))
    if pa:  # eq. 4 / eq. 6: x_i + sum_j gamma_j h_j(x_{i-j})
        history.insert(0, x)
        del history[k:]
        total = [0.0] * len(x)
        for j, earlier in enumerate(history):
            p = j if pa_h == "lowrank" else 0
            h = earlier if pa_h == "identity" else ref_low_rank(params["down"][p], params["up"][p], earlier)
            total = ref_add(total, ref_scale(params["gamma"][j], h))
        g = ref_add(x, total)
    if rw:  # eq. 5 / 6
        alpha, beta = ref_rw(params["rw"], form, scale)
        return ref_add(ref_scale(alpha, fx), ref_scale(beta, g))
    return ref_add(fx, g)


@pytest.mark.parametrize("flags", VARIANT_FLAGS, ids=lambda f: " ".join(f[1:]))
def test_each_variant_matches_the_reference_equation(flags):
    """Random parameters and inputs through every site of a small model, against the loop reference."""
    dim, num_layers, tokens_per_seq = 8, 4, 3
    args = tgm.resolve_args(TINY + flags + ["--laurel-where", "both", "--num-layers", str(num_layers)])
    cfg = tgm.ModelConfig(num_layers=num_layers, model_dim=dim, **dict(LAUREL.model_values(None, args), laurel_rank=3))
    no_attention = tgm.layer_pattern(num_layers)["no_attention_layer"]
    model = types.SimpleNamespace(pattern={"no_attention_layer": no_attention}, add_scalars=lambda name, init: None)
    module = LaurelResiduals(model, cfg)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    inits = module.scalar_inits(dim)
    rw_raw = torch.randn(inits["rw"].shape, generator=gen) if "rw" in inits else None
    gamma = torch.randn(inits["gamma"].shape, generator=gen) if "gamma" in inits else None
    alpha, beta = (laurel_rw_weights(rw_raw, cfg.laurel_rw_form, cfg.laurel_rw_scale)
                   if rw_raw is not None else (None, None))
    laurel_pass = module.new_pass(alpha, beta, gamma)

    histories = [[] for _ in range(tokens_per_seq)]
    checked = 0
    for layer in range(num_layers):
        residual = laurel_pass.for_layer(layer)
        for site in ("attn", "mlp"):
            if site == "attn" and layer == no_attention:
                continue
            x = torch.randn(1, tokens_per_seq, dim, generator=gen)
            fx = torch.randn(1, tokens_per_seq, dim, generator=gen)
            got = residual(x, fx, site)
            n = module.index[(layer, site)]
            if not hasattr(module, "up"):
                products = []
            elif module.product_per_input:  # one per history entry, numbered as the gammas are
                products = range(module.gamma_start[n], module.gamma_start[n + 1])
            else:  # one per site
                products = [n]
            params = dict(
                down=[module.down[i].tolist() for i in products], up=[module.up[i].tolist() for i in products],
                gamma=gamma[module.gamma_start[n]:module.gamma_start[n + 1]].tolist() if gamma is not None else None,
                rw=rw_raw[n].tolist() if rw_raw is not None else None)
            for t in range(tokens_per_seq):
                want = ref_residual(cfg.laurel, cfg.laurel_pa_h, cfg.laurel_rw_form, cfg.laurel_rw_scale,
                                    cfg.laurel_k, params, histories[t], x[0, t].tolist(), fx[0, t].tolist())
                assert torch.allclose(got[0, t].double(), torch.tensor(want, dtype=torch.float64),
                                      rtol=1e-4, atol=1e-4), (layer, site, t)
            checked += 1
    assert checked == 2 * num_layers - 1


def test_sites_see_the_stream_after_the_unet_skip_and_block_mix(monkeypatch):
    """x of an attn site = mix(previous output + U-net skip); x of an mlp site = the attention residual's output."""
    model, _ = build(["--laurel", "rw", "--laurel-where", "both"])
    randomise_baseline_weights(model, 6)
    with torch.no_grad():
        model.scalars.copy_(torch.randn(model.scalars.shape, generator=torch.Generator().manual_seed(8)))
    calls = {}
    original = LaurelPass.residual

    def recording_residual(self, layer, site, x, fx):
        out = original(self, layer, site, x, fx)
        calls[(layer, site)] = (x, out)
        return out

    monkeypatch.setattr(LaurelPass, "residual", recording_residual)
    inputs, targets = tokens(4)
    with torch.no_grad():
        _, outputs, x00 = model.hidden_states(inputs, torch.tensor(2))
        x01 = tgm.norm(model.embed2(inputs)[None])
    lambdas = model.scalar_slice("block").view(-1, 3)
    skips = {dst: (w, src) for w, (src, dst) in zip(model.scalar_slice("unet"), model.pattern["unet_pairs"])}
    stream = x00
    for i in range(model.cfg.num_layers):
        if i in skips:
            stream = stream + skips[i][0] * outputs[skips[i][1]]
        mixed = lambdas[i, 0] * stream + lambdas[i, 1] * x00 + lambdas[i, 2] * x01
        if (i, "attn") in calls:
            assert torch.equal(calls[(i, "attn")][0], mixed)
            assert calls[(i, "mlp")][0] is calls[(i, "attn")][1]
        else:
            assert i == model.pattern["no_attention_layer"] and torch.equal(calls[(i, "mlp")][0], mixed)
        assert calls[(i, "mlp")][1] is outputs[i]
        stream = outputs[i]
    assert skips


# ---------------------------------------------------------------------------------------------------------------
# Initialisation and parameter counts

@pytest.mark.slow
@pytest.mark.parametrize("where", ["both", "block"])
@pytest.mark.parametrize("flags", VARIANT_FLAGS, ids=lambda f: " ".join(f[1:]))
def test_variant_at_init_reproduces_the_baseline_loss_exactly(flags, where):
    """Guards: every LAuReL variant and form at init gives the baseline's exact loss; moving its weights changes it."""
    inputs, targets = tokens(1)
    window = torch.tensor(2)
    baseline, _ = build([], seed=3)
    randomise_baseline_weights(baseline, 11)
    laurel, _ = build(flags + ["--laurel-where", where], seed=3)
    randomise_baseline_weights(laurel, 11)
    base_loss = baseline(inputs, targets, window)
    assert laurel(inputs, targets, window).item() == base_loss.item()
    # ...and the LAuReL path is live: moving its parameters off their init changes the loss
    with torch.no_grad():
        for name, p in laurel.named_parameters():
            if name.startswith("study"):
                p.add_(0.3)
        for name, (a, b) in laurel.scalar_layout.items():
            if name.startswith("laurel."):
                laurel.scalars[a:b] += torch.randn(b - a, generator=torch.Generator().manual_seed(4))
    assert laurel(inputs, targets, window).item() != base_loss.item()


def paper_params(variant, form, pa_h, rank, k, dim, sites):
    """Table 4 summed over the LAuReL'd residuals, with PA's k read as the inputs the history holds at the n-th
    residual, min(k, n + 1) (Table 4 exactly from the k-th residual on), plus the RW scalars: 1 or 2, 2D for the
    vector form."""
    total = 0
    for n in range(sites):
        held = min(k, n + 1)
        total += {"softmax": 2, "sigmoid": 2, "single": 1, "vector": 2 * dim}[form] if "rw" in variant else 0
        if "pa" in variant:
            total += {"identity": held, "lowrank": 2 * rank * held * dim + held,
                      "lowrank-shared": 2 * rank * dim + held}[pa_h]
        elif "lr" in variant:
            total += 2 * rank * dim
    return total


@pytest.mark.slow
@pytest.mark.parametrize("where", WHERE_FLAGS, ids=lambda f: " ".join(f) or "default")
@pytest.mark.parametrize("flags", VARIANT_FLAGS, ids=lambda f: " ".join(f[1:]))
def test_added_params_equal_the_paper_formulas(flags, where):
    """Guards: every LAuReL variant x site reports and builds exactly the paper's Table 4 parameter count."""
    model, args = build(flags + where)
    num_layers, dim = args.num_layers, model.cfg.model_dim
    layers = args.laurel_layers or list(range(num_layers))
    no_attention = tgm.layer_pattern(num_layers)["no_attention_layer"]
    sites = {"mlp": len(layers), "block": len(layers), "attn": len([i for i in layers if i != no_attention])}
    sites["both"] = sites["mlp"] + sites["attn"]
    want = paper_params(args.laurel, args.laurel_rw_form, args.laurel_pa_h, args.laurel_rank, args.laurel_k, dim,
                        sites[args.laurel_where])
    assert model.added_params() == {"laurel": want}
    baseline, _ = build([])
    assert sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in baseline.parameters()) == want


@pytest.mark.slow
def test_default_rank_and_k_follow_the_small_llm_ablation():
    """Guards: LAuReL's defaults: rank 32, k 3, low-rank PA h and MLP sites for rw+lr+pa; identity h for pa alone."""
    _, args = build(["--laurel", "rw+lr+pa"])
    assert (args.laurel_rank, args.laurel_k, args.laurel_pa_h, args.laurel_where) == (32, 3, "lowrank", "mlp")
    _, args = build(["--laurel", "pa"])
    assert args.laurel_pa_h == "identity"


@pytest.mark.slow
@pytest.mark.parametrize("zero_factor", ["up", "down"])
def test_low_rank_live_factor_is_the_papers_column_orthogonal_init(zero_factor):
    """Guards: LAuReL-LR's live factor starts column-orthogonal as in the paper, the other at zero, either way."""
    model, args = build(["--laurel", "lr", "--laurel-rank", "8", "--laurel-zero-factor", zero_factor])
    down, up = model.study["laurel"].down, model.study["laurel"].up
    # the D x r factor: A is stored as the down-projection [r, D], B as the up-projection [D, r]
    live, zero = (down.transpose(1, 2), up) if zero_factor == "up" else (up, down)
    r, dim = 8, model.cfg.model_dim
    for a in live:
        for i in range(dim):
            for j in range(r):
                assert a[i, j].item() == pytest.approx(1 / math.sqrt(r * dim) if i % r == j else 0.0)
        gram = a.T @ a  # columns orthogonal
        assert torch.allclose(gram, torch.diag(torch.diag(gram)))
    assert zero.abs().sum().item() == 0.0


@pytest.mark.slow
def test_xavier_factor_init_has_the_glorot_bound_and_spread():
    """Guards: --laurel-factor-init xavier draws within the Glorot bound with its spread, from the seed; up is zero."""
    model, _ = build(["--laurel", "lr", "--laurel-rank", "8", "--laurel-factor-init", "xavier"], seed=1)
    down, up = model.study["laurel"].down, model.study["laurel"].up
    bound = math.sqrt(6 / (model.cfg.model_dim + 8))
    assert down.abs().max().item() <= bound and down.abs().max().item() > 0.9 * bound
    assert down.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)  # uniform(-b, b): std b/sqrt(3)
    assert up.abs().sum().item() == 0.0
    other, _ = build(["--laurel", "lr", "--laurel-rank", "8", "--laurel-factor-init", "xavier"], seed=2)
    assert not torch.equal(down, other.study["laurel"].down)  # drawn from the seed, not a fixed pattern


# ---------------------------------------------------------------------------------------------------------------
# PA memory: at most k activations alive

@pytest.mark.slow
@pytest.mark.parametrize("where", ["mlp", "attn"])
def test_pa_keeps_at_most_k_activations_alive(monkeypatch, where):
    """Guards: a LAuReL-PA forward keeps at most k activations alive (weakrefs after gc), at MLP or attn sites."""
    k = 2
    model, args = build(["--laurel", "pa", "--laurel-k", str(k), "--laurel-where", where])
    randomise_baseline_weights(model, 5)
    inputs_seen, alive_counts = [], []
    original = LaurelPass.residual

    def counting_residual(self, layer, site, x, fx):
        out = original(self, layer, site, x, fx)
        if (layer, site) in self.m.index:
            inputs_seen.append(weakref.ref(x))
            alive_counts.append(len(self.history))
            gc.collect()
            alive_counts.append(sum(r() is not None for r in inputs_seen[:-1]) + 1)
        return out

    monkeypatch.setattr(LaurelPass, "residual", counting_residual)
    inputs, targets = tokens(2)
    with torch.no_grad():
        model(inputs, targets, torch.tensor(2))
    assert len(inputs_seen) == len(model.study["laurel"].sites) > k
    assert max(alive_counts) == k


# ---------------------------------------------------------------------------------------------------------------
# Optimiser assignment

def test_optimiser_assignment_muon_for_low_rank_adam_scalars_for_rw_and_gamma():
    model, _ = build(["--laurel", "rw+lr+pa", "--laurel-rw-form", "vector", "--laurel-rank", "4"])
    opt = tgm.Optimizers(model, 0, 1, fused_adam=False, ns_dtype=torch.float32)
    study = model.study["laurel"]
    muon_ids = {id(p) for p in opt.muon.ordered}
    assert id(study.down) in muon_ids and id(study.up) in muon_ids
    groups = {g["name"]: {id(p) for p in g["params"]} for g in opt.adam.param_groups}
    assert id(model.scalars) in groups["scalar"]
    assert not any(id(p) in ids for ids in groups.values() for p in study.parameters())
    # the vector-form RW weights (2D per site) and the gammas are slices of the Adam scalar vector
    n, dim = len(study.sites), model.cfg.model_dim
    a, b = model.scalar_layout["laurel.rw"]
    assert b - a == n * 2 * dim
    a, b = model.scalar_layout["laurel.gamma"]
    assert b - a == sum(min(3, i + 1) for i in range(n))


@pytest.mark.slow
def test_muon_trains_zero_initialised_up_projection():
    """B = 0 gives A a zero gradient at step 0: NS5 of zero is zero (no NaN), so A only decays; B moves."""
    model, _ = build(["--laurel", "lr", "--laurel-rank", "4"])
    randomise_baseline_weights(model, 9)
    study = model.study["laurel"]
    down0 = study.down.detach().clone()
    opt = tgm.Optimizers(model, 0, 1, fused_adam=False, ns_dtype=torch.float32)
    inputs, targets = tokens(3)
    model(inputs, targets, torch.tensor(2)).backward()
    assert study.down.grad.abs().sum().item() == 0.0
    assert study.up.grad.abs().sum().item() > 0.0
    opt.muon.step()
    decay = 1 - opt.MUON_LR * opt.MUON_WD
    assert torch.isfinite(study.down).all() and torch.isfinite(study.up).all()
    assert torch.allclose(study.down, down0 * decay)
    assert study.up.abs().min(dim=-1).values.sum().item() > 0.0  # every row of every B moved
    model.zero_grad(set_to_none=True)
    model(inputs, targets, torch.tensor(2)).backward()
    assert study.down.grad.abs().sum().item() > 0.0  # with B != 0, A learns from the next step on


def per_product_grad(tensor):
    return tensor.grad.flatten(start_dim=1).abs().sum(dim=1)


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--laurel", "rw+lr+pa"], ["--laurel", "pa", "--laurel-pa-h", "lowrank-shared"],
                                   ["--laurel", "rw+lr+pa", "--laurel-zero-factor", "down"]],
                         ids=lambda f: " ".join(f[1:]))
def test_low_rank_pa_trains_gamma_and_both_factors(flags):
    """gamma = 1 and a zero factor: at the first step only the zero factor has a gradient (gamma's is h(x) = B A x
    = 0; the live factor's passes through the zero one); once it has moved, gamma and the live factor have one
    too. The old gamma = 0 init left gamma, A and B at exactly zero gradient forever."""
    model, _ = build(flags + ["--laurel-rank", "4"])
    randomise_baseline_weights(model, 9)
    study = model.study["laurel"]
    zero, live = (study.down, study.up) if "down" in flags else (study.up, study.down)
    a, b = model.scalar_layout["laurel.gamma"]
    assert model.scalars[a:b].eq(1).all()
    opt = tgm.Optimizers(model, 0, 1, fused_adam=False, ns_dtype=torch.float32)
    inputs, targets = tokens(3)
    model(inputs, targets, torch.tensor(2)).backward()
    assert (per_product_grad(zero) > 0).all()
    assert live.grad.abs().sum().item() == 0.0 and model.scalars.grad[a:b].abs().sum().item() == 0.0
    opt.step(0, 40)
    model(inputs, targets, torch.tensor(2)).backward()
    assert (per_product_grad(zero) > 0).all() and (per_product_grad(live) > 0).all()
    assert (model.scalars.grad[a:b] != 0).all()


@pytest.mark.slow
def test_pa_makes_one_gamma_per_input_the_history_holds():
    """The n-th LAuReL'd residual sees min(k, n + 1) inputs: no gamma (or product) that could never be used."""
    model, _ = build(["--laurel", "rw+lr+pa", "--laurel-rank", "4", "--laurel-k", "3"])
    study = model.study["laurel"]
    held = [min(3, n + 1) for n in range(len(study.sites))]
    assert study.history_lengths == held == [1, 2, 3, 3, 3, 3]
    assert study.up.size(0) == study.down.size(0) == sum(held)
    names = [k for k in model.named_scalars() if ".gamma" in k]
    assert names[:3] == ["laurel.L0.mlp.gamma0", "laurel.L1.mlp.gamma0", "laurel.L1.mlp.gamma1"]
    assert len(names) == sum(held)


@pytest.mark.slow
def test_whole_block_site_weighs_attention_plus_mlp():
    """--laurel-where block: the attention residual stays plain inside; the block's output is
    alpha (attn + mlp) + beta x_block, x_block the attention's input (the MLP's in the layer without attention)."""
    model, _ = build(["--laurel", "rw", "--laurel-rw-form", "sigmoid", "--laurel-where", "block"])
    study = model.study["laurel"]
    assert study.sites == [(i, "block") for i in range(6)]
    gen = torch.Generator().manual_seed(3)
    raw = torch.randn(6, 2, generator=gen)
    alpha, beta = laurel_rw_weights(raw, "sigmoid", 2.0)
    laurel_pass = study.new_pass(alpha, beta, None)
    x, attn, mlp = (torch.randn(1, 4, 64, generator=gen) for _ in range(3))
    residual = laurel_pass.for_layer(1)
    inner = residual(x, attn, "attn")
    assert torch.equal(inner, x + attn)
    assert torch.allclose(residual(inner, mlp, "mlp"), beta[1] * x + alpha[1] * (attn + mlp))
    no_attention = model.pattern["no_attention_layer"]
    residual = laurel_pass.for_layer(no_attention)
    assert torch.allclose(residual(x, mlp, "mlp"), beta[no_attention] * x + alpha[no_attention] * mlp)


# ---------------------------------------------------------------------------------------------------------------
# Bad input: one line, exit status 2

@pytest.mark.parametrize("argv, needle", [
    (["--laurel", "lr", "--laurel-rank", "64"], "--laurel-rank"),  # r >= D (tiny D = 64)
    (["--laurel", "lr", "--laurel-rank", "0"], "--laurel-rank"),
    (["--laurel", "lr", "--laurel-rank", "x"], "--laurel-rank"),
    (["--laurel", "pa", "--laurel-k", "7"], "--laurel-k"),  # 6 layers, mlp sites only
    (["--laurel", "pa", "--laurel-k", "0"], "--laurel-k"),
    (["--laurel", "rw+xx"], "--laurel"),
    (["--laurel", "rw", "--laurel-rw-form", "tanh"], "--laurel-rw-form"),
    (["--laurel", "rw", "--laurel-where", "head"], "--laurel-where"),
    (["--laurel", "rw", "--laurel-layers", "6"], "--laurel-layers"),
    (["--laurel", "rw", "--laurel-layers", "1,1"], "--laurel-layers"),
    (["--laurel", "rw", "--laurel-where", "attn", "--laurel-layers", "2"], "--laurel-layers"),
    (["--laurel-rank", "8"], "--laurel-rank"),
    (["--laurel-where", "both"], "--laurel-where"),
    (["--laurel", "rw", "--laurel-rank", "8"], "--laurel-rank"),
    (["--laurel", "lr", "--laurel-k", "2"], "--laurel-k"),
    (["--laurel", "rw+lr+pa", "--laurel-pa-h", "identity"], "--laurel-pa-h"),
    (["--laurel", "rw", "--laurel-rw-scale", "-1"], "--laurel-rw-scale"),
    (["--laurel", "pa", "--laurel-pa-h", "shared"], "--laurel-pa-h"),
    (["--laurel", "rw", "--laurel-where", "blocks"], "--laurel-where"),
    (["--laurel", "lr", "--laurel-factor-init", "kaiming"], "--laurel-factor-init"),
    (["--laurel", "lr", "--laurel-zero-factor", "both"], "--laurel-zero-factor"),
    (["--laurel", "pa", "--laurel-factor-init", "xavier"], "--laurel-factor-init"),  # identity h: no product
    (["--laurel", "rw", "--laurel-zero-factor", "down"], "--laurel-zero-factor"),
    (["--laurel-factor-init", "xavier"], "--laurel-factor-init"),
])
def test_invalid_laurel_flags_are_one_line_errors(argv, needle, capsys):
    assert tgm.main(TINY + argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------------------------
# Naive scaling: layer patterns and the params the extra layers add

@pytest.mark.parametrize("num_layers", [12, 16, 17, 18, 19, 20, 24])
def test_layer_patterns_are_sane_for_study_layer_counts(num_layers):
    pat = tgm.layer_pattern(num_layers)
    n_ve = pat["num_value_embeds"]
    used = [v for v in pat["ve_index"] if v is not None]
    assert sorted(set(used)) == list(range(n_ve)) and len(used) == 2 * n_ve <= num_layers
    assert pat["ve_index"][:n_ve] == pat["ve_index"][num_layers - n_ve:]
    assert 0 < pat["no_attention_layer"] < num_layers - 1
    assert all(0 <= i < num_layers for i in pat["long_window_layers"])
    dsts = [dst for _, dst in pat["unet_pairs"]]
    assert all(0 <= src < pat["no_attention_layer"] + 2 <= dst < num_layers for src, dst in pat["unet_pairs"])
    assert len(set(dsts)) == len(dsts) and len(pat["unet_pairs"]) >= 1
    if num_layers == 16:
        assert pat == dict(num_value_embeds=5, ve_index=[0, 1, 2, 3, 4] + [None] * 6 + [0, 1, 2, 3, 4],
                           long_window_layers=[0, 4, 11, 15], no_attention_layer=7,
                           unet_pairs=[(6, 9), (4, 10), (2, 11)])


@pytest.mark.slow
def test_added_params_report_extra_layers_against_the_preset():
    """Guards: added_params reports the layers beyond the preset's 16 (full size, meta device), none for the preset."""
    args = tgm.resolve_args(["--num-layers", "18"])  # full size: counted on the meta device
    with torch.device("meta"):
        model = tgm.GPT(tgm.model_config(args), max_seq_len=1)
    dim, hdim = 1024, 8 * 128
    per_layer = 4 * hdim * dim + 2 * 4 * dim * dim + 3 + 2  # attention, MLP, block and value lambdas
    extra_unet = len(tgm.layer_pattern(18)["unet_pairs"]) - len(tgm.layer_pattern(16)["unet_pairs"])
    assert model.added_params() == {"layers": 2 * per_layer + extra_unet}
    small, _ = build(["--num-layers", "8"])
    base, _ = build([])
    assert small.added_params()["layers"] == (sum(p.numel() for p in small.parameters())
                                              - sum(p.numel() for p in base.parameters()))
    assert "layers" not in base.added_params()


# ---------------------------------------------------------------------------------------------------------------
# The baseline stays bit-identical to the unmodified script

@pytest.mark.slow
def test_baseline_is_bit_identical_to_the_unmodified_script(unmodified_medium):
    """Guards: four flagless training steps of the medium model equal the pre-study script's (12c2aa8) bitwise."""
    old = unmodified_medium
    losses = []
    for module in (old, tgm):
        cfg = module.model_config(module.resolve_args(TINY))
        torch.manual_seed(0)
        model = module.GPT(cfg, max_seq_len=128)
        opt = module.Optimizers(model, 0, 1, fused_adam=False, ns_dtype=torch.float32)
        run = []
        for step in range(4):
            inputs, targets = tokens(10 + step)
            loss = model(inputs, targets, torch.tensor(2))
            run.append(loss.item())
            loss.backward()
            opt.step(step, 40)
        losses.append(run)
    assert losses[0] == losses[1]
    assert len(set(losses[1])) > 1  # training moved the loss


# ---------------------------------------------------------------------------------------------------------------
# The run log: added_params and the scalars line names

@pytest.mark.slow
def test_run_log_names_every_laurel_scalar(tmp_path, tiny_data_args):
    """Guards: a real LAuReL run (a process) logs its added_params and every LAuReL scalar's name, trained."""
    result = launch_script(tiny_data_args + [
        "--laurel", "rw+pa", "--laurel-where", "both", "--laurel-layers", "1,2", "--laurel-k", "2",
        "--num-iterations", "4", "--stop-after", "2", "--val-every", "2", "--log-dir", str(tmp_path),
        "--run-name", "laurel"], timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = (tmp_path / "laurel.txt").read_text().splitlines()
    added = next(line for line in lines if line.startswith("added_params: "))
    # 3 sites x 2 RW scalars, and 1 + 2 + 2 gammas (the first residual's history holds only its own input)
    assert json.loads(added[len("added_params: "):added.index(" total")]) == {"laurel": 3 * 2 + 5}
    scalars = [json.loads(line.split(" scalars: ", 1)[1]) for line in lines
               if line.startswith("step:") and " scalars: " in line]
    assert len(scalars) == 2  # steps 0 and 2
    names = sorted(k for k in scalars[-1] if k.startswith("laurel."))
    # layer 2 is the tiny model's layer without attention: it has no attn site
    assert names == sorted([f"laurel.L{layer}.{site}.{w}" for layer, site in [(1, "attn"), (1, "mlp"), (2, "mlp")]
                            for w in ("alpha", "beta", "gamma0")] + ["laurel.L1.mlp.gamma1", "laurel.L2.mlp.gamma1"])
    assert scalars[0]["laurel.L1.attn.alpha"] == 1.0 and scalars[0]["laurel.L1.attn.gamma0"] == 0.0
    assert scalars[-1]["laurel.L1.attn.alpha"] != 1.0  # trained between the two validations
    assert lines[-1].startswith("peak memory allocated:")
