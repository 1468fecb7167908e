"""Engine file names and sidecar keys cover every build option; a match is reused."""

import dataclasses

import pytest

from tests.support.tiny_models import TINY_GQA, tiny_llama
from trt_kv.builder import Routes
from trt_kv.engine.file import sidecar_path
from trt_kv.engine.store import (
    BuildOptions,
    build_model_engine,
    find_model_engine,
    model_engine_path,
    weights_digest,
)
from trt_kv.errors import ArgumentError
from trt_kv.models.llama import random_weights


def test_default_key_names_dtype_every_shape_and_k():
    assert BuildOptions().key() == "float16-s512-b8-t128-k1"


def test_options_off_their_default_join_the_key():
    routes = Routes(attention="primitive", cache_update="plugin", key_value_lengths=True)
    options = BuildOptions("bfloat16", 256, 4, 64, all_logits=True, routes=routes)
    assert options.key() == (
        "bfloat16-s256-b4-t64-all_logits-attention_primitive.cache_update_plugin.key_value_lengths"
        "-k0"
    )


def test_weights_in_the_activation_dtype_are_the_default_engine():
    assert BuildOptions(weight_format="float16") == BuildOptions()
    assert BuildOptions(weight_format="keep").key() == "float16-s512-b8-t128-weights_keep-k1"


def test_a_new_build_option_joins_the_key_without_other_edits():
    @dataclasses.dataclass(frozen=True)
    class Routed(BuildOptions):
        route: str = "auto"
        parts: tuple = ()

    assert Routed().key() == "float16-s512-b8-t128-k1"
    assert Routed(route="attention-v2").key() == "float16-s512-b8-t128-k1-route_attention_v2"
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
        BuildOptions(device_top_k=0),
        BuildOptions(device_top_k=4),
    ]
    paths = {model_engine_path("m", v, tmp_path) for v in variants}
    assert len(paths) == len(variants)


def test_the_default_device_top_k_is_1_and_0_with_all_logits():
    """A greedy GPU step of the default engine downloads 4 * B bytes (issue 37: the default
    was 0, the whole [B, V] logits); all_logits builds have no sampling outputs."""
    assert BuildOptions().device_top_k == 1
    assert BuildOptions(all_logits=True).device_top_k == 0
    assert BuildOptions(all_logits=True, device_top_k=0) == BuildOptions(all_logits=True)


def test_an_explicit_device_top_k_with_all_logits_is_refused_before_building(tmp_path):
    with pytest.raises(
        ArgumentError,
        match=r"^device_top_k: expected 0 with all_logits \(logits of every position\), got 1$",
    ):
        build_model_engine(
            "t", TINY_GQA, random_weights(TINY_GQA), out_dir=tmp_path, all_logits=True,
            device_top_k=1, max_seq_len=16, max_batch=1, max_step_tokens=4,
        )  # fmt: skip
    assert list(tmp_path.iterdir()) == []


WEIGHTS = random_weights(TINY_GQA)
DIGEST = weights_digest(WEIGHTS)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("engines")
    options = {"dtype": "float32", "max_seq_len": 16, "max_batch": 2, "max_step_tokens": 4}
    return (
        out,
        BuildOptions(**options),
        build_model_engine("tiny", TINY_GQA, WEIGHTS, out_dir=out, **options),
    )


def find(options, out, config=TINY_GQA, digest=DIGEST):
    return find_model_engine("tiny", config, options, out, digest)


def test_sidecar_holds_the_options_and_the_build_time(built):
    engine = built[2]
    assert engine.path.name == f"tiny-{DIGEST[:8]}-float32-s16-b2-t4-k1.engine"
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
        "device_top_k": 1,
        "compute_capability": "portable",
    }
    assert engine.meta.metadata["recipe"] == {
        "network": "llama",
        "model": "tiny",  # its name, never a path of the machine that built it
        "weights_sha256": DIGEST,
    }
    assert engine.meta.targets == ()  # portable
    assert engine.built_at.endswith("Z") and not engine.reused


def test_the_same_weights_options_and_config_find_the_engine_as_reused(built):
    out, options, engine = built
    found, why = find(options, out)
    assert found is not None and found.reused and why == ""
    assert (found.path, found.meta) == (engine.path, engine.meta)


def test_an_engine_named_before_the_default_k_became_1_is_not_reused(built, tmp_path):
    """Before issue 37 the default engine was built with device_top_k 0 and its name had no
    k (``tiny-DIGEST-float32-s16-b2-t4.engine``): it is not the default engine now."""
    options = built[1]
    old_default = dataclasses.replace(options, device_top_k=0)
    k0 = build_model_engine("tiny", TINY_GQA, WEIGHTS, out_dir=tmp_path, **old_default.to_json())
    old_name = tmp_path / f"tiny-{DIGEST[:8]}-float32-s16-b2-t4.engine"
    k0.path.rename(old_name)
    sidecar_path(k0.path).rename(sidecar_path(old_name))
    assert find(options, tmp_path) == (None, "")  # absent: the default engine is built


def test_another_config_or_option_is_not_reused(built, tmp_path):
    out, options, engine = built
    other = tiny_llama(rms_norm_eps=1e-3)
    assert other != TINY_GQA
    assert find(options, out, config=other) == (None, "config changed in ['rms_norm_eps']")
    assert find(BuildOptions(max_seq_len=17), out) == (None, "")  # another name: none found
    # an engine whose sidecar records other options under this name (edited, say)
    copy = _copy(engine, tmp_path, lambda d: d["metadata"]["build_options"].update(max_batch=3))
    assert copy.name == engine.path.name
    assert find(options, tmp_path) == (None, "build options changed in ['max_batch']")


def _copy(engine, folder, edit=None):
    """The engine and its sidecar copied into ``folder``, the sidecar edited by ``edit``."""
    import json

    copy = folder / engine.path.name
    copy.write_bytes(engine.path.read_bytes())
    side = json.loads(sidecar_path(engine.path).read_text())
    if edit is not None:
        edit(side)
    sidecar_path(copy).write_text(json.dumps(side))
    return copy


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (
            lambda d: d["metadata"]["recipe"].update(weights_sha256="ab" * 32),
            f"weights changed (sha256 abababab... -> sha256 {DIGEST[:8]}...)",
        ),
        (
            lambda d: d.update(trt_version="1.6.0"),
            "TensorRT changed (tensorrt_rtx 1.6.0 -> {module} {version})",
        ),
        (
            lambda d: d.update(compute_capabilities=["8.9"]),
            "GPU targets changed (8.9 -> portable)",
        ),
    ],
)
def test_each_difference_that_decides_the_engine_is_said(built, tmp_path, edit, why):
    from trt_kv import FEATURES

    _, options, engine = built
    _copy(engine, tmp_path, edit)
    assert find(options, tmp_path) == (
        None,
        why.format(module=FEATURES.module, version=FEATURES.version),
    )


def test_two_models_of_one_name_never_share_or_overwrite_an_engine(built, tmp_path):
    """runs/a/model and runs/b/model (same config, other weights) gave one file name: the
    second run reused the first model's engine and said "reused"."""
    _, options, engine = built
    _copy(engine, tmp_path)
    other = random_weights(TINY_GQA, seed=7)
    other_digest = weights_digest(other)
    assert find(options, tmp_path, digest=other_digest) == (
        None,
        f"no engine for these weights (sha256 {other_digest[:8]}...; the one for sha256 "
        f"{DIGEST[:8]}... stays)",
    )
    shapes = {"dtype": "float32", "max_seq_len": 16, "max_batch": 2, "max_step_tokens": 4}
    second = build_model_engine("tiny", TINY_GQA, other, out_dir=tmp_path, **shapes)
    assert second.path != engine.path.parent / engine.path.name
    assert sorted(p.name for p in tmp_path.glob("*.engine")) == sorted(
        [engine.path.name, second.path.name]
    )
    assert find(options, tmp_path)[0].path.name == engine.path.name  # the first still reused
    assert find(options, tmp_path, digest=other_digest)[0].path == second.path


def test_a_tampered_engine_is_not_reused(built, tmp_path):
    _, options, engine = built
    copy = _copy(engine, tmp_path)
    copy.write_bytes(engine.path.read_bytes()[:-1] + b"\0")
    found, why = find(options, tmp_path)
    assert found is None and why.startswith(f"{copy.name} is unusable (") and "sha256" in why


def test_an_engine_without_its_sidecar_is_treated_as_absent_and_said(built, tmp_path):
    _, options, engine = built
    sidecar_path(_copy(engine, tmp_path)).unlink()
    assert find(options, tmp_path) == (
        None,
        f"{engine.path.name} has no sidecar (treated as absent)",
    )


@pytest.mark.parametrize(
    "sidecar",
    [b"", b"\xff\xfe", b"[]", b'{"format": 1}', b'{"format": 99}'],
    ids=["empty", "not-utf8", "not-an-object", "missing-fields", "other-format"],
)
def test_a_malformed_sidecar_means_rebuild_not_a_crash(built, tmp_path, sidecar):
    _, options, engine = built
    (tmp_path / engine.path.name).write_bytes(engine.path.read_bytes())
    (tmp_path / (engine.path.name + ".json")).write_bytes(sidecar)
    found, why = find(options, tmp_path)
    assert found is None and why.startswith(f"{engine.path.name} is unusable (")


def test_max_step_tokens_defaults_to_128_or_s_max_when_smaller():
    assert BuildOptions(max_seq_len=32).key() == "float16-s32-b8-t32-k1"
    assert BuildOptions(max_seq_len=32, max_step_tokens=8).key() == "float16-s32-b8-t8-k1"


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        (
            "t",
            {"max_seqlen": 64},
            r"options: expected BuildOptions fields \['dtype', 'max_seq_len', 'max_batch', "
            r"'max_step_tokens', 'all_logits', 'routes', 'weight_format', 'device_top_k', "
            r"'compute_capability'\], got \['max_seqlen'\]",
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
