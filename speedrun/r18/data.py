"""Record #18's batches: every sequence starts at a document's first token (BOS) and packs whole documents, each
cut to at most MAX_DOC_TOKENS, until it holds its share of the step's tokens (+1 for the shifted targets); the
model attends within documents, told where they start by `cu_seqlens`. Validation reads the stream as it is
(no alignment), documents found at BOS tokens.

A step is cut into VIRTUAL_RANKS sequences at every world size, the way the record's 8 GPUs took it (one
sequence each): rank r's micro-batch m is sequence m * world_size + r (the order upstream's loader gives at
world sizes below 8), so every world size dividing 8 trains on the same tokens per step. A shard whose BOS
tokens run out before a step's 8 sequences are complete is left for the next one (as on 8 GPUs)."""

import numpy as np
import torch

from speedrun.data import BOS_TOKEN, VIRTUAL_RANKS, read_shard
from speedrun.errors import UsageError

MAX_DOC_TOKENS = 4096  # a document longer than this is cut (its remainder skipped)
MEAN_DOC_TOKENS_BOUND = 300  # cu_seqlens has room for one document per this many tokens (median is ~400)
CU_SEQLENS_MULTIPLE = 128  # ... rounded up to this, so its length changes only with the batch size


def cu_seqlens_length(num_tokens):
    """Fixed length of cu_seqlens for sequences of num_tokens (compiled code sees one shape per batch size)."""
    want = num_tokens // MEAN_DOC_TOKENS_BOUND
    return max(CU_SEQLENS_MULTIPLE, -(-want // CU_SEQLENS_MULTIPLE) * CU_SEQLENS_MULTIPLE)


def padded_cu_seqlens(doc_ends, num_tokens):
    """[0, doc ends..., then num_tokens repeated] (empty documents) to cu_seqlens_length(num_tokens)."""
    out = torch.full((cu_seqlens_length(num_tokens),), num_tokens, dtype=torch.int32)
    if len(doc_ends) + 1 > out.numel():
        raise UsageError(f"{len(doc_ends)} documents in a sequence of {num_tokens} tokens: more than the "
                         f"{out.numel() - 1} cu_seqlens has room for")
    out[0] = 0
    out[1:len(doc_ends) + 1] = torch.as_tensor(doc_ends, dtype=torch.int32)
    return out


def sequence_tokens(step_tokens):
    if step_tokens % VIRTUAL_RANKS:
        raise UsageError(f"batch of {step_tokens} tokens does not split into {VIRTUAL_RANKS} sequences")
    return step_tokens // VIRTUAL_RANKS


class _ShardUsedUp(Exception):
    pass


class BosAlignedStream:
    """The training stream over `files` (name order, no wrap-around). `state()`/`restore()` give the position
    for checkpoints. `load(path)` reads a shard's tokens (default: speedrun.data.read_shard)."""

    def __init__(self, files, what="train", max_doc_tokens=MAX_DOC_TOKENS, load=None):
        self.files, self.what, self.max_doc_tokens = files, what, max_doc_tokens
        self.load = load or read_shard
        self.file_index = -1
        self._next_file()

    def _next_file(self, next_bos=0):
        self.file_index += 1
        if self.file_index >= len(self.files):
            raise UsageError(f"{self.what}: ran out of documents after {len(self.files)} file(s); "
                             f"download more shards or train for fewer steps")
        self.tokens = self.load(self.files[self.file_index])
        self.bos = np.flatnonzero(self.tokens.numpy() == BOS_TOKEN)
        self.next_bos = next_bos  # index into self.bos of the next sequence's first document

    def state(self):
        return dict(file_index=self.file_index, next_bos=self.next_bos)

    def restore(self, state):
        self.file_index = state["file_index"] - 1
        self._next_file(state["next_bos"])

    def _documents(self, first_bos, need):
        """(starts, ends, next BOS index) of the documents making one sequence of `need` tokens."""
        starts, ends, got, i = [], [], 0, first_bos
        while got < need:
            if i >= len(self.bos):
                raise _ShardUsedUp
            start = int(self.bos[i])
            doc_end = int(self.bos[i + 1]) if i + 1 < len(self.bos) else len(self.tokens)
            end = min(doc_end, start + self.max_doc_tokens, start + need - got)
            starts.append(start)
            ends.append(end)
            got, i = got + end - start, i + 1
        return starts, ends, i

    def next_step(self, step_tokens):
        """The step's VIRTUAL_RANKS sequences, each (starts, ends) in the current shard, sequence_tokens + 1
        tokens long; moves to the next shard when this one cannot complete them."""
        need = sequence_tokens(step_tokens) + 1
        while True:
            sequences, i = [], self.next_bos
            try:
                for _ in range(VIRTUAL_RANKS):
                    starts, ends, i = self._documents(i, need)
                    sequences.append((starts, ends))
            except _ShardUsedUp:
                self._next_file()
                continue
            self.next_bos = i
            return sequences

    def micro_batches(self, step_tokens, rank, world_size):
        """This rank's 8 // world_size micro-batches of the next step: (inputs int32, targets int64, cu_seqlens
        int32), each input sequence_tokens(step_tokens) long."""
        sequences = self.next_step(step_tokens)
        return [self._tensors(*sequences[m * world_size + rank]) for m in range(VIRTUAL_RANKS // world_size)]

    def _tensors(self, starts, ends):
        buf = torch.cat([self.tokens[s:e] for s, e in zip(starts, ends)])
        lengths = np.subtract(ends, starts)
        lengths[-1] -= 1  # the last token is only a target
        num_tokens = buf.numel() - 1
        return (buf[:-1].to(torch.int32), buf[1:].to(torch.int64),
                padded_cu_seqlens(np.cumsum(lengths), num_tokens))


class ValidationStream:
    """Validation: consecutive slices of the stream, step_tokens // VIRTUAL_RANKS each, documents starting at
    each BOS token (cu_seqlens has an empty first document when a slice starts with BOS, as upstream)."""

    def __init__(self, files, what="val", load=None):
        self.files, self.what = files, what
        self.load = load or read_shard
        self.file_index, self.pos = 0, 0
        self.tokens = self.load(files[0])

    def micro_batches(self, step_tokens, rank, world_size):
        per_sequence = sequence_tokens(step_tokens)
        if self.pos + step_tokens + 1 >= len(self.tokens):
            self.file_index, self.pos = self.file_index + 1, 0
            if self.file_index >= len(self.files):
                raise UsageError(f"{self.what}: ran out of tokens after {len(self.files)} file(s)")
            self.tokens = self.load(self.files[self.file_index])
        out = []
        for m in range(VIRTUAL_RANKS // world_size):
            start = self.pos + (m * world_size + rank) * per_sequence
            buf = self.tokens[start:start + per_sequence + 1]
            inputs = buf[:-1]
            bos = torch.nonzero(inputs == BOS_TOKEN)[:, 0]
            out.append((inputs.to(torch.int32), buf[1:].to(torch.int64), padded_cu_seqlens(bos, per_sequence)))
        self.pos += step_tokens
        return out
