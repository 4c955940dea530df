"""Record #18's schedules, all functions of the step: batch size (131k -> 524k tokens, then the extension's),
learning-rate multiplier (stepped up with the batch size, then a linear cooldown over the last 70% to 0.1),
attention windows in blocks (3 -> 23, 27 for the last validation), multi-token-prediction weights, NorMuon's
momentum, and the step at which the embedding is untied from the head."""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class R18Schedule:
    num_scheduled_iterations: int = 4700  # the lr, batch and window schedules span these steps
    num_extension_iterations: int = 40  # then this many at the final lr / windows / extension batch size
    batch_sizes: tuple = (131072, 262144, 393216) + (524288,) * 9  # tokens per step, one per twelfth
    extension_batch_size: int = 32 * 2048 * 8
    window_blocks: tuple = (3, 7, 11, 13, 15, 17, 19, 21) + (23,) * 4  # long window, one per twelfth
    final_window_blocks: int = 23  # the extension's long window
    validation_window_blocks: int = 27  # the last validation's long window
    short_window_cap: int = 11  # the short window is half the long one, at most this
    cooldown_frac: float = 0.70
    final_lr: float = 0.1
    split_embed_frac: float = 2 / 3 / 4
    # Only the first few window growths re-scale the rotary tables (YaRN): up to this many blocks.
    yarn_max_window_blocks: int = 13
    muon_warmup_steps: int = 300
    muon_cooldown_steps: int = 50
    muon_momentum_min: float = 0.85
    muon_momentum_max: float = 0.95

    @property
    def num_iterations(self):
        return self.num_scheduled_iterations + self.num_extension_iterations

    @property
    def split_step(self):
        """The embedding is untied from the head after this (odd) step's Adam update, so both tables leave with
        the same optimiser state."""
        return math.ceil(self.split_embed_frac * self.num_scheduled_iterations) | 1

    def _twelfth(self, step, table):
        return table[int(len(table) * (step / self.num_scheduled_iterations))]

    def batch_size(self, step):
        if step >= self.num_scheduled_iterations:
            return self.extension_batch_size
        return self._twelfth(step, self.batch_sizes)

    def windows(self, step):
        """(short, long) window in blocks."""
        if step >= self.num_scheduled_iterations:
            return self.final_window_blocks // 2, self.final_window_blocks
        long = self._twelfth(step, self.window_blocks)
        return min(self.short_window_cap, long // 2), long

    def lr(self, step):
        """Multiplier of every optimiser's initial lr. Larger batches take larger steps: 1, then (16/8)^0.6,
        (24/8)^0.5 and 2 at the twelfths where the batch grows."""
        if step > self.num_scheduled_iterations:
            return self.final_lr
        x = step / self.num_scheduled_iterations
        peak = 1.0
        for boundary, value in ((1 / 12, 1.52), (2 / 12, 1.73), (3 / 12, 2.0)):
            if x > boundary:
                peak = value
        if x >= 1 - self.cooldown_frac:
            w = (1 - x) / self.cooldown_frac
            return peak * w + (1 - w) * self.final_lr
        return peak

    def muon_momentum(self, step):
        """Linear warm-up from min to max, then down again over the last muon_cooldown_steps."""
        span = self.muon_momentum_max - self.muon_momentum_min
        cooldown_start = self.num_iterations - self.muon_cooldown_steps
        if step < self.muon_warmup_steps:
            return self.muon_momentum_min + step / self.muon_warmup_steps * span
        if step > cooldown_start:
            return self.muon_momentum_max - (step - cooldown_start) / self.muon_cooldown_steps * span
        return self.muon_momentum_max

    def mtp_weights(self, step):
        """Loss weights of the next 3, then 2, then 1 tokens over the first quarter of the schedule:
        [1, 0.5, 0.25 -> 0], then [1, 0.5 -> 0], then [1]."""
        x = step / (self.num_scheduled_iterations / 4)
        if x < 1 / 3:
            return [1.0, 0.5, 0.25 * (1 - 3 * x)]
        if x < 2 / 3:
            return [1.0, 0.5 * (1 - (3 * x - 1))]
        return [1.0]

    def window_changes(self):
        """Steps where the long window changes (0 first): upstream warms its compiled kernels around these."""
        steps, long = [0], self.windows(0)[1]
        for step in range(1, self.num_iterations):
            new = self.windows(step)[1]
            if new != long:
                steps.append(step)
                long = new
        return steps
