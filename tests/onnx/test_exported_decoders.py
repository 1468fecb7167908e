"""Exported transformers decoders (tiny random Llama and GPT-2, by torch's TorchScript and
dynamo exporters) rewritten and run by trt_kv: greedy ids equal onnxruntime's on the ORIGINAL
graph (growing cache, each prompt alone) and transformers', on the interpreter at float32 and
on (emulated) TensorRT, 32 new tokens for 3 prompts of different lengths in one batch."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.support.hf_models import greedy_ids
from tests.support.onnx_decoders import tiny_model
from tests.support.onnx_models import (
    NEW_TOKENS,
    PROMPTS,
    export,
    ort_greedy,
)
from trt_kv.onnx.decoder import load_onnx_decoder
from trt_kv.runtime import Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

S_MAX = 64
MODELS = ("gpt2", "llama")
# torch's two exporters: TorchScript's (dynamo=False) and the dynamo exporter (torch 2.13's
# default, through onnxscript), whose shapes come from the caches' symbolic past length
EXPORTS = [(m, dynamo) for dynamo in (False, True) for m in MODELS]


@pytest.fixture(
    scope="module",
    params=EXPORTS,
    ids=[f"{m}-{'dynamo' if d else 'torchscript'}" for m, d in EXPORTS],
)
def exported(request, tmp_path_factory):
    """(name, .onnx path, transformers' ids, onnxruntime's ids on the original graph)."""
    family, dynamo = request.param
    model = tiny_model(family)
    name = f"{family}-dynamo" if dynamo else family
    path = export(model, tmp_path_factory.mktemp(name) / f"{name}.onnx", dynamo=dynamo)
    hf = greedy_ids(model, PROMPTS, NEW_TOKENS)
    ort = [ort_greedy(path, p, NEW_TOKENS) for p in PROMPTS]
    return name, path, hf, ort


def _decoder(path):
    return load_onnx_decoder(path, max_seq_len=S_MAX, max_batch=3, max_step_tokens=16)


def test_onnxruntime_on_the_export_equals_transformers(exported):
    _, _, hf, ort = exported
    assert ort == hf


@pytest.mark.parametrize("family", MODELS)
def test_an_export_with_dropout_leaves_the_model_in_eval_mode(family, tmp_path):
    """Dropout 0.5 in the config: the export's logits equal transformers' of the same model
    object after the export (torch's exporter restores its wrapper's mode: a training wrapper
    would switch the model's dropout on)."""
    import onnxruntime
    import torch

    model = tiny_model(family, dropout=0.5)
    session = onnxruntime.InferenceSession(
        str(export(model, tmp_path / "dropout.onnx")), providers=["CPUExecutionProvider"]
    )
    prompt = np.array([PROMPTS[0]], np.int64)
    feed = {
        i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
        for i in session.get_inputs()
        if i.name.startswith("past_key_values.")
    }
    positions = np.arange(prompt.shape[1], dtype=np.int64)[None]
    mask = np.ones_like(prompt)
    names = {"input_ids": prompt, "attention_mask": mask, "position_ids": positions}
    (logits,) = session.run(["logits"], {**names, **feed})
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(prompt), attention_mask=torch.from_numpy(mask))
    np.testing.assert_allclose(logits, want.logits.numpy(), rtol=1e-4, atol=1e-4)


def test_interpreter_ids_equal_onnxruntimes_in_one_batch(exported):
    _, path, _, ort = exported
    got = generate(Session(InterpreterBackend(_decoder(path).decoder)), PROMPTS, NEW_TOKENS).ids
    assert got == ort


def test_rewritten_graph_on_onnxruntime_equals_the_original(exported):
    """The rewrite alone, checked by onnxruntime (TensorScatter runs there too)."""
    import onnxruntime

    _, path, _, ort = exported
    rewritten = _decoder(path)
    session = onnxruntime.InferenceSession(rewritten.data, providers=["CPUExecutionProvider"])
    caches = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    for prompt, want in zip(PROMPTS, ort):
        feed = {c.name: np.zeros([1, *c.shape[1:]], np.float32) for c in caches}
        ids, start, got = list(prompt), 0, []
        while len(got) < NEW_TOKENS:
            out = dict(
                zip(
                    [o.name for o in session.get_outputs()],
                    session.run(
                        None,
                        {
                            "input_ids": np.array([ids[start:]], np.int32),
                            "position_ids": np.arange(start, len(ids), dtype=np.int64)[None],
                            "write_indices": np.array([start], np.int32),
                            **feed,
                        },
                    ),
                )
            )
            feed = {c.name: out[c.name.replace("past_key_values.", "present.")] for c in caches}
            got.append(int(np.argmax(out["logits"][0, -1])))
            start = len(ids)
            ids.append(got[-1])
        assert got == want


def test_network_holds_one_cache_update_per_cache_and_no_concat_on_one(exported):
    from trt_kv._trt import trt

    _, path, _, _ = exported
    d = _decoder(path)
    net = d.decoder.network
    layers = [net.get_layer(i) for i in range(net.num_layers)]
    updates = [la for la in layers if la.type == trt.LayerType.KV_CACHE_UPDATE]
    caches = {c.input for c in d.decoder.roles.caches} | {c.output for c in d.decoder.roles.caches}
    assert len(updates) == len(d.decoder.roles.caches) == len(d.report.caches) == 4
    assert sorted(u.get_input(0).name for u in updates) == sorted(
        c.input for c in d.decoder.roles.caches
    )
    concats = [la for la in layers if la.type == trt.LayerType.CONCATENATION]
    read = {la.get_input(i).name for la in concats for i in range(la.num_inputs) if la.get_input(i)}
    assert not read & caches


def test_rewrite_report_names_every_cache_and_layer(exported):
    _, path, _, _ = exported
    report = _decoder(path).report
    assert report.layers == [0, 1]
    assert [c[:2] for c in report.caches] == [
        (f"past_key_values.{i}.{kv}", f"present.{i}.{kv}")
        for i in (0, 1)
        for kv in ("key", "value")
    ]
    assert report.removed_inputs == ("attention_mask",)
    assert onnx.load(path)  # the source is left as it was


@pytest.fixture(scope="module")
def engine(exported, tmp_path_factory):
    """The engine of the rewritten export, built in this process (the emulator runs it on the
    interpreter of its network)."""
    from trt_kv.engine.store import build_to_file

    name, path, _, _ = exported
    n = _decoder(path).decoder
    out = tmp_path_factory.mktemp("onnx_engines") / f"{name}.engine"
    return build_to_file(n.builder, n.network, n.profiles, out, {"model": name}, n.roles).path


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["tensorrt", "polygraphy"])
def test_gpu_backend_ids_equal_onnxruntimes_in_one_batch(kind, exported, engine):
    from trt_kv.runtime.gpu.polygraphy_backend import PolygraphyBackend
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    backend = {"tensorrt": TrtBackend, "polygraphy": PolygraphyBackend}[kind](engine)
    try:
        assert generate(Session(backend), PROMPTS, NEW_TOKENS).ids == exported[3]
    finally:
        backend.close()
