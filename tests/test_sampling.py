"""Tunable sampling (meshrun.text.complete.Sampling): greedy by default; temperature, top_k, top_p
and a seed map to KerasHub's samplers; every bad setting is one line naming its key or flag, for
`train.sample_*` before anything runs and for `meshrun generate`; a completion stops at the first
of several stop tokens; the padding of a prompt batch is never a stop token. A tiny Gemma preset
(tests/presets.py) on a 2x4 mesh of emulated CPU devices: the same seed gives the same text in two
calls, another seed other text, top_k=1 the greedy text. The runs themselves (train.sample_* and
meshrun generate with the same seed, across processes) are in tests/test_generate.py."""

import numpy as np
import pytest

from conftest import error_line_here, layout_rules
from meshrun.errors import ConfigError
from meshrun.text.complete import (
    GREEDY,
    Sampling,
    SamplingKeys,
    check_sampling,
    check_top_k,
    completion_ids,
    generation_pad,
    stop_ids,
)
from meshrun.text.examples import Framing

KEYS = SamplingKeys(temperature="t", top_k="k", top_p="p", seed="s")


@pytest.mark.parametrize(
    "sampling, sampler",
    [
        (Sampling(), "greedy"),
        (Sampling(temperature=0), "greedy"),
        (Sampling(temperature=0.7), "random"),
        (Sampling(top_k=5), "top_k"),
        (Sampling(top_p=0.9), "top_p"),
        (Sampling(temperature=1.5, top_k=5, top_p=0.9), "top_p"),
    ],
)
def test_each_setting_maps_to_its_keras_hub_sampler(sampling, sampler):
    made = sampling.make_sampler()
    assert sampling.sampler_name == sampler
    assert (
        type(made).__name__
        == {
            "greedy": "GreedySampler",
            "random": "RandomSampler",
            "top_k": "TopKSampler",
            "top_p": "TopPSampler",
        }[sampler]
    )
    if sampler != "greedy":
        assert made.temperature == (sampling.temperature or 1.0) and made.seed == sampling.seed
    if sampler == "top_p":
        assert made.p == sampling.top_p and made.k == sampling.top_k


def test_the_record_says_greedy_or_the_settings_drawn_with():
    from meshrun.specs.figure_text import sampling_text

    assert GREEDY.record() == {
        "sampler": "greedy",
        "temperature": None,
        "top_k": None,
        "top_p": None,
        "seed": None,
    }
    drawn = Sampling(top_k=40, top_p=0.9, seed=3).record()
    assert drawn == {"sampler": "top_p", "temperature": 1.0, "top_k": 40, "top_p": 0.9, "seed": 3}
    assert sampling_text(GREEDY.record()) == sampling_text(None) == "greedy"
    assert sampling_text(drawn) == "drawn: temperature 1.0, top_k 40, top_p 0.9, seed 3"


@pytest.mark.parametrize(
    "record, first", [(None, "greedy"), (Sampling(temperature=0.8, seed=7).record(), "drawn")]
)
def test_the_summary_says_how_the_samples_were_picked(record, first):
    from meshrun.specs.metrics import RunMetrics

    sample = {"prompt": "The cat", "completion": " sat", **({"sampling": record} if record else {})}
    metrics = RunMetrics.from_json({"status": "ok", "samples": [sample]})
    lines = dict(metrics.summary())["samples"].splitlines()
    assert lines[0] == ("greedy" if first == "greedy" else "drawn: temperature 0.8, seed 7")
    assert lines[1] == "'The cat' -> ' sat'"


@pytest.mark.parametrize(
    "sampling, expected",
    [
        (Sampling(temperature=-0.5), "t: got -0.5; expected a number of 0 or more"),
        (Sampling(temperature=float("nan")), "t: got nan"),
        (Sampling(temperature=float("inf")), "t: got inf"),
        (Sampling(temperature="hot"), "t: got 'hot'"),
        (Sampling(top_k=0), "k: got 0; expected a whole number of 1 or more"),
        (Sampling(top_k="2.5"), "k: got '2.5'"),
        (Sampling(top_p=0), "p: got 0; expected a number over 0, up to 1"),
        (Sampling(top_p=1.5), "p: got 1.5"),
        (Sampling(seed=-1), "s: got -1; expected a whole number from 0 to 4294967295"),
        (Sampling(seed=2**32), "s: got 4294967296"),
        (Sampling(temperature=0, top_k=3), "t: got 0 (greedy) with k set"),
        (Sampling(temperature=0.0, top_p=0.5), "t: got 0 (greedy) with p set"),
    ],
)
def test_a_bad_setting_is_one_line_naming_its_key(sampling, expected):
    with pytest.raises(ConfigError) as err:
        check_sampling(sampling, KEYS)
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)


def test_good_settings_pass_and_top_k_is_checked_against_the_vocabulary():
    for good in (
        GREEDY,
        Sampling(temperature=0),
        Sampling(temperature=2.0, top_k=1, top_p=1.0, seed=2**32 - 1),
    ):
        assert check_sampling(good, KEYS) is good
    check_top_k(Sampling(top_k=512), 512, "k")
    with pytest.raises(ConfigError, match="k: got 513, more than the model's vocabulary of 512 tokens"):
        check_top_k(Sampling(top_k=513), 512, "k")


class StopListTokenizer:
    stop_ids = (7, 3, 9)


def test_the_stop_tokens_are_the_end_token_then_the_tokenizers_own_each_once():
    framing = Framing(start=2, end=3, pad=0)
    assert stop_ids(StopListTokenizer(), framing) == [3, 7, 9]
    assert stop_ids(object(), framing) == [3]  # a tokenizer without a stop list
    assert stop_ids(StopListTokenizer(), Framing(start=2, end=None, pad=0)) == [7, 3, 9]
    assert stop_ids(object(), Framing(start=2, end=None, pad=0)) == []


def test_a_completion_stops_at_the_first_of_several_stop_tokens():
    row = np.array([5, 6, 11, 12, 9, 13, 7, 14])  # a prompt of 2, then the generated tokens
    assert completion_ids(row, 2, [7, 9]).tolist() == [11, 12]
    assert completion_ids(row, 2, [7]).tolist() == [11, 12, 9, 13]
    assert completion_ids(row, 2, [5, 6]).tolist() == [11, 12, 9, 13, 7, 14]  # in the prompt: no stop
    assert completion_ids(row, 2, []).tolist() == [11, 12, 9, 13, 7, 14]


def test_the_padding_is_never_a_stop_token():
    assert generation_pad([]) == 0
    assert generation_pad([1, 2]) == 0
    assert generation_pad([0, 1, 3]) == 2


# --- train.sample_* and meshrun generate: bad settings, one line, exit 2 ----------------------------

BAD_SETTINGS = [
    ("train.sample_temperature=-1", "train.sample_temperature: got -1.0; expected a number of 0 or more"),
    ("train.sample_top_k=0", "train.sample_top_k: got 0; expected a whole number of 1 or more"),
    ("train.sample_top_p=1.5", "train.sample_top_p: got 1.5; expected a number over 0, up to 1"),
    ("train.sample_top_p=0", "train.sample_top_p: got 0.0; expected a number over 0, up to 1"),
    ("train.sample_seed=-3", "train.sample_seed: got -3; expected a whole number from 0 to 4294967295"),
]


@pytest.mark.parametrize("setting, expected", BAD_SETTINGS)
def test_a_bad_train_sample_setting_is_one_line_before_anything_runs(setting, expected, in_tmp, capsys):
    """Checked whatever the model, with or without prompts: a dense model on 2x4, no prompts."""
    assert expected in error_line_here(["train", "model=dense_model", "mesh=2x4", setting], capsys)
    assert not list(in_tmp.rglob("metrics.json"))


def test_greedy_with_a_top_k_is_one_line(in_tmp, capsys):
    line = error_line_here(
        ["train", "model=dense_model", "mesh=2x4", "train.sample_temperature=0", "train.sample_top_k=5"],
        capsys,
    )
    assert "train.sample_temperature: got 0 (greedy) with train.sample_top_k set" in line


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--temperature", "warm"], "--temperature: got 'warm'; expected a number of 0 or more"),
        (["--temperature=-1"], "--temperature: got -1.0"),
        (["--temperature", "nan"], "--temperature: got nan"),
        (["--top-k", "0"], "--top-k: got 0; expected a whole number of 1 or more"),
        (["--top-k", "2.5"], "--top-k: got '2.5'"),
        (["--top-p", "0"], "--top-p: got 0.0; expected a number over 0, up to 1"),
        (["--top-p", "2"], "--top-p: got 2.0"),
        (["--seed", "x"], "--seed: got 'x'; expected a whole number from 0 to 4294967295"),
        (["--seed", "-1"], "--seed: got -1"),
        (["--temperature", "0", "--top-p", "0.9"], "--temperature: got 0 (greedy) with --top-p set"),
        (["--top-k"], "--top-k: got nothing; give K after it"),
    ],
)
def test_a_bad_sampling_flag_of_generate_is_one_line(flags, expected, tmp_path, capsys):
    """The flags are read before the run dir is (this one does not exist)."""
    line = error_line_here(["generate", str(tmp_path / "run"), "--prompt", "x", *flags], capsys)
    assert line.startswith(expected) or expected in line


def test_generate_reads_the_sampling_flags():
    from meshrun.generate import parse_request

    request = parse_request(["run", "--prompt", "x", "--temperature", "0.8", "--top-k=40", "--top-p", "0.9"])
    assert request.sampling == Sampling(temperature=0.8, top_k=40, top_p=0.9, seed=0)
    assert parse_request(["run", "--prompt", "x", "--seed", "5"]).sampling == Sampling(seed=5)
    assert parse_request(["run", "--prompt", "x"]).sampling == GREEDY


# --- a tiny Gemma on 2x4: seeds ------------------------------------------------------------------

PROMPTS = ["The cat", "A", "Every morning the old farmer walks"]
MAX_LENGTH = 24


@pytest.fixture(scope="module")
def on_the_mesh(text_files):
    """complete() with the tiny Gemma preset (untrained: its distribution is wide) under gemma_tp on
    2x4: a function of a Sampling giving the completions of PROMPTS."""
    import jax
    import keras
    import keras_hub

    from meshrun.config.layout_schema import LayoutRule, MeshConfig
    from meshrun.placement import distribution as distribution_lib
    from meshrun.text.complete import complete
    from meshrun.text.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(text_files.gemma), "model.preset")
    mesh = MeshConfig(shape=(2, 4), axis_names=("data", "model"), batch_axis="data")
    rules = tuple(LayoutRule(pattern, tuple(axes)) for pattern, axes in layout_rules("gemma_tp").items())
    keras.distribution.set_distribution(distribution_lib.make_distribution(mesh, rules, jax.devices()))
    try:
        model = keras_hub.models.CausalLM.from_preset(str(text_files.gemma), preprocessor=None, compile=False)
        framing = Framing(start=tokenizer.start_id, end=tokenizer.end_id, pad=tokenizer.pad_id)
        yield lambda sampling: complete(
            model, tokenizer, framing, PROMPTS, MAX_LENGTH, 2, "key", "length_key", sampling
        )
    finally:
        distribution_lib.reset()


@pytest.mark.integration
def test_the_same_seed_gives_the_same_text_and_another_seed_other_text(on_the_mesh):
    hot = Sampling(temperature=3.0, seed=11)
    first = on_the_mesh(hot)
    assert on_the_mesh(hot) == first  # a fresh seed generator every call
    assert on_the_mesh(Sampling(temperature=3.0, seed=12)) != first
    assert any(first)
    top = Sampling(temperature=2.0, top_k=20, top_p=0.95, seed=11)
    assert on_the_mesh(top) == on_the_mesh(top)


@pytest.mark.integration
def test_top_k_of_1_is_greedy(on_the_mesh):
    assert (
        on_the_mesh(Sampling(top_k=1, seed=4)) == on_the_mesh(GREEDY) == on_the_mesh(Sampling(temperature=0))
    )
