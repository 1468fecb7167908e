"""Engine file names and sidecar keys cover every build option; a match is reused."""

import dataclasses

import pytest
from tiny_models import TINY_GQA

from trt_kv.builder import Routes
from trt_kv.errors import ArgumentError
from trt_kv.jobs import (
    BuildOptions,
    build_model_engine,
    find_model_engine,
    model_engine_path,
)
from trt_kv.models.llama import LlamaConfig, random_weights


def test_default_key_names_dtype_and_every_shape():
    assert BuildOptions().key() == "float16-s512-b8-t128"


def test_options_off_their_default_join_the_key():
    routes = Routes(attention="primitive", cache_update="plugin", key_value_lengths=True)
    options = BuildOptions("bfloat16", 256, 4, 64, all_logits=True, routes=routes)
    assert options.key() == (
        "bfloat16-s256-b4-t64-all_logits-attention_primitive.cache_update_plugin.key_value_lengths"
    )


def test_weights_in_the_activation_dtype_are_the_default_engine():
    assert BuildOptions(weight_format="float16") == BuildOptions()
    assert BuildOptions(weight_format="keep").key() == "float16-s512-b8-t128-weights_keep"


def test_a_new_build_option_joins_the_key_without_other_edits():
    @dataclasses.dataclass(frozen=True)
    class Routed(BuildOptions):
        route: str = "auto"
        parts: tuple = ()

    assert Routed().key() == "float16-s512-b8-t128"
    assert Routed(route="attention-v2").key() == "float16-s512-b8-t128-route_attention_v2"
    digest = Routed(parts=("a", "b")).key().rsplit("-", 1)[1]
    assert digest.startswith("parts_") and len(digest) == len("parts_") + 8


def test_every_option_pair_gives_another_file_name(tmp_path):
    variants = [
        BuildOptions(),
        BuildOptions(dtype="float32"),
        BuildOptions(max_seq_len=256),
        BuildOptions(max_batch=4),
        BuildOptions(max_step_tokens=64),
        BuildOptions(all_logits=True),
        BuildOptions(routes=Routes(cache_update="plugin")),
        BuildOptions(routes=Routes(rope="elementwise")),
        BuildOptions(weight_format="keep"),
        BuildOptions(weight_format="int4"),
    ]
    paths = {model_engine_path("m", v, tmp_path) for v in variants}
    assert len(paths) == len(variants)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("engines")
    options = {"dtype": "float32", "max_seq_len": 16, "max_batch": 2, "max_step_tokens": 4}
    return (
        out,
        BuildOptions(**options),
        build_model_engine("tiny", TINY_GQA, random_weights(TINY_GQA), out_dir=out, **options),
    )


def test_sidecar_holds_the_options_and_the_build_time(built):
    engine = built[2]
    assert engine.path.name == "tiny-float32-s16-b2-t4.engine"
    assert engine.meta.metadata["build_options"] == {
        "dtype": "float32",
        "max_seq_len": 16,
        "max_batch": 2,
        "max_step_tokens": 4,
        "all_logits": False,
        "routes": {
            "attention": "auto",
            "rope": "auto",
            "cache_update": "auto",
            "key_value_lengths": False,
        },
        "weight_format": None,
    }
    assert engine.built_at.endswith("Z") and not engine.reused


def test_the_same_options_and_config_find_the_engine_as_reused(built):
    out, options, engine = built
    found = find_model_engine("tiny", TINY_GQA, options, out)
    assert found is not None and found.reused
    assert (found.path, found.meta) == (engine.path, engine.meta)


def test_another_config_or_option_finds_nothing(built):
    out, options, _ = built
    other = LlamaConfig(**{**dataclasses.asdict(TINY_GQA), "rms_norm_eps": 1e-3})
    assert other != TINY_GQA
    assert find_model_engine("tiny", other, options, out) is None
    assert find_model_engine("tiny", TINY_GQA, BuildOptions(max_seq_len=17), out) is None


def test_a_tampered_engine_is_not_reused(built, tmp_path):
    out, options, engine = built
    copy = tmp_path / engine.path.name
    copy.write_bytes(engine.path.read_bytes()[:-1] + b"\0")
    (tmp_path / (engine.path.name + ".json")).write_text(
        (out / (engine.path.name + ".json")).read_text()
    )
    assert find_model_engine("tiny", TINY_GQA, options, tmp_path) is None


@pytest.mark.parametrize(
    "sidecar",
    [b"", b"\xff\xfe", b"[]", b'{"format": 1}', b'{"format": 99}'],
    ids=["empty", "not-utf8", "not-an-object", "missing-fields", "other-format"],
)
def test_a_malformed_sidecar_means_rebuild_not_a_crash(built, tmp_path, sidecar):
    _, options, engine = built
    (tmp_path / engine.path.name).write_bytes(engine.path.read_bytes())
    (tmp_path / (engine.path.name + ".json")).write_bytes(sidecar)
    assert find_model_engine("tiny", TINY_GQA, options, tmp_path) is None


def test_max_step_tokens_defaults_to_128_or_s_max_when_smaller():
    assert BuildOptions(max_seq_len=32).key() == "float16-s32-b8-t32"
    assert BuildOptions(max_seq_len=32, max_step_tokens=8).key() == "float16-s32-b8-t8"


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        (
            "t",
            {"max_seqlen": 64},
            r"options: expected BuildOptions fields \['dtype', 'max_seq_len', 'max_batch', "
            r"'max_step_tokens', 'all_logits', 'routes', 'weight_format'\], got \['max_seqlen'\]",
        ),
        ("../t", {}, r"name: expected a file-name part \(no path separator\), got '../t'"),
        ("", {}, r"name: expected a file-name part \(no path separator\), got ''"),
    ],
)
def test_an_unknown_option_or_a_name_with_a_path_is_refused_before_building(
    tmp_path, name, options, message
):
    """The first was a TypeError from the dataclass; the second wrote outside ``out_dir``."""
    weights = random_weights(TINY_GQA, seed=0)
    with pytest.raises(ArgumentError, match=f"^{message}$"):
        build_model_engine(name, TINY_GQA, weights, out_dir=tmp_path, max_seq_len=16, **options)
    assert not any(tmp_path.parent.glob("t-*.engine")) and not any(tmp_path.iterdir())
