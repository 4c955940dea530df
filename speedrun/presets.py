"""The presets both tracks build theirs from: a record's shared validation and data, and the CPU-sized one.
Their own module so that an exported file opens with the run's hyperparameters (speedrun/export.py, FILE_PARTS)."""


def record_preset(**sizes_and_schedule):
    """A track's record preset: its model sizes, train_seq_len and num_iterations, plus what both tracks' records
    share: 10,485,760 validation tokens in sequences of 4 x 64 x 1024, every 125 steps, on the FineWeb10B shards."""
    return dict(val_seq_len=4 * 64 * 1024, val_tokens=10_485_760, val_every=125,
                train_files="data/fineweb10B/fineweb_train_*.bin", val_files="data/fineweb10B/fineweb_val_*.bin",
                **sizes_and_schedule)


def tiny_preset(num_layers):
    """The CPU-sized preset of a track: trains on the bundled demo shards in seconds per step."""
    return dict(num_layers=num_layers, model_dim=64, num_heads=2, head_dim=32, block_size=16, max_window_tokens=48,
                train_seq_len=64, val_seq_len=128, val_tokens=2048, num_iterations=40, val_every=10,
                train_files="data/demo/demo_train_*.bin", val_files="data/demo/demo_val_*.bin")
