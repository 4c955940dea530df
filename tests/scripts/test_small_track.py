"""train_gpt.py, the small track: the record's structure, the FP8 head, the optimisers, the study flags at their
default init, and real CPU runs (world sizes 1 and 2, resume, bad input)."""
import json
import math
import re
import zlib

import pytest
import torch

import train_gpt as S
from conftest import (SMALL_SCRIPT, embedded_sources, killed_run, launch_script, one_error_line,
                      script_from_history)
from ablations.study import load_script
from speedrun.muon import newton_schulz5
from study_training import assert_each_parameter_in_one_optimizer, tiny_model_and_optimizers

VAL_LINE = re.compile(r"^step:(\d+)/(\d+) val_loss:(\d+\.\d{4}) train_time:(\d+)ms step_avg:(\d+\.\d{2})ms$")


# --- structure -------------------------------------------------------------------------------------------------

def test_layer_pattern_at_12_layers_is_the_record():
    pat = S.layer_pattern(12)
    assert pat["ve_index"] == [0, 1, 2] + [None] * 6 + [0, 1, 2]
    assert pat["long_window_layers"] == [0, 4, 11]
    assert pat["no_attention_layer"] == 7
    # layer 6 receives layer 5's output ... layer 11 receives layer 0's, weight index i - 6
    assert pat["unet_pairs"] == [(5, 6), (4, 7), (3, 8), (2, 9), (1, 10), (0, 11)]


@pytest.mark.parametrize("layers", [2, 3, 6, 13, 24])
def test_layer_pattern_is_consistent_for_other_depths(layers):
    pat = S.layer_pattern(layers)
    assert sorted({i for i in pat["ve_index"] if i is not None}) == list(range(pat["num_value_embeds"]))
    assert all(0 <= l < layers for l in pat["long_window_layers"] + [pat["no_attention_layer"]])
    assert all(0 <= src < dst < layers for src, dst in pat["unet_pairs"])


def test_linear_window_schedule():
    cfg = S.ModelConfig()
    # 1728 * step / 1770 tokens rounded up to 128-token blocks: 1 block up to step 131, 14 at the end
    assert [S.window_blocks_at(s, 1770, cfg) for s in (0, 131, 132, 885, 1770)] == [1, 1, 2, 7, 14]


def test_full_model_has_the_parameter_count_of_the_spec():
    with torch.device("meta"):
        model = S.GPT(S.ModelConfig(), max_seq_len=1024)
    vocab, padded_vocab, dim, hidden, layers = 50257, 50304, 768, 3072, 12
    embeddings = 4 * vocab * dim  # the token embedding and three value embeddings
    attention = 11 * (3 * dim * dim + dim * dim)  # q, k, v and the output projection; layer 7 has none
    mlp = layers * 2 * dim * hidden
    head = padded_vocab * dim
    # six U-net weights, (a, b) per block, (v_self, v_embed) per layer: upstream keeps the last pair only on the
    # 11 attention layers, this model one per layer so the slice indexes by layer (layer 7's two are unused)
    scalars = 6 + 2 * layers + 2 * layers
    assert embeddings + attention + mlp + head + scalars == 275_598_390
    assert sum(p.numel() for p in model.parameters()) == 275_598_390


def test_softcap_is_30_sigmoid_over_7_5():
    z = torch.tensor([-100.0, 0.0, 7.5, 100.0])
    torch.testing.assert_close(S.softcap(z), 30 / (1 + torch.exp(-z / 7.5)))


# --- the lm head -------------------------------------------------------------------------------------------------

def tiny_args(*flags):
    return S.resolve_args(["--preset", "tiny", *flags])


def test_fp8_head_is_chosen_only_where_fp8_matmuls_exist(monkeypatch):
    model = S.GPT(S.model_config(tiny_args()), max_seq_len=64)
    lines = S.choose_lm_head(model, tiny_args(), S.Dist())
    assert not model.fp8_head and lines == ["lm_head: float32 matmul (no FP8 matmul on cpu)"]

    cuda = torch.device("cuda", 0)
    for capability, expected in [((9, 0), True), ((8, 9), True), ((8, 0), False)]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert S.fp8_head_available(cuda) is expected
    monkeypatch.setattr(S, "fp8_head_available", lambda device: True)
    assert S.choose_lm_head(model, tiny_args(), S.Dist())[0].startswith("lm_head: fp8 ") and model.fp8_head
    lines = S.choose_lm_head(model, tiny_args("--fp8-head", "off"), S.Dist())
    assert not model.fp8_head and lines == ["lm_head: float32 matmul (--fp8-head off)"]


def scaled_mm_runs_here():
    try:
        a = torch.zeros(16, 16).to(torch.float8_e4m3fn)
        torch._scaled_mm(a, a.t(), scale_a=torch.tensor(1.0), scale_b=torch.tensor(1.0), out_dtype=torch.bfloat16)
        return True
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


@pytest.fixture
def fp8_head():
    """train_gpt.py's fp8 head op as its model calls it, by the registered name, registered now by a copy of the
    script: a process keeps only the last registration of a name, and other tests load copies of the script (each
    registers it again, leaving the handle S took pointing at an entry that may be gone)."""
    load_script(SMALL_SCRIPT)
    return torch.ops.speedrun.fp8_head_matmul.default


@pytest.mark.skipif(not scaled_mm_runs_here(), reason="torch._scaled_mm does not run on this CPU build")
def test_fp8_head_matches_the_spec_casts_and_scales(fp8_head):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 64, generator=g).bfloat16().requires_grad_()
    w = (torch.randn(128, 64, generator=g) * 0.05).requires_grad_()
    out = fp8_head(x, w)[0]
    grad_out = torch.randn(32, 128, generator=g).bfloat16() * 1e-4
    out.backward(grad_out)
    assert out.dtype == torch.bfloat16 and x.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.float32

    # The reference: the same casts, undone in fp32, then plain matmuls.
    x8 = (x.detach().float() * 2.0).to(torch.float8_e4m3fn).float() / 2.0
    w8 = (w.detach() * 2.0 ** 9).to(torch.float8_e4m3fn).float() / 2.0 ** 9
    g8 = (grad_out.float() * 2.0 ** 19).to(torch.float8_e5m2).float() / 2.0 ** 19
    torch.testing.assert_close(out.float(), x8 @ w8.t(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(x.grad.float(), g8 @ w8, rtol=1e-2, atol=1e-6)
    torch.testing.assert_close(w.grad, g8.t() @ x8, rtol=1e-4, atol=1e-6)
    # and the casts matter: the fp32 product differs from the fp8 one by more than bf16 rounding
    assert (out.float() - x.detach().float() @ w.detach().t()).abs().max() > 1e-3


@pytest.fixture(scope="module")
def autograd_function_head():
    """The FP8HeadMatmul autograd.Function the custom op replaced (commit c2c565e), from tests/fixtures/history/."""
    return script_from_history("train_gpt_fp8_head-c2c565e.py.txt").FP8HeadMatmul


def fp8_head_case(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(48, 64, generator=g).bfloat16()
    w = torch.randn(256, 64, generator=g) * 0.05
    return x, w, torch.randn(48, 256, generator=g).bfloat16() * 1e-4


@pytest.mark.skipif(not scaled_mm_runs_here(), reason="torch._scaled_mm does not run on this CPU build")
@pytest.mark.parametrize("seed", [0, 1])
def test_fp8_head_custom_op_equals_the_autograd_function_bitwise(seed, autograd_function_head, fp8_head):
    results = []
    for head in (lambda x, w: autograd_function_head.apply(x, w), lambda x, w: fp8_head(x, w)[0]):
        x, w, grad_out = fp8_head_case(seed)
        x.requires_grad_(), w.requires_grad_()
        out = head(x, w)
        out.backward(grad_out)
        results.append((out, x.grad, w.grad))
    for old, new in zip(*results):
        assert new.dtype == old.dtype and new.shape == old.shape and torch.equal(new, old)


@pytest.mark.slow
@pytest.mark.own_process
@pytest.mark.skipif(not scaled_mm_runs_here(), reason="torch._scaled_mm does not run on this CPU build")
def test_compiled_fp8_head_is_one_node_forward_and_backward_without_graph_break():
    """torch.compile (inductor, CPU) of the training head: the custom op stays one opaque node in the forward
    graph and its backward one node in the backward graph (no _scaled_mm or fp8 cast lowered by inductor), and
    the compiled loss and gradients equal eager's."""
    from torch._dynamo.utils import counters
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    graphs = []  # dynamo's graph, then inductor's forward and backward graphs (after AOT autograd)

    def keep_then_compile(graph, example_inputs, **kwargs):
        graphs.append(graph)
        return compile_fx_inner(graph, example_inputs, **kwargs)

    def inductor_keeping_graphs(graph, example_inputs):
        graphs.append(graph)
        return compile_fx(graph, example_inputs, inner_compile=keep_then_compile)

    args = tiny_args()
    torch.manual_seed(0)
    model = S.GPT(S.model_config(args), max_seq_len=64)
    model.fp8_head = True
    with torch.no_grad():
        model.lm_head_w.normal_(0, 0.05)
    latents = torch.randn(1, 64, model.cfg.model_dim).bfloat16()
    targets = torch.randint(0, 50257, (64,))
    results = []
    torch._dynamo.reset()
    counters.clear()
    # the caches would hand back an earlier run's compiled graphs without showing them to inner_compile
    no_caches = (torch._inductor.config.patch(fx_graph_cache=False),
                 torch._functorch.config.patch(enable_autograd_cache=False))
    with no_caches[0], no_caches[1]:
        for head in (model.head_loss, torch.compile(model.head_loss, backend=inductor_keeping_graphs,
                                                    dynamic=False)):
            x = latents.clone().requires_grad_()
            model.lm_head_w.grad = None
            loss = head(x, targets)
            loss.backward()
            results.append((loss, x.grad, model.lm_head_w.grad))
    assert dict(counters["graph_break"]) == {}
    dynamo_graph, *aot_graphs = graphs

    def calls(graph, op):
        # by name: a test that re-imports the script registers the op again, as another OpOverload object
        return sum(str(node.target) == str(op) for node in graph.graph.nodes)

    assert calls(dynamo_graph, torch.ops.speedrun.fp8_head_matmul.default) == 1
    forward, backward = aot_graphs
    assert calls(forward, torch.ops.speedrun.fp8_head_matmul.default) == 1
    assert calls(backward, torch.ops.speedrun.fp8_head_matmul_backward.default) == 1
    for graph in aot_graphs:
        assert calls(graph, torch.ops.aten._scaled_mm.default) == 0
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-7)


# --- optimisers ------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_optimizers_follow_the_spec():
    """Guards: train_gpt.py's optimisers: each parameter in Muon or Adam once, the spec's lrs, and the lr schedule."""
    _, model, opt = tiny_model_and_optimizers(S)
    assert opt.snoo is None
    assert_each_parameter_in_one_optimizer(model, opt)
    assert {g["name"]: g["lr"] for g in opt.adam.param_groups} == {"head": 0.008, "embed": 0.6, "scalar": 0.04}
    assert all(p.ndim >= 2 and p.dtype == torch.float32 for p in opt.muon.ordered)
    assert opt.muon.param_groups[0]["weight_decay"] == 0 and opt.muon.smoothing == 0
    # lr factor: 1 until 60% of the steps, then linear to 0.1
    factors = {}
    seq = torch.randint(0, 1000, (65,), generator=torch.Generator().manual_seed(2))
    for step in (0, 1062, 1416, 1770):
        model(seq[:-1], seq[1:], torch.tensor(2)).backward()
        opt.step(step, 1770)
        factors[step] = opt.adam.param_groups[0]["lr"] / 0.008
    assert factors[0] == factors[1062] == 1.0
    assert factors[1416] == pytest.approx(0.5 * 0.9 + 0.1) and factors[1770] == pytest.approx(0.1)


def test_newton_schulz_with_the_constant_coefficients():
    g = torch.randn(64, 256, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x = g / (g.norm() + 1e-7)
    for _ in range(5):
        A = x @ x.T
        x = 3.4445 * x + (-4.7750 * A + 2.0315 * A @ A) @ x
    torch.testing.assert_close(newton_schulz5(g, torch.float64, S.Optimizers.NS_COEFFS), x)


# --- study flags at their default init -----------------------------------------------------------------------------

IDENTITY_AT_INIT = [
    ["--backout-layers", "8"],  # the weighted form: x_lambda 1, lambda_8 0
    ["--rolling-skip"],
    ["--laurel", "rw"], ["--laurel", "lr"], ["--laurel", "pa"], ["--laurel", "rw+lr+pa", "--laurel-where", "both"],
    ["--backout-layers", "8", "--rolling-skip", "--laurel", "rw+pa"],
]
NOT_IDENTITY_AT_INIT = [
    ["--backout-layers", "8", "--backout-mode", "subtract"],  # PR #140 starts by subtracting 0.5 * out[8]
    ["--backout-layers", "8", "--backout-mode", "concat-head"],
    ["--backout-layers", "8", "--backout-mode", "concat-mlp"],
]


def step0_loss(flags, trained_look=False):
    """The training loss of one tiny batch for the model at init (seed 0). trained_look: every parameter of the
    baseline architecture (zero-initialised projections and head included) set to random values that depend only
    on its name, so baseline and variant share them and the latents are not trivially collinear."""
    _, model, _ = tiny_model_and_optimizers(S, *flags)
    if trained_look:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if not name.startswith("study.") and name != "scalars":
                    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
                    p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    seq = torch.randint(0, 1000, (65,), generator=torch.Generator().manual_seed(2))
    seq[::16] = 50256
    return model(seq[:-1], seq[1:], torch.tensor(2)).item()


@pytest.mark.slow
@pytest.mark.parametrize("flags", IDENTITY_AT_INIT + NOT_IDENTITY_AT_INIT, ids=" ".join)
def test_every_study_flag_starts_at_the_baseline_loss(flags):
    """Guards: every small-track study flag starts train_gpt.py at the baseline's loss, ln(50304), at init."""
    # The zero-initialised head makes every logit equal: the loss is ln(padded vocab) for every model.
    assert step0_loss(flags) == step0_loss([]) == pytest.approx(math.log(50304), abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("flags", IDENTITY_AT_INIT, ids=" ".join)
def test_identity_initialised_flags_keep_the_baseline_function(flags):
    """Guards: identity-initialised small-track flags keep the baseline's loss with every weight non-zero."""
    # With every weight non-zero, flags whose init is the identity still leave the latents (and the loss) unchanged.
    assert step0_loss(flags, trained_look=True) == pytest.approx(step0_loss([], trained_look=True), abs=1e-5)


@pytest.mark.slow
def test_subtract_backout_moves_the_latents_once_the_layers_do():
    """Guards: subtract backout changes the small-track loss once the weights are not the init's (not a no-op)."""
    # At the real init every layer's output is a multiple of x0, so subtracting 0.5 * out[8] only rescales x
    # before the norm; with trained-looking weights it changes the function from the first step.
    assert abs(step0_loss(NOT_IDENTITY_AT_INIT[0], trained_look=True) - step0_loss([], trained_look=True)) > 1e-3


def test_backout_record_layer_is_named_and_checked():
    assert "8 (small track)" in " ".join(S.make_arg_parser().format_help().split())
    args = tiny_args("--backout-layers", "8", "--backout-mode", "subtract")
    assert args.backout_layers == (8,) and args.backout_skip_init == 0.5


# --- runs --------------------------------------------------------------------------------------------------------

def val_losses(path):
    return [m.group(3) for m in map(VAL_LINE.match, path.read_text().splitlines()) if m]


@pytest.mark.slow
def test_world_sizes_1_and_2_follow_the_same_trajectory(tmp_path):
    """Guards: real 1- and 2-process runs of train_gpt.py follow the same val losses and write the small track's log."""
    flags = ["--preset", "tiny", "--num-iterations", "2", "--val-every", "1", "--log-dir", str(tmp_path)]
    losses = {}
    for nproc in (1, 2):
        res = launch_script(flags + ["--run-name", f"ws{nproc}"], nproc=nproc, script=SMALL_SCRIPT)
        assert res.returncode == 0, res.stderr[-2000:]
        losses[nproc] = [float(v) for v in val_losses(tmp_path / f"ws{nproc}.txt")]
    assert len(losses[1]) == len(losses[2]) == 3
    assert losses[1][0] == losses[2][0] == round(math.log(50304), 4)
    # Only the summation order of the gradients differs, and this tiny model amplifies it (Adam's first steps
    # are nearly sign steps): reversing the micro-batch order in one process moves the step-2 loss by 5.5e-4.
    assert losses[1][1] == losses[2][1]
    assert losses[1][2] == pytest.approx(losses[2][2], abs=1e-3)
    assert losses[1][-1] < losses[1][0] - 0.1  # it trains

    log = (tmp_path / "ws2.txt").read_text()
    code, env, body = log.split("\n" + "=" * 100 + "\n")
    assert code == embedded_sources(SMALL_SCRIPT)
    config = json.loads(next(l for l in env.splitlines() if l.startswith("config: "))[len("config: "):])
    assert config["track"] == "small" and config["world_size"] == 2 and config["variant"] == "baseline"
    assert "lm_head: float32 matmul (no FP8 matmul on cpu)" in env.splitlines()
    assert re.match(r"^peak memory allocated: \d+ MiB reserved: \d+ MiB$", body.splitlines()[-1])


@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_trajectory(tmp_path):
    """Guards: a SIGKILLed train_gpt.py run resumed from its checkpoint logs the val losses of an unbroken run."""
    common = ["--preset", "tiny", "--num-iterations", "6", "--val-every", "2", "--checkpoint-every", "2",
              "--backout-layers", "8", "--backout-mode", "subtract"]
    full = launch_script(common + ["--log-dir", str(tmp_path / "full"), "--run-name", "r"], script=SMALL_SCRIPT)
    assert full.returncode == 0, full.stderr[-2000:]

    killed_dir = tmp_path / "killed"
    killed_run(SMALL_SCRIPT, common, killed_dir, "step:3/6 train_time")
    assert torch.load(killed_dir / "r.pt", weights_only=False)["step"] in (2, 4)

    resumed = launch_script(common + ["--log-dir", str(killed_dir), "--run-name", "resumed",
                                     "--resume", str(killed_dir / "r.pt")], script=SMALL_SCRIPT)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert val_losses(killed_dir / "resumed.txt") == val_losses(tmp_path / "full" / "r.txt")
    scalars = [l for l in (killed_dir / "resumed.txt").read_text().splitlines() if " scalars: " in l]
    assert json.loads(scalars[-1].split(" scalars: ")[1])["backout.L8"] != 0.5  # the lambda trained


@pytest.mark.parametrize("argv, needle", [
    (["--backout-layers", "12"], "--backout-layers"),
    (["--laurel", "rw", "--laurel-where", "attn", "--laurel-layers", "7"], "layer 7"),
    (["--num-layers", "1"], "--num-layers"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, needle):
    assert S.main(["--preset", "tiny", "--log-dir", str(tmp_path / "logs"), *argv]) == 2
    assert needle in one_error_line(capsys)
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("argv, needle", [
    (["--fp8-head", "always"], "--fp8-head"),
    (["--coordinate-descent-tuning", "on"], "unrecognized"),  # forbidden on this track: no such flag
])
def test_bad_flags_are_one_line_and_exit_2(capsys, argv, needle):
    with pytest.raises(SystemExit) as exit_:
        S.main(["--preset", "tiny", *argv])
    assert exit_.value.code == 2 and needle in one_error_line(capsys)
