"""What both speedrun tracks share: data stream, distributed setup, run log, checkpoints, attention pieces, Muon,
the study-variant model machinery and the study flags (backout, LAuReL, DLO).

`train_gpt.py` (small track) and `train_gpt_medium.py` (medium track) each keep their own model, optimiser settings
and training loop, and import the rest from here.
"""

import os

if "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:  # before torch starts (scripts import speedrun first): less fragmentation
    os.environ.setdefault("PYTORCH_ALLOC_CONF", "expandable_segments:True")
