"""A study's tiny model trained a few steps inside the test process (no subprocess, a fast test): what a study's
test needs to see its parameters learn (docs/adding-a-study.md, section 5); and a track's tiny model with its
optimisers, built as those steps build them."""
import torch

from speedrun.data import TokenStream, find_shards


def tiny_model_and_optimizers(track, *flags, max_seq_len=256):
    """(args, model, optimisers) of the track module (train_gpt or train_gpt_medium) at --preset tiny and the flags:
    the model at seed 0, its optimisers as a CPU test runs them (one rank, no fused Adam, Newton-Schulz in fp32)."""
    args = track.resolve_args(["--preset", "tiny", *flags])
    torch.manual_seed(0)
    model = track.GPT(track.model_config(args), max_seq_len=max_seq_len)
    return args, model, track.Optimizers(model, 0, 1, fused_adam=False, ns_dtype=torch.float32)


def assert_each_parameter_in_one_optimizer(model, opt):
    """Every parameter of the model is in Muon or in one of Adam's groups, and in only one."""
    muon_ids = [id(p) for p in opt.muon.ordered]
    adam_ids = [id(p) for g in opt.adam.param_groups for p in g["params"]]
    assert sorted(muon_ids + adam_ids) == sorted(id(p) for p in model.parameters())


def trained_steps(track, argv, train_glob, steps):
    """Yields the model of the track module (train_gpt_medium, with or without --base r18, or train_gpt) at argv,
    seed 0, after each of `steps` training steps' backward on the shards of train_glob (its gradients in place to
    read), then runs that step's optimiser step."""
    args = track.resolve_args(argv)
    if getattr(args, "base", None) == "r18":
        yield from r18_trained_steps(args, train_glob, steps)
        return
    torch.manual_seed(0)
    model = track.GPT(track.model_config(args), max_seq_len=args.train_seq_len)
    opt = track.Optimizers(model, 0, 1, fused_adam=False, ns_dtype=torch.float32)
    proc = track.Dist()
    stream = TokenStream(find_shards(train_glob, "--train-files"), args.train_seq_len, "--train-files")
    window = torch.tensor(2)  # attention window in blocks
    for step in range(steps):
        track.train_step(model, stream.next_batch(proc.virtual_ranks), window, proc)
        yield model
        opt.step(step, args.num_iterations)


def r18_trained_steps(args, train_glob, steps):
    """trained_steps on --base r18: #18's model (bf16), its optimisers, BOS-aligned batches and windows."""
    from speedrun.distributed import Dist
    from speedrun.r18.data import BosAlignedStream
    from speedrun.r18.model import R18GPT
    from speedrun.r18.optim import R18Optimizers
    from speedrun.r18.train import Windows, forward_backward, r18_config, r18_schedule
    schedule = r18_schedule(args)
    torch.manual_seed(0)
    model = R18GPT(r18_config(args), studies=args).cast_low_precision(torch.bfloat16)
    opts, proc = R18Optimizers(model, schedule, compiled=False), Dist()
    stream = BosAlignedStream(find_shards(train_glob, "--train-files"), "--train-files")
    windows = Windows(model, schedule)
    for step in range(steps):
        windows.advance(step)
        forward_backward(model, stream.micro_batches(schedule.batch_size(step), 0, 1),
                         torch.tensor(schedule.mtp_weights(step)), (windows.short, windows.long), "sdpa", proc)
        yield model
        opts.step(step)
