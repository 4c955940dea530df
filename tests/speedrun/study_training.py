"""A study's tiny model trained a few steps inside the test process (no subprocess, a fast test): what a study's
test needs to see its parameters learn (docs/adding-a-study.md, section 5)."""
import torch

from speedrun.data import TokenStream, find_shards


def trained_steps(track, argv, train_glob, steps):
    """Yields the model of the track module (train_gpt_medium or train_gpt) at argv, seed 0, after each of `steps`
    training steps' backward on the shards of train_glob (its gradients in place to read), then runs that step's
    optimiser step."""
    args = track.resolve_args(argv)
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
