"""Runs train_gpt.py's main with its argv; with MUON_SHARE_PARAMETERS=1 Muon shares the updated fp32 parameters
(the path before bf16 directions were shared) instead of the directions. tests/speedrun/test_overlapped_step.py compares
the two runs' final checkpoints."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
if os.environ.get("MUON_SHARE_PARAMETERS"):
    from speedrun.muon import Muon
    Muon.direction_is_exact_in_ns_dtype = lambda self, group: False
import train_gpt  # noqa: E402

if __name__ == "__main__":
    sys.exit(train_gpt.main(sys.argv[1:]))
