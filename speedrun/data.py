"""Token shards (their file format: data/shard_format.py) and the upstream token stream, identical at every world
size dividing VIRTUAL_RANKS."""

import glob

import torch

from data.shard_format import read_tokens_into, validate_nonempty_shard, validate_shard
from speedrun.errors import UsageError

VIRTUAL_RANKS = 8  # upstream's 8 GPUs: the unit of data parallelism every world size reproduces
BOS_TOKEN = 50256


def read_shard(path, pin=False):
    """The shard's tokens as a uint16 tensor (in pinned memory with pin=True, for asynchronous copies to the GPU),
    checked as data/shard_format.py reads them (header, size, every id inside GPT-2's vocabulary)."""
    count = validate_shard(path)
    tokens = torch.empty(count, dtype=torch.uint16, pin_memory=pin)
    read_tokens_into(path, count, tokens.numpy())
    return tokens


def find_shards(pattern, flag):
    """The files matching `pattern`, each checked (header and size, not the payload: cheap for any number of
    shards), so that a bad shard anywhere in the set stops the run before its log starts."""
    files = sorted(glob.glob(pattern))
    if not files:
        raise UsageError(f"{flag}: no files match {pattern!r}")
    for path in files:
        validate_nonempty_shard(path, f" ({flag})")
    return files


class TokenStream:
    """The upstream stream: files in name order, no wrap-around; each step takes VIRTUAL_RANKS sequences of
    seq_len(+1) tokens from `pos`, virtual rank v taking [pos + v*T, pos + (v+1)*T + 1). `load(path, pin)` reads a
    shard's tokens (anything with a length will do for following positions only, see check_stream_length)."""

    def __init__(self, files, seq_len, what, device="cpu", load=None):
        self.files, self.seq_len, self.what = files, seq_len, what
        self.device = torch.device(device)
        self.load = load or read_shard
        self.file_index, self.pos, self.tokens = -1, 0, None
        self._advance_file()

    def _advance_file(self):
        self.file_index += 1
        if self.file_index >= len(self.files):
            raise UsageError(f"{self.what}: ran out of tokens after {len(self.files)} file(s); "
                             f"download more shards or train for fewer steps")
        self.tokens, self.pos = self.load(self.files[self.file_index], self.device.type == "cuda"), 0

    def state(self):
        return dict(file_index=self.file_index, pos=self.pos)

    def restore(self, state):
        self.file_index = state["file_index"] - 1
        self._advance_file()
        self.pos = state["pos"]

    def take_step_start(self):
        """Where the next step's tokens start (in self.tokens, after moving to the next file when this one is used
        up); advances the stream by one step."""
        span = VIRTUAL_RANKS * self.seq_len
        if self.pos + span + 1 >= len(self.tokens):
            self._advance_file()
            if span + 1 >= len(self.tokens):
                raise UsageError(f"{self.files[self.file_index]}: shard has {len(self.tokens)} tokens, "
                                 f"fewer than one step's {span + 1}")
        start = self.pos
        self.pos += span
        return start

    def next_batch(self, virtual_ranks):
        """Returns [(inputs, targets)] (int64, on the stream's device) for the given virtual ranks of the next step,
        and advances the stream. Copies from pinned memory are asynchronous: no host sync per step."""
        step_start = self.take_step_start()
        out = []
        for v in virtual_ranks:
            start = step_start + v * self.seq_len
            chunk = self.tokens[start:start + self.seq_len + 1].to(self.device, non_blocking=True).long()
            out.append((chunk[:-1], chunk[1:]))
        return out


class _ShardLength:
    """Stands in for a shard's tokens where only their number matters (read from the header)."""

    def __init__(self, path, _pin=False):
        self.count = validate_shard(path)

    def __len__(self):
        return self.count


def check_stream_length(files, seq_len, steps, what):
    """Raises, before anything runs, the UsageError a TokenStream over `files` would raise within `steps` steps (a
    shard shorter than one step, too few tokens in all); reads only the shards' headers."""
    stream = TokenStream(files, seq_len, what, load=_ShardLength)
    for _ in range(steps):
        stream.take_step_start()
