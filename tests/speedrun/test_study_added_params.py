"""The run log's added_params line (model.added_params(), measured on the built model: no study declares a count)
is what each study adds: for every bundled study arm at tiny size, as the compile matrix resolves it, its entries
name only the studies the arm switches on, once each, and sum to what the built model has beyond the flagless model
of the same depth (the checkpoint's depth for DLO), less the extra layers it reports against the preset; and the
extra layers are what the flagless model gains from the preset's depth to the run's."""
import importlib
from dataclasses import replace

import pytest
import torch

from speedrun.errors import UsageError
from speedrun.study import StudyHost
from speedrun.studies import STUDIES
from test_compile_matrix import bundled_arms, graph_structure, resolve


def build(model_class, cfg):
    with torch.device("meta"):  # no memory, no init cost
        return model_class(cfg, max_seq_len=1)


BASELINES = {}  # (class, repr(config)) -> parameters: many arms share a baseline


def params(model_class, cfg):
    key = (model_class, repr(cfg))
    if key not in BASELINES:
        BASELINES[key] = sum(p.numel() for p in build(model_class, cfg).parameters())
    return BASELINES[key]


def arm_cases():
    cases = {}
    for (script, flags, init_from), names in bundled_arms().items():
        track = importlib.import_module(script)
        cfg = track.model_config(resolve(track, list(flags), ["--preset", "tiny"], __file__ if init_from else None))
        # Initial values and which layer a skip reads change no count: one arm per structure and depth.
        cases.setdefault((script, graph_structure(cfg), cfg.num_layers), (track.GPT, cfg, names[0]))
    return list(cases.values())


def flagless(cfg, num_layers):
    """The model config with every study off (each model field at its default), at num_layers."""
    return replace(cfg, num_layers=num_layers,
                   **{name: default for study in cfg.studies for name, _, default in study.model_fields})


def measured(model_class, cfg):
    """(the added_params line's entries less the extra layers, what the built model has beyond its flagless
    model of the same depth)."""
    model = build(model_class, cfg)
    logged = model.added_params()
    logged.pop("layers", None)
    baseline = flagless(cfg, cfg.dlo_base_layers or cfg.num_layers)
    return logged, sum(p.numel() for p in model.parameters()) - params(model_class, baseline)


def test_every_bundled_study_arm_logs_what_its_studies_add():
    seen = set()
    for model_class, cfg, arm in arm_cases():
        logged, built = measured(model_class, cfg)
        assert sum(logged.values()) == built, (arm, logged, built)
        # each study once, under its own name (the gated skip's scalar once showed as a second key, gated_skip)
        assert logged.keys() <= {study.name for study in cfg.studies if study.in_model(cfg)}, (arm, logged)
        seen |= {name for name, n in logged.items() if n}
    assert seen == {study.name for study in STUDIES}  # the arms exercise every study


def test_extra_layers_are_what_the_flagless_model_gains_and_their_count_builds_only_the_runs_studies(monkeypatch):
    """Every bundled arm that keeps its depth's meaning (not DLO, whose parts grow the model from a checkpoint's
    depth), 2 layers deeper than it runs at tiny size: the added_params line's "layers" entry is the flagless
    model's parameters at that depth less at the preset's; and every model the count builds holds the run's study
    parts, none with the studies off (what lets an exported file hold its parts as constants)."""
    built, build_parts = [], StudyHost.build_parts

    def recording_build_parts(self, parts, cfg):
        built.append([name for name, _ in parts])
        return build_parts(self, parts, cfg)

    monkeypatch.setattr(StudyHost, "build_parts", recording_build_parts)
    checked, seen = set(), set()
    for (script, flags, init_from), names in bundled_arms().items():
        if init_from:
            continue
        track = importlib.import_module(script)
        shallow = resolve(track, list(flags), ["--preset", "tiny"], None)
        if getattr(shallow, "base", None) == "r18":  # #18's depth is the record's (no extra layers)
            continue
        cfg = track.model_config(track.resolve_args(["--preset", "tiny", *flags, "--num-layers",
                                                     str(shallow.num_layers + 2)]))
        key = (script, graph_structure(cfg), cfg.num_layers)
        if key in checked:
            continue
        checked.add(key)
        model = build(track.GPT, cfg)
        parts = dict(model.named_parts())
        if any(part.base_config(cfg) is not None for part in parts.values()):
            continue
        built.clear()
        added = model.added_params()
        # a model with no part on builds none (and holds no study container): nor does the count
        assert bool(built) == bool(parts) and all(names == list(parts) for names in built), (names[0], built)
        assert added["layers"] == (params(track.GPT, flagless(cfg, cfg.num_layers))
                                   - params(track.GPT, flagless(cfg, cfg.baseline_layers))), names[0]
        seen |= set(parts)
    assert seen == {study.name for study in STUDIES if not study.rebuilds_model}  # all but DLO's


@pytest.mark.parametrize("script", ["train_gpt_medium", "train_gpt"])
def test_a_model_with_no_study_on_holds_no_study_container_and_trains_the_track_params_alone(script):
    """No study on: no `study` container, no part, no added params; Muon gets the blocks' matrices and Adam's
    embedding group the track's tables, as with a study on that adds none (a lambda in the scalar vector)."""
    track = importlib.import_module(script)
    plain = build(track.GPT, track.model_config(track.resolve_args(["--preset", "tiny"])))
    assert plain.parts == () and not hasattr(plain, "study") and not hasattr(plain, "extra_param_counts")
    assert plain.added_params() == {} and plain.flagless_params() == sum(p.numel() for p in plain.parameters())
    lambdas = build(track.GPT, track.model_config(track.resolve_args(["--preset", "tiny", "--backout-layers", "2"])))
    assert [name for name, _ in lambdas.named_parts()] == ["backout"]
    for model in (plain, lambdas):
        matrices = [p for block in model.blocks for p, _ in model.block_matrix_params(block)]
        assert [p for p, _ in model.matrix_params()] == matrices
        assert model.embedding_params() == model.track_embedding_params()
    assert lambdas.added_params() == {"backout": 2}
    with_tables = build(track.GPT, track.model_config(track.resolve_args(
        ["--preset", "tiny", "--backout-layers", "2,new-embed"])))
    tables = [m.weight for m in with_tables.study.modules() if isinstance(m, torch.nn.Embedding)]
    assert tables and with_tables.embedding_params() == with_tables.track_embedding_params() + tables
    assert not {id(p) for p in tables} & {id(p) for p, _ in with_tables.matrix_params()}


@pytest.mark.parametrize("flags", [["--backout-layers", "3,embed,new-embed", "--backout-mode", "subtract",
                                    "--backout-transform", "tanh-linear", "--backout-freeze"],
                                   ["--backout-layers", "2", "--backout-fixed-x"],
                                   ["--laurel", "rw+pa", "--laurel-rw-form", "vector", "--laurel-where", "both"],
                                   ["--laurel", "rw+lr", "--laurel-rw-form", "single", "--laurel-where", "attn"]])
def test_logged_count_of_flag_sets_beyond_the_arms(flags):
    track = importlib.import_module("train_gpt_medium")
    cfg = track.model_config(track.resolve_args(["--preset", "tiny"] + flags))
    logged, built = measured(track.GPT, cfg)
    assert len(logged) == 1 and sum(logged.values()) == built, (logged, built)


def r18_arms():
    """{study name: [the model flags of each arm in the bundled study files that --base r18 runs]} for the arms
    that switch on one study (an arm refused on r18, by the study's own declaration or for a layer #18 lacks, is
    passed over), and the names of the studies no arm of which runs there."""
    import train_gpt_medium as T
    found, tried = {}, set()
    for (script, flags, init_from), _ in bundled_arms().items():
        if script != "train_gpt_medium":
            continue
        on = [study.name for study in STUDIES if study.flags[0].name in flags]  # a study's first flag: on
        if len(on) != 1:
            continue
        flags = (["--init-from", __file__] if init_from else []) + list(flags)
        tried.add(on[0])
        try:
            T.resolve_args(["--preset", "tiny", "--base", "r18", *flags])
        except UsageError:
            continue
        found.setdefault(on[0], []).append(flags)
    return found, tried - set(found)


def r18_model(*flags):
    import train_gpt_medium as T
    from speedrun.r18.model import R18GPT
    from speedrun.r18.train import r18_config
    config = T.resolve_args(["--preset", "tiny", "--base", "r18", *flags])
    with torch.device("meta"):
        return R18GPT(r18_config(config), studies=config)


def test_an_r18_model_with_no_study_on_holds_no_study_container():
    """#18's record model: no part, no `study` or study scalar vector, nothing added; with a study on, its part."""
    plain = r18_model()
    assert plain.parts == () and plain.added_params() == {}
    assert not any(hasattr(plain, name) for name in ("study", "study_scalars", "scalar_layout"))
    lambdas = r18_model("--backout-layers", "11")
    assert [name for name, _ in lambdas.named_parts()] == ["backout"] and hasattr(lambdas, "study_scalars")


def test_every_bundled_study_is_named_once_on_r18():
    """The added_params line on --base r18 names the study once, under its name, with everything it adds beyond the
    record's model (the naming rule is the #14 model's: speedrun.study.added_params_by_study)."""
    arms, refused = r18_arms()
    # every bundled study is checked: on r18 through one of its study files' arms, or refused there by its own
    # declaration (Study.on_r18)
    assert set(arms) | refused == {study.name for study in STUDIES}
    assert all(study.on_r18 is not None for study in STUDIES if study.name in refused)
    record = sum(p.numel() for p in r18_model().parameters())
    for name, flags in ((name, flags) for name, arms_of_study in arms.items() for flags in arms_of_study):
        model = r18_model(*flags)
        assert model.added_params() == {name: sum(p.numel() for p in model.parameters()) - record}, name
