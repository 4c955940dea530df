"""speedrun.r18.schedule at the record's settings (4700 scheduled + 40 extension steps). Equality with
upstream's get_bs/get_ws/get_lr/get_muon_momentum and MTP table over every step is in the harness figures
(benchmarks/results/2026-11-25_cpu_r18-optimizer-fidelity.txt); these pin the shape of each schedule."""

import pytest

from speedrun.r18.schedule import R18Schedule

S = R18Schedule()


def test_batch_size_grows_131k_to_524k_in_the_first_quarter():
    assert S.num_iterations == 4740
    # one entry per twelfth of 4700 steps (391.7): 392 starts the second
    assert [S.batch_size(s) for s in (0, 391, 392, 783, 784, 1175, 4699, 4700, 4739)] == \
        [131072, 131072, 262144, 262144, 393216, 524288, 524288, 524288, 524288]


def test_lr_steps_up_with_the_batch_then_cools_down_to_a_tenth():
    assert S.lr(0) == 1.0 and S.lr(391) == 1.0 and S.lr(392) == 1.52 and S.lr(1000) == 1.73 and S.lr(1200) == 2.0
    cooldown_start = 1410  # 30% of 4700
    assert S.lr(cooldown_start - 1) == 2.0
    assert S.lr(3055) == pytest.approx(2.0 * 0.5 + 0.1 * 0.5)  # half way through the cooldown
    assert S.lr(4700) == pytest.approx(0.1) and S.lr(4739) == 0.1
    assert all(S.lr(s) >= S.lr(s + 1) for s in range(cooldown_start, 4739))


def test_windows_grow_from_3_to_23_blocks_short_half_capped_at_11():
    assert S.windows(0) == (1, 3) and S.windows(392) == (3, 7) and S.windows(784) == (5, 11)
    assert S.windows(3000) == (10, 21) and S.windows(3200) == (11, 23) and S.windows(4739) == (11, 23)
    assert S.window_changes()[:4] == [0, 392, 784, 1175]


def test_multi_token_weights_fade_over_the_first_quarter():
    assert S.mtp_weights(0) == [1.0, 0.5, 0.25]
    assert S.mtp_weights(391)[2] == pytest.approx(0, abs=1e-3)
    assert len(S.mtp_weights(392)) == 2 and S.mtp_weights(392)[1] == pytest.approx(0.5, abs=1e-3)
    assert S.mtp_weights(783)[1] == pytest.approx(0, abs=1e-3) and S.mtp_weights(784) == [1.0]


def test_untie_step_is_odd_after_a_sixth_and_momentum_warms_and_cools():
    assert S.split_step == 785 and S.split_step % 2 == 1
    assert S.muon_momentum(0) == 0.85 and S.muon_momentum(150) == pytest.approx(0.9)
    assert S.muon_momentum(300) == 0.95 and S.muon_momentum(4690) == 0.95
    assert S.muon_momentum(4740) == pytest.approx(0.85)
