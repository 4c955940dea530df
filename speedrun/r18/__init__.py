"""Record #18 (medium, 2025-12-31) as a base, `train_gpt_medium.py --base r18`: its attention, model, optimisers,
batches, schedules, training run and the rule for the study flags on it. A subpackage so runs of the #14 and small
tracks log exactly the modules they use."""
