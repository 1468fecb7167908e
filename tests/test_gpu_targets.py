"""GPU compute capability: the table of what each TensorRT module runs, the engine's targets
in the sidecar, and an honest backend choice, shown on an emulated H200 (compute capability
9.0, where TensorRT-RTX 1.7.1 refused every engine on the real one, 2026-11-25)."""

import json

import pytest

from tests.support.cli_user import tiny_model as tiny_model  # the fixture
from tests.support.trt_log import Log
from trt_kv._trt import FEATURES, trt
from trt_kv.builder import build_engine
from trt_kv.builder.doc_example import doc_example_network
from trt_kv.cli import main
from trt_kv.cli.version import version_text
from trt_kv.emulator import EmulatorError, emulated_gpu
from trt_kv.engine.store import build_doc_example, build_to_file
from trt_kv.errors import ArgumentError, GpuUnavailableError
from trt_kv.gpu_targets import SUPPORT, is_measured, parse_targets, refusal, support_of
from trt_kv.runtime.gpu.cuda import device_capability, gpu_unavailable_reason, tensorrt_refusal
from trt_kv.runtime.gpu.engine_loader import load_cuda_engine

H200 = (9, 0)
RTX = pytest.mark.skipif(not FEATURES.is_rtx, reason="TensorRT-RTX's targets and refusal")
NO_REAL_GPU = pytest.mark.skipif(
    gpu_unavailable_reason() is None, reason="runs the emulated GPU; this machine has a real one"
)
# The installed release's name (a newer TensorRT-RTX than the table's 1.7 says so)
_RTX = "TensorRT-RTX " + ".".join(FEATURES.version.split(".")[:3])
if not is_measured(FEATURES.module, FEATURES.version):
    _RTX += " (as 1.7, the nearest release trt_kv knows)"
H200_REASON = (
    f"GPU compute capability 9.0 (trt_kv emulated GPU (CPU)): {_RTX} does not run "
    "it; install TensorRT >= 10.15 (pip install tensorrt-cu12 / tensorrt-cu13) for Hopper"
)
RTX_REFUSAL = (
    "The engine cannot run on this GPU, which has compute capability 9.0. Supported compute "
    "capabilities: 8.0 8.6 8.9 12.0 12.1 >12.0."
)


# -- the table --------------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["1.8.0.10", "1.6.2", "2.0"])
def test_a_release_the_table_lacks_is_judged_by_the_nearest_and_says_so(version):
    """Only "1.7" matched: any other TensorRT-RTX (pyproject allows >= 1.2) skipped the check
    and --backend auto picked tensorrt on Hopper again (review of issue 29)."""
    assert not is_measured("tensorrt_rtx", version)
    short = ".".join(version.split(".")[:3])
    assert refusal(H200, "NVIDIA H200", "tensorrt_rtx", version) == (
        f"GPU compute capability 9.0 (NVIDIA H200): TensorRT-RTX {short} (as 1.7, the nearest "
        "release trt_kv knows) does not run it; install TensorRT >= 10.15 (pip install "
        "tensorrt-cu12 / tensorrt-cu13) for Hopper"
    )
    assert refusal((8, 9), "x", "tensorrt_rtx", version) is None
    assert support_of("onnxruntime", "1.0") is None


def test_the_rtx_row_runs_what_the_h200_refusal_listed():
    row = support_of("tensorrt_rtx", "1.7.1.116")
    runs = [cc for cc in [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0), (12, 1),
                          (13, 0)] if row.runs_portable(cc)]  # fmt: skip
    assert runs == [(8, 0), (8, 6), (8, 9), (12, 0), (12, 1), (13, 0)]
    assert all(row.source for row in SUPPORT)


@RTX
def test_the_tables_targets_are_the_installed_modules_compute_capability_members():
    row = support_of(FEATURES.module, FEATURES.version)
    members = {m for m in trt.ComputeCapability.__members__ if m.startswith("SM")}
    assert {f"SM{a}{b}" for a, b in row.targets.values()} == members


def test_hopper_on_tensorrt_rtx_is_refused_naming_what_would_run_it():
    assert refusal(H200, "NVIDIA H200", "tensorrt_rtx", "1.7.1.116") == (
        "GPU compute capability 9.0 (NVIDIA H200): TensorRT-RTX 1.7.1 does not run it; install "
        "TensorRT >= 10.15 (pip install tensorrt-cu12 / tensorrt-cu13) for Hopper"
    )
    assert refusal(H200, "NVIDIA H200", "tensorrt", "10.15.1.29") is None
    assert refusal((8, 9), "x", "tensorrt_rtx", "1.7.1.116") is None
    assert refusal((8, 9), "x", "some_other_trt", "3.0") is None  # unknown: nothing refused


def test_an_engine_built_for_other_targets_is_refused_with_the_fix():
    assert refusal((8, 6), "x", "tensorrt_rtx", "1.7.1.116", ((8, 9),), "e.engine") == (
        "GPU compute capability 8.6 (x): e.engine is built for 8.9, not for it; rebuild it "
        "with --compute-capability 8.6"
    )
    assert refusal((7, 5), "x", "tensorrt_rtx", "1.7.1.116").endswith(
        "the engine is portable, not for it; rebuild it with --compute-capability 7.5"
    )


@RTX
def test_a_target_the_module_cannot_build_for_is_refused_by_name():
    with pytest.raises(ArgumentError, match=r"^--compute-capability: expected one of \['portable'"):
        parse_targets("9.0", FEATURES.module, FEATURES.version, "--compute-capability")
    assert parse_targets("12.0,8.6", FEATURES.module, FEATURES.version) == ((8, 6), (12, 0))


# -- the emulated device answers with its compute capability -----------------------------------
def test_the_emulated_device_reports_its_compute_capability_through_cuda():
    with emulated_gpu():
        assert device_capability() == ((8, 9), "trt_kv emulated GPU (CPU)")
    with emulated_gpu(H200):
        assert device_capability()[0] == H200
        with emulated_gpu():  # nested, no capability asked: the active one
            assert device_capability()[0] == H200
        with (
            pytest.raises(EmulatorError, match=r"expected the active block's \(9, 0\)"),
            emulated_gpu((8, 6)),
        ):
            pass


@RTX
def test_the_emulated_rtx_runtime_refuses_a_portable_engine_on_9_0_as_the_real_one_did():
    log = Log()
    with emulated_gpu():  # built on the default device (8.9): known to the emulator
        builder, network, profiles = doc_example_network()
        data = build_engine(builder, network, profiles).data
        runtime = trt.Runtime(log)
        assert runtime.get_engine_validity(data) == (trt.EngineValidity.VALID, 0)
        assert runtime.deserialize_cuda_engine(data) is not None
    with emulated_gpu(H200):
        runtime = trt.Runtime(log)
        assert runtime.get_engine_validity(data) == (
            trt.EngineValidity.INVALID,
            int(trt.EngineInvalidityDiagnostics.UNSUPPORTED_CC),
        )
        assert runtime.deserialize_cuda_engine(data) is None
    assert RTX_REFUSAL in log.errors[-1]


@RTX
def test_explicit_targets_are_built_recorded_and_checked(tmp_path):
    builder, network, profiles = doc_example_network()
    with emulated_gpu():
        built = build_to_file(builder, network, profiles, tmp_path / "e.engine", targets=((8, 6),))
        assert built.meta.targets == ((8, 6),)
        assert (
            '"compute_capabilities": [\n    "8.6"\n  ]' in (tmp_path / "e.engine.json").read_text()
        )
        with pytest.raises(GpuUnavailableError, match=r"e\.engine is built for 8\.6, not for it"):
            load_cuda_engine(built.path)  # refused before deserializing
        log = Log()
        assert trt.Runtime(log).deserialize_cuda_engine(built.path.read_bytes()) is None
        assert "Supported compute capabilities: 8.6." in log.errors[-1]
    with emulated_gpu((8, 6)):
        engine, _, _ = load_cuda_engine(built.path)
        assert engine.get_aliased_input_tensor("cache_out") == "cache"


@RTX
def test_loading_an_engine_on_9_0_is_refused_before_deserializing(tmp_path):
    built = build_doc_example(tmp_path)
    with emulated_gpu(H200, engines=[built.path]):
        assert tensorrt_refusal() == H200_REASON
        with pytest.raises(GpuUnavailableError) as info:
            load_cuda_engine(built.path)
    assert str(info.value) == (
        f"loading {built.path}: expected a GPU the installed TensorRT runs, got {H200_REASON}; "
        "backends that run here: reference, interpreter"
    )


# -- the command line on an emulated H200 ---------------------------------------------------------
SHAPES = ["--max-seq-len", "24", "--max-batch", "2", "--max-step-tokens", "8"]


@RTX
@NO_REAL_GPU
def test_auto_falls_back_to_the_interpreter_on_9_0_saying_why(
    tiny_model, tmp_path, capsys, monkeypatch
):
    import json

    monkeypatch.setenv("TRT_KV_EMULATED_CC", "9.0")
    argv = ["generate", "--model", str(tiny_model), "--prompt-ids", "5,17,42", *SHAPES]
    argv += ["--max-new-tokens", "3", "--out", str(tmp_path / "out"), "--json", "-q"]
    assert main([*argv, "--emulate-gpu"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines()[0] == f"trt-kv: running on the CPU interpreter: {H200_REASON}"
    result = json.loads(out)
    assert (result["backend"], result["emulated_gpu"]) == ("interpreter", False)
    assert not (tmp_path / "out").exists()  # no engine built that cannot run
    monkeypatch.delenv("TRT_KV_EMULATED_CC")
    assert main([*argv, "--emulate-gpu"]) == 0  # the default emulated device (8.9): tensorrt
    assert json.loads(capsys.readouterr().out)["backend"] == "tensorrt"


@RTX
@NO_REAL_GPU
@pytest.mark.parametrize("backend", ["tensorrt", "polygraphy"])
def test_an_explicit_gpu_backend_on_9_0_is_refused_before_building(
    tiny_model, tmp_path, capsys, monkeypatch, backend
):
    monkeypatch.setenv("TRT_KV_EMULATED_CC", "9.0")
    argv = ["generate", "--model", str(tiny_model), "--prompt-ids", "5,17,42", *SHAPES]
    argv += ["--backend", backend, "--out", str(tmp_path / "out"), "--emulate-gpu", "-q"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"trt-kv: error: --backend {backend}: expected a GPU the installed TensorRT runs, got "
        f"{H200_REASON}; backends that run here: reference, interpreter\n"
    )
    assert not (tmp_path / "out").exists()


@NO_REAL_GPU
def test_a_malformed_emulated_compute_capability_is_one_error_line(capsys, monkeypatch):
    monkeypatch.setenv("TRT_KV_EMULATED_CC", "nine")
    assert main(["generate", "--backend", "tensorrt", "--emulate-gpu", "-q"]) == 2
    assert capsys.readouterr().err == (
        "trt-kv: error: TRT_KV_EMULATED_CC: expected major.minor, e.g. 9.0, got 'nine'\n"
    )


@RTX
def test_version_shows_the_gpus_compute_capability_and_whether_the_module_runs_it():
    with emulated_gpu(H200):
        text = version_text()
    assert ", compute capability 9.0\n" in text
    assert text.endswith(f"GPU support: NO: {H200_REASON}")
    with emulated_gpu():
        assert version_text().endswith("GPU support: runs on this GPU (portable engines)")


@RTX
@NO_REAL_GPU
def test_demo_on_9_0_builds_then_runs_the_interpreter_saying_why(
    tiny_model, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("TRT_KV_EMULATED_CC", "9.0")
    argv = ["demo", "--model", str(tiny_model), "--out", str(tmp_path), *SHAPES]
    assert main([*argv, "--emulate-gpu", "--max-new-tokens", "2", "-q"]) == 0
    out, err = capsys.readouterr()
    assert f"trt-kv: running on the CPU interpreter: {H200_REASON}\n" in err
    assert f"\nnote: TensorRT cannot run on this GPU ({H200_REASON}): the engine above" in err
    assert "backend=interpreter]" in out and "(emulated GPU)" not in out


@RTX
@NO_REAL_GPU
def test_bench_on_9_0_refuses_tensorrt_and_auto_times_the_interpreter(tiny_model, capsys):
    """``bench`` has no ``--emulate-gpu`` (emulated timings measure nothing): its choice is
    shown inside an emulated H200 block."""
    argv = ["bench", "--model", str(tiny_model), "--context", "4", "--decode-steps", "1"]
    argv += ["--repeats", "1", "--warmup", "0", "--json", "-q"]
    with emulated_gpu(H200):
        assert main([*argv, "--backend", "tensorrt"]) == 2
        assert capsys.readouterr().err.startswith(
            f"trt-kv: error: --backend tensorrt: expected a GPU the installed TensorRT runs, "
            f"got {H200_REASON}"
        )
        assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == f"trt-kv: running on the CPU interpreter: {H200_REASON}\n"
    assert '"backend": "interpreter"' in out


@RTX
def test_build_for_explicit_targets_names_and_records_them(tiny_model, tmp_path, capsys):
    argv = ["build", "--model", str(tiny_model), "--out", str(tmp_path), *SHAPES, "-q"]
    assert main([*argv, "--compute-capability", "12.0,8.6"]) == 0
    (engine,) = tmp_path.glob(f"{tiny_model.name}-*.engine")
    assert engine.name.endswith("-float16-s24-b2-t8-k1-cc_12.0_8.6.engine")
    side = json.loads((tmp_path / f"{engine.name}.json").read_text())
    assert side["compute_capabilities"] == ["8.6", "12.0"]
    assert side["metadata"]["build_options"]["compute_capability"] == "12.0,8.6"
    capsys.readouterr()
    assert main([*argv, "--compute-capability", "9.0"]) == 2
    assert capsys.readouterr().err.startswith(
        "trt-kv: error: --compute-capability: expected one of ['portable', '7.5', '8.0', "
    )


# -- an engine built for 7.5 on a 7.5 device (portable engines do not run there) ----------------
TURING = ["--compute-capability", "7.5", "--emulate-gpu"]


@RTX
@NO_REAL_GPU
@pytest.mark.parametrize("backend", ["tensorrt", "auto"])
def test_compute_capability_7_5_runs_on_a_7_5_device(
    tiny_model, tmp_path, capsys, monkeypatch, backend
):
    """Before: refused before loading as "portable, rebuild it with --compute-capability
    7.5", the check looking at a portable engine whatever --compute-capability said (auto:
    the interpreter picked, then --compute-capability refused on it)."""
    monkeypatch.setenv("TRT_KV_EMULATED_CC", "7.5")
    argv = ["generate", "--model", str(tiny_model), "--prompt-ids", "5,17,42", *SHAPES]
    argv += ["--max-new-tokens", "2", "--out", str(tmp_path), "--json", "-q"]
    assert main([*argv, *TURING, "--backend", backend]) == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out)
    assert (result["backend"], result["emulated_gpu"]) == ("tensorrt", True)


@RTX
@NO_REAL_GPU
def test_an_engine_file_built_for_7_5_runs_on_a_7_5_device(
    tiny_model, tmp_path, capsys, monkeypatch
):
    """Before: --engine of a 7.5 engine was judged as a portable one and refused."""
    argv = ["--model", str(tiny_model), *SHAPES, "--out", str(tmp_path), "-q"]
    assert main(["build", *argv, "--compute-capability", "7.5"]) == 0
    (engine,) = tmp_path.glob("*-cc_7.5.engine")
    monkeypatch.setenv("TRT_KV_EMULATED_CC", "7.5")
    ask = ["generate", "--model", str(tiny_model), "--engine", str(engine), "--json", "-q"]
    ask += ["--prompt-ids", "5,17,42", "--max-new-tokens", "2", "--backend", "tensorrt"]
    assert main([*ask, "--emulate-gpu"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["backend"] == "tensorrt"
