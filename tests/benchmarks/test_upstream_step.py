"""benchmarks/upstream_step.py (its command: python benchmarks/upstream_step.py RECORD) on a stand-in record written here, not upstream's code: a
script of upstream's shape (torchrun's environment, CUDA, NCCL, a training loop at module level) measured by the
same meter as ours, its figures known by hand; the side-by-side lines; bad input refused in one line."""
from dataclasses import replace

import pytest
import torch

from benchmarks.step_cost import StepCost
from benchmarks.upstream_step import (RecordStep, Refusal, identify, main, measure_record, read_script, side_by_side,
                                      split_script)
from speedrun.logformat import SEPARATOR

T, D, V = 64, 16, 32  # tokens, width, vocabulary of the stand-in

STANDIN = f'''# stand-in record
import os
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

assert torch.cuda.is_available()
rank = int(os.environ["RANK"])
world_size = int(os.environ["WORLD_SIZE"])
dist.init_process_group(backend="nccl", device_id=torch.device("cuda", 0))
print("a line upstream prints")


class args:
    train_seq_len = {T}
    num_iterations = 10


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding({V}, {D})
        self.lm_head_w = nn.Parameter(torch.zeros({V}, {D}, device="cuda"))

    def forward(self, inputs, targets):
        logits = F.linear(self.embed(inputs), self.lm_head_w)
        return F.cross_entropy(logits, targets)


model = Model().cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model = torch.compile(model)
for step in range(args.num_iterations):
    # --- step ---
    inputs, targets = next(train_loader)
    model(inputs, targets).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
    opt.step()
    # --- end ---
    print(step)
'''

STANDIN_STEP = RecordStep("stand-in", "# stand-in record", head_end="for step in range(args.num_iterations):\n",
                          step_begin="    # --- step ---\n", step_end="    # --- end ---\n",
                          forward_backward="model(inputs, targets).backward()", prepare=lambda ns, step: None,
                          step_at=lambda ns, at: int(at * ns["args"].num_iterations),
                          batch=lambda ns, step: (torch.zeros(T, dtype=torch.int64),) * 2, ours=("small", ()))


def test_a_record_script_is_measured_as_ours_is():
    """Rank 0 of 8: the matmul's FLOPs forward (2 T D V) and backward (twice that: input and weight gradients),
    each gradient all-reduced (2 (W-1)/W of its bytes), SGD's momentum as the state, nothing printed."""
    cost = measure_record(STANDIN, STANDIN_STEP)
    param_bytes = 4 * 2 * V * D
    assert cost.params == 2 * V * D and cost.param_bytes == param_bytes
    assert cost.flops == {"forward": 2 * T * D * V, "backward": 4 * T * D * V, "optimizer": 0}
    assert cost.sent_bytes == 2 * 7 / 8 * param_bytes and cost.collectives == {"all_reduce calls": 2}
    assert cost.optimizer_state_bytes == param_bytes  # one momentum buffer per parameter
    assert cost.saved_bytes > 0 and cost.ops["forward mm"] == 1 and cost.ops["backward mm"] == 2
    assert cost.ops["optimizer clone"] == 2  # SGD's first step: each momentum buffer a copy of its gradient


def test_the_script_comes_from_a_record_log_or_is_the_file(tmp_path):
    log = tmp_path / "record.txt"
    log.write_text(STANDIN + SEPARATOR + "\nstep:1/10 train_time:1ms\n")
    script = tmp_path / "record.py"
    script.write_text(STANDIN)
    assert read_script(log) == read_script(script) == STANDIN
    assert identify(STANDIN, [STANDIN_STEP]) is STANDIN_STEP


def test_a_changed_script_is_refused_in_one_line():
    with pytest.raises(Refusal, match="forward-and-backward line: found 0 times"):
        split_script(STANDIN.replace("model(inputs, targets).backward()", "model(inputs).backward()"), STANDIN_STEP)
    with pytest.raises(Refusal, match="not the script of a record this measures"):
        identify("print(1)\n")


@pytest.mark.parametrize("text, problem", [(None, "No such file"), ("not python (\n", "neither a record log"),
                                           ("print(1)\n", "none of their marker lines")])
def test_the_command_refuses_bad_input(tmp_path, capsys, text, problem):
    path = tmp_path / "given.txt"
    if text is not None:
        path.write_text(text)
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert problem in err and err.count("\n") == 1


def test_side_by_side_gives_ratios_and_names_the_operations_that_differ():
    ours = StepCost("small", [], 8, 1, T, params=10, param_bytes=40, optimizer_state_bytes=80,
                    flops={"forward": 100, "backward": 200, "optimizer": 5}, saved_bytes=1000, peak_bytes=2000,
                    sent_bytes=70.0, sent_by_kind={"all_reduce": 70.0}, collectives={"all_reduce calls": 1},
                    ops={"forward mm": 1, "backward mm": 2})
    same = "\n".join(side_by_side(ours, ours, "#x"))
    assert "forward FLOPs" in same and same.count("1.000 (equal)") == 9 and "differ (0 of 2" in same
    upstream = replace(ours, saved_bytes=1250, ops={"forward mm": 1, "backward mm": 2, "forward neg": 30})
    lines = side_by_side(ours, upstream, "#x")
    assert any(line.startswith("saved for backward") and line.endswith("0.800") for line in lines)
    assert [line.split() for line in lines if "neg" in line] == [["forward", "neg", "0", "/", "30"]]


@pytest.mark.parametrize("at", ["1.5", "-0.1", "nan"])
def test_a_step_outside_the_schedule_is_refused_in_one_line_by_both_commands(capsys, at):
    from benchmarks import step_cost
    for command in (main, step_cost.main):
        with pytest.raises(SystemExit) as exit_:
            command(["record.log", "--at", at] if command is main else ["--at", at])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and f"argument --at: {at}: a fraction of the schedule, 0..1" in err
