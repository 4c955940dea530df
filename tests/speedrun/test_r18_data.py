"""speedrun.r18.data: record #18's BOS-aligned training batches and its validation slices. Equality with
upstream's loader is shown by the harness (benchmarks/results/2026-11-25_cpu_r18-optimizer-fidelity.txt)."""

import numpy as np
import pytest
import torch

from speedrun.data import BOS_TOKEN
from speedrun.errors import UsageError
from speedrun.r18.data import BosAlignedStream, ValidationStream, cu_seqlens_length, padded_cu_seqlens


def documents(lengths, seed=0):
    """A shard's tokens: documents of the given lengths, each BOS then non-BOS tokens."""
    rng = np.random.default_rng(seed)
    parts = [np.concatenate([[BOS_TOKEN], rng.integers(0, 50000, n - 1)]) for n in lengths]
    return torch.from_numpy(np.concatenate(parts).astype(np.uint16))


def shards(*token_arrays):
    by_name = {f"shard{i}": t for i, t in enumerate(token_arrays)}
    return list(by_name), by_name.__getitem__


def doc_lengths(seed, count=400):
    return np.random.default_rng(seed).integers(20, 700, count)


def test_sequences_start_at_documents_and_cu_seqlens_marks_each():
    files, load = shards(documents(doc_lengths(1)))
    stream = BosAlignedStream(files, load=load, max_doc_tokens=256)
    for inputs, targets, cu in stream.micro_batches(8 * 1024, rank=0, world_size=1):
        assert inputs.dtype == torch.int32 and targets.dtype == torch.int64 and cu.dtype == torch.int32
        assert inputs.numel() == 1024 and torch.equal(inputs[1:].long(), targets[:-1])
        assert cu.numel() == cu_seqlens_length(1024) and cu[0] == 0 and cu[-1] == 1024
        starts = cu[:-1][cu[1:] > cu[:-1]]  # non-empty documents
        assert bool((inputs[starts.long()] == BOS_TOKEN).all())
        assert int((inputs == BOS_TOKEN).sum()) == starts.numel()  # no document boundary unmarked
        assert int((cu[1:] - cu[:-1]).max()) <= 256  # documents cut to max_doc_tokens


def test_every_world_size_dividing_8_trains_on_the_same_tokens_per_step():
    files, load = shards(documents(doc_lengths(2)))

    def step_tokens(world_size):
        streams = [BosAlignedStream(files, load=load) for _ in range(world_size)]
        steps = []
        for bs in (4096, 4096, 8192):  # a batch-size change included
            per_rank = [s.micro_batches(bs, r, world_size) for r, s in enumerate(streams)]
            # sequence m * world_size + r is rank r's micro-batch m
            ordered = [per_rank[r][m] for m in range(8 // world_size) for r in range(world_size)]
            steps.append([torch.cat([x[0] for x in ordered]), [x[2] for x in ordered]])
        return steps

    reference = step_tokens(8)
    for world_size in (1, 2, 4):
        for (tokens, cus), (ref_tokens, ref_cus) in zip(step_tokens(world_size), reference):
            assert torch.equal(tokens, ref_tokens)
            assert all(torch.equal(a, b) for a, b in zip(cus, ref_cus))


def test_long_document_is_cut_and_its_remainder_skipped():
    files, load = shards(documents([10_000, 100, 5000] + [300] * 120, seed=3))
    stream = BosAlignedStream(files, load=load, max_doc_tokens=4096)
    first, second = stream.next_step(8 * 4200)[:2]  # sequences of 4201 tokens
    # 4096 of the first document, all of the second, then 5 of the third to fill the sequence
    assert first == ([0, 10_000, 10_100], [4096, 10_100, 10_105])
    assert second[0][0] == 15_100  # the next sequence starts at the next document, not inside the third


def test_shard_that_cannot_complete_a_step_is_left_for_the_next():
    first, second = documents([500] * 12, seed=4), documents([500] * 40, seed=5)
    files, load = shards(first, second)
    stream = BosAlignedStream(files, load=load)
    stream.next_step(8 * 500)  # 8 x 501 tokens: 16 documents' worth needed, the first shard has 12
    assert stream.file_index == 1
    inputs, _, _ = stream.micro_batches(8 * 500, rank=0, world_size=8)[0]
    assert torch.equal(inputs[:499].long(), second[8 * 1000 + 0:8 * 1000 + 499].long())  # 2 docs per sequence
    with pytest.raises(UsageError, match="ran out of documents after 2 file"):
        for _ in range(10):
            stream.next_step(8 * 500)


def test_restore_resumes_at_the_same_batch():
    files, load = shards(documents(doc_lengths(6)), documents(doc_lengths(7)))
    stream = BosAlignedStream(files, load=load)
    for _ in range(40):  # into the second shard
        stream.next_step(8 * 512)
    saved = stream.state()
    expected = stream.micro_batches(8 * 512, rank=1, world_size=2)
    resumed = BosAlignedStream(files, load=load)
    resumed.restore(saved)
    got = resumed.micro_batches(8 * 512, rank=1, world_size=2)
    assert saved["file_index"] == 1
    assert all(torch.equal(a, b) for x, y in zip(got, expected) for a, b in zip(x, y))


def test_validation_slices_are_consecutive_and_documents_start_at_bos():
    tokens = documents(doc_lengths(8, 100))
    files, load = shards(tokens)
    stream = ValidationStream(files, load=load)
    first = stream.micro_batches(8 * 256, rank=0, world_size=1)
    second = stream.micro_batches(8 * 256, rank=1, world_size=2)
    assert torch.equal(torch.cat([x[0] for x in first]).long(), tokens[:2048].long())
    assert torch.equal(second[0][0].long(), tokens[2048 + 256:2048 + 512].long())  # rank 1's first slice
    inputs, _, cu = first[0]
    bos = torch.nonzero(inputs == BOS_TOKEN)[:, 0]
    assert torch.equal(cu[1:bos.numel() + 1].long(), bos) and bool((cu[bos.numel() + 1:] == 256).all())


def test_cu_seqlens_room_and_overflow():
    assert cu_seqlens_length(100) == 128 and cu_seqlens_length(65536) == 256
    with pytest.raises(UsageError, match="more than the 127"):
        padded_cu_seqlens(np.arange(1, 129), 128)
