"""Engine files: sidecar round trip, tamper and version checks, aliases on a GPU."""

import json

import pytest

from tests.support.tiny_models import TINY_GQA
from trt_kv import FEATURES
from trt_kv.engine.file import check_engine_io, load_engine_file, sidecar_path
from trt_kv.engine.store import build_doc_example, build_model_engine
from trt_kv.errors import EngineFileError
from trt_kv.models.llama import LlamaConfig, random_weights

TINY = TINY_GQA


@pytest.fixture(scope="module")
def doc_engine(tmp_path_factory):
    return build_doc_example(tmp_path_factory.mktemp("engines"))


def build_tiny_engine(out_dir):
    return build_model_engine(
        "tiny",
        TINY,
        random_weights(TINY),
        dtype="float16",
        out_dir=out_dir,
        max_seq_len=32,
        max_batch=2,
        max_step_tokens=8,
    )


@pytest.fixture(scope="module")
def llama_engine(tmp_path_factory):
    return build_tiny_engine(tmp_path_factory.mktemp("engines"))


def test_sidecar_round_trip(doc_engine):
    data, meta = load_engine_file(doc_engine.path)
    assert meta == doc_engine.meta
    assert len(data) == meta.nbytes
    assert (meta.trt_module, meta.trt_version) == (FEATURES.module, FEATURES.version)
    assert [(a.input, a.output, a.shape, a.dtype) for a in meta.aliases] == [
        ("cache", "cache_out", (4, 2, 8, 1), "float32")
    ]
    assert meta.write_indices == "write_indices"


def test_sidecar_records_model_caches_profiles_and_config(llama_engine):
    _, meta = load_engine_file(llama_engine.path)
    assert [a.input for a in meta.aliases] == [
        "past_key.0",
        "past_value.0",
        "past_key.1",
        "past_value.1",
    ]
    assert {a.output for a in meta.aliases} == {
        "present_key.0",
        "present_value.0",
        "present_key.1",
        "present_value.1",
    }
    assert meta.aliases[0].shape == (-1, 2, 32, 8) and meta.aliases[0].dtype == "float16"
    decode, prefill = meta.profiles
    assert (decode.name, decode.shapes["input_ids"]) == ("decode", ((1, 1), (2, 1), (2, 1)))
    assert (prefill.name, prefill.shapes["input_ids"]) == ("prefill", ((1, 1), (2, 8), (2, 8)))
    assert LlamaConfig.from_json(meta.metadata["config"]) == TINY
    assert {t.name for t in meta.outputs} >= {"logits", "present_key.0"}


def test_tampered_engine_is_detected(doc_engine, tmp_path):
    path = tmp_path / "t.engine"
    data = bytearray(doc_engine.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    sidecar_path(path).write_text(sidecar_path(doc_engine.path).read_text())
    with pytest.raises(EngineFileError, match="expected sha256"):
        load_engine_file(path)


def test_engine_from_another_tensorrt_version_is_refused(doc_engine, tmp_path):
    path = tmp_path / "v.engine"
    path.write_bytes(doc_engine.path.read_bytes())
    side = json.loads(sidecar_path(doc_engine.path).read_text())
    side["trt_version"] = "0.0.1"
    sidecar_path(path).write_text(json.dumps(side))
    with pytest.raises(EngineFileError, match=r"built by the running TensorRT.*0\.0\.1"):
        load_engine_file(path)


def test_missing_sidecar_is_refused(doc_engine, tmp_path):
    path = tmp_path / "lonely.engine"
    path.write_bytes(doc_engine.path.read_bytes())
    with pytest.raises(EngineFileError) as err:
        load_engine_file(path)
    assert str(err.value) == (
        f"{path}: expected an engine built by trt_kv, with its JSON sidecar beside it: "
        "lonely.engine.json, got missing"
    )


def test_a_folder_in_place_of_the_engine_or_its_sidecar_is_named(doc_engine, tmp_path):
    folder = tmp_path / "a.engine"
    folder.mkdir()
    with pytest.raises(EngineFileError) as err:
        load_engine_file(folder)
    assert str(err.value) == f"{folder}: expected an existing file, got a folder"
    path = tmp_path / "b.engine"
    path.write_bytes(doc_engine.path.read_bytes())
    sidecar_path(path).mkdir()
    with pytest.raises(EngineFileError) as err:
        load_engine_file(path)
    assert str(err.value) == (
        f"{path}: expected an engine built by trt_kv, with its JSON sidecar beside it: "
        "b.engine.json, got a folder"
    )


@pytest.mark.gpu
def test_deserialized_engine_aliases_agree_with_sidecar(tmp_path):
    from trt_kv.runtime.gpu.engine_loader import load_cuda_engine

    # Built by the test itself, not by the module fixture: without a GPU this runs on the
    # emulated one, which runs engines built while it is active (the fixture may have been
    # built before, for a test that is not a gpu test).
    engine, _, meta = load_cuda_engine(build_tiny_engine(tmp_path).path)
    check_engine_io(engine, meta)
    for alias in meta.aliases:
        assert engine.get_aliased_input_tensor(alias.output) == alias.input


def _copy(doc_engine, tmp_path, sidecar_bytes, name="e.engine"):
    path = tmp_path / name
    path.write_bytes(doc_engine.path.read_bytes())
    sidecar_path(path).write_bytes(sidecar_bytes)
    return path


def _edited(doc_engine, edit):
    side = json.loads(sidecar_path(doc_engine.path).read_text())
    edit(side)
    return json.dumps(side).encode()


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", r"e\.engine\.json: expected a JSON sidecar, got Expecting value"),
        (b"{not json", r"e\.engine\.json: expected a JSON sidecar"),
        (b"\xff\xfe{}", r"e\.engine\.json: expected UTF-8 text, got invalid start byte"),
        (b"[1, 2]", r"e\.engine\.json: sidecar: expected a JSON object, got list"),
        (b"{}", r"sidecar: expected format 2, got None"),
        (b'{"format": 2}', r"sidecar: expected fields \['trt_module', .*got no \['trt_module', "),
    ],
)
def test_malformed_sidecar_is_an_engine_file_error(doc_engine, tmp_path, content, match):
    with pytest.raises(EngineFileError, match=match):
        load_engine_file(_copy(doc_engine, tmp_path, content))


def _alias(d, **changes):
    d["alias_pairs"][0].update(changes)


def _input(d, which, **changes):
    next(t for t in d["inputs"] if t["name"] == which).update(changes)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: d.pop("sha256"), r"got no \['sha256'\]"),
        (lambda d: d.update(format=1), "sidecar: expected format 2, got 1"),
        (
            lambda d: d.update(bytes="12"),
            r"sidecar field bytes: expected an integer >= 1, got '12'",
        ),
        (lambda d: d.update(bytes=0), r"sidecar field bytes: expected an integer >= 1, got 0"),
        (lambda d: d.update(sha256="abc"), r"sha256: expected 64 lower-case hex digits"),
        (lambda d: d.update(trt_module=""), r"trt_module: expected a non-empty string"),
        (lambda d: d.update(build_seconds=-1), r"build_seconds: expected a number of seconds"),
        (lambda d: d.update(cache_update="magic"), r"cache_update: expected one of"),
        (lambda d: d.update(compute_capabilities="9"), r"compute_capabilities: expected"),
        (lambda d: d.update(compute_capabilities=[]), r"compute_capabilities: expected"),
        (lambda d: d.update(inputs=[{"name": "x"}]), r"inputs\[0\]: expected an object with keys"),
        (lambda d: d.update(alias_pairs=[7]), r"alias_pairs\[0\]: expected an object with keys"),
        (lambda d: _alias(d, shape="abc"), r"alias_pairs\[0\].shape: expected a list of dims"),
        (lambda d: _alias(d, shape=[4, 2, -64, 1]), r"alias_pairs\[0\].shape: expected a list"),
        (lambda d: _alias(d, shape=[4, 2, 0, 1]), r"alias_pairs\[0\].shape: expected a list"),
        (lambda d: _alias(d, shape=[4, 2, 8]), r"alias_pairs\[0\].shape: .*4 of them"),
        # only the batch axis is dynamic (S_max -1 printed -8 bytes per slot in inspect)
        (lambda d: _alias(d, shape=[-1, 2, -1, 1]), r"alias_pairs\[0\].shape: expected \[B, N"),
        (lambda d: _alias(d, dtype="float64"), r"alias_pairs\[0\].dtype: expected one of"),
        # the case: caches the wrong size, snapshot returned zeros
        (
            lambda d: _alias(d, dtype="float16"),
            r"alias_pairs\[0\]: expected the shape and dtype of input cache "
            r"\(\(4, 2, 8, 1\), 'float32'\), got \(\(4, 2, 8, 1\), 'float16'\)",
        ),
        (
            lambda d: _alias(d, shape=[4, 2, 16, 1]),
            r"alias_pairs\[0\]: expected the shape and dtype of input cache",
        ),
        (lambda d: _alias(d, input="nope"), r"alias_pairs\[0\].input: expected a declared"),
        (lambda d: _alias(d, output="cache"), r"alias_pairs\[0\].output: expected a declared"),
        (lambda d: _input(d, "update", dtype="int4"), r"inputs\[1\].dtype: expected one of"),
        (lambda d: _input(d, "update", name="cache"), r"inputs\[1\].name: expected a name used"),
        (lambda d: d.update(write_indices="nope"), r"write_indices: expected a declared"),
        (
            lambda d: d.update(metadata=[]),
            r"sidecar field metadata: expected an object, got \[\]",
        ),
    ],
)
def test_sidecar_fields_are_checked_by_type_range_and_against_each_other(
    doc_engine, tmp_path, edit, match
):
    with pytest.raises(EngineFileError, match=match) as info:
        load_engine_file(_copy(doc_engine, tmp_path, _edited(doc_engine, edit)))
    assert "e.engine.json" in str(info.value)


def _profile(d, name, k, shapes):
    d["profiles"][k]["shapes"][name] = shapes


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (
            lambda d: _profile(d, "input_ids", 0, [[1, 1], [2, 1], [1, 1]]),
            r"profiles\[0\].shapes.input_ids: expected min <= opt <= max",
        ),
        (
            lambda d: _profile(d, "input_ids", 1, [[1], [2], [2]]),
            r"profiles\[1\].shapes.input_ids: expected shapes matching \(-1, -1\), got \[1\]",
        ),
        (
            lambda d: _profile(d, "past_key.0", 0, [[1, 2, 16, 8]] * 3),
            r"shapes.past_key.0: expected shapes matching \(-1, 2, 32, 8\)",
        ),
        (
            lambda d: _profile(d, "logits", 0, [[1, 1]] * 3),
            r"profiles\[0\].shapes: expected declared network inputs, got 'logits",
        ),
        (
            lambda d: d["profiles"][0]["shapes"].pop("input_ids"),
            r"profiles\[0\]: expected shapes for every dynamic input, got none for",
        ),
        (
            lambda d: _profile(d, "input_ids", 0, [[1, -1], [2, 1], [2, 1]]),
            r"profiles\[0\].shapes.input_ids: expected \[min, opt, max\]",
        ),
    ],
)
def test_profiles_are_checked_against_the_declared_inputs(llama_engine, tmp_path, edit, match):
    with pytest.raises(EngineFileError, match=match):
        load_engine_file(_copy(llama_engine, tmp_path, _edited(llama_engine, edit)))


def _role(d, key, value):
    d["roles"][key] = value


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: _role(d, "max_seq_len", -5), r"roles.max_seq_len: expected an integer >= 1"),
        (lambda d: _role(d, "max_seq_len", "x"), r"roles.max_seq_len: expected an integer >= 1"),
        (lambda d: _role(d, "max_batch", [1]), r"roles.max_batch: expected an integer >= 1"),
        (lambda d: _role(d, "max_step_tokens", None), r"roles.max_step_tokens: expected an"),
        (lambda d: _role(d, "max_step_tokens", 33), r"roles.max_step_tokens: expected <= max_seq"),
        (lambda d: _role(d, "logits", [1]), r"roles.logits: expected a non-empty string"),
        (lambda d: _role(d, "all_logits", 1), r"roles.all_logits: expected true or false"),
        (lambda d: _role(d, "long_rope_after", 0), r"roles.long_rope_after: expected an integer"),
        (lambda d: _role(d, "device_top_k", -1), r"roles.device_top_k: expected an integer"),
        (lambda d: _role(d, "device_top_k", True), r"roles.device_top_k: expected an integer"),
        (
            lambda d: _role(d, "device_top_k", 10**9),
            r"roles.device_top_k: expected an integer in \[0, 64\], got 1000000000",
        ),
        (lambda d: _role(d, "device_top_k", False), r"roles.device_top_k: expected an integer"),
        (lambda d: _role(d, "device_top_k", 0.0), r"roles.device_top_k: expected an integer"),
        (
            lambda d: (_role(d, "device_top_k", 2), _role(d, "all_logits", True)),
            r"roles.device_top_k: expected 0 with all_logits",
        ),
        (lambda d: _role(d, "inputs", {"ids": "x"}), r"roles.inputs: expected roles among"),
        (lambda d: _role(d, "inputs", {"token_ids": 3}), r"roles.inputs.token_ids: expected a"),
        (lambda d: d["roles"]["caches"][0].update(layout="BSNH"), r"caches\[0\].layout"),
        (lambda d: d["roles"].pop("vocab_size"), r"roles: expected an object with keys"),
        (
            lambda d: _role(d, "max_seq_len", 16),
            r"roles.max_seq_len: expected the S_max of every alias pair \[32\], got 16",
        ),
    ],
)
def test_the_decoder_roles_are_checked_by_type_range_and_against_the_caches(
    llama_engine, tmp_path, edit, match
):
    """A role size of -5, "x" or [1], or logits [1], loaded and reached the CLI as a
    traceback or a misleading --max-seq-len error (review of issue 29)."""
    with pytest.raises(EngineFileError, match=match):
        load_engine_file(_copy(llama_engine, tmp_path, _edited(llama_engine, edit)))


def test_a_sidecar_from_before_device_top_k_reads_as_0(llama_engine, tmp_path):
    edited = _edited(llama_engine, lambda d: d["roles"].pop("device_top_k"))
    assert load_engine_file(_copy(llama_engine, tmp_path, edited))[1].roles.device_top_k == 0


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("max_batch", "2", r"metadata.max_batch: expected an integer >= 1, got '2'$"),
        ("max_seq_len", 0, r"metadata.max_seq_len: expected an integer >= 1, got 0$"),
        ("max_step_tokens", 8.0, r"metadata.max_step_tokens: expected an integer >= 1, got 8.0$"),
        ("all_logits", "no", r"metadata.all_logits: expected true or false, got 'no'$"),
    ],
)
def test_the_metadata_sizes_are_checked_by_type(llama_engine, tmp_path, key, value, match):
    """metadata.max_batch "2" was read as it came (roles.max_batch was checked)."""
    edited = _edited(llama_engine, lambda d: d["metadata"].update({key: value}))
    with pytest.raises(EngineFileError, match=match):
        load_engine_file(_copy(llama_engine, tmp_path, edited))


def test_a_new_sidecar_field_is_one_row_of_the_table():
    from trt_kv.engine.sidecar import FIELDS, EngineMeta

    # every EngineMeta attribute is written and read through FIELDS, and nothing else is
    attrs = {f.attr for f in FIELDS}
    assert attrs == set(EngineMeta.__dataclass_fields__)


def test_malformed_sidecar_keeps_the_library_error_as_cause(doc_engine, tmp_path):
    with pytest.raises(EngineFileError) as info:
        load_engine_file(_copy(doc_engine, tmp_path, b"{oops"))
    assert isinstance(info.value.__cause__, json.JSONDecodeError)


def test_engine_size_is_checked_against_the_sidecar(doc_engine, tmp_path):
    content = _edited(doc_engine, lambda d: d.update(bytes=d["bytes"] + 1))
    with pytest.raises(EngineFileError, match=r"expected size in bytes \(from the sidecar\)"):
        load_engine_file(_copy(doc_engine, tmp_path, content))


def test_saving_under_a_file_is_an_engine_file_error(doc_engine, tmp_path):
    from trt_kv.builder import BuiltEngine
    from trt_kv.engine.file import save_engine

    (tmp_path / "a_file").write_text("x")
    built = BuiltEngine(doc_engine.path.read_bytes(), 0.0)
    with pytest.raises(EngineFileError, match="expected a writable location") as info:
        save_engine(tmp_path / "a_file" / "e.engine", built, doc_engine.meta)
    assert isinstance(info.value.__cause__, OSError)
