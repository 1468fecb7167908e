"""The emulator sits beside the runtime and below it, and the product enters it by one door.

Read from the import graph (grimp): the runtime imports only the emulator's hook module,
which loads none of the stand-ins; an installer registered inside a block is undone with it.
"""

import json
import subprocess
import sys

import grimp
import pytest

from tests.support.cli_user import user_env
from trt_kv.emulator import emulated_gpu, hooks

EMULATOR = "trt_kv.emulator"
# That the emulator imports nothing above the runtime and has no import circle of its own is
# pyproject.toml's import-linter contracts (the layers, acyclic_siblings), run and shown to
# break in tests/test_layers.py.


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("trt_kv", cache_dir=None)


def test_the_runtime_enters_the_emulator_by_its_hooks_only(graph):
    runtime = [m for m in graph.modules if m.startswith("trt_kv.runtime")]
    doors = {
        (m, imported)
        for m in runtime
        for imported in graph.find_modules_directly_imported_by(m)
        if imported == EMULATOR or imported.startswith(EMULATOR + ".")
    }
    assert doors == {("trt_kv.runtime.gpu.cuda", "trt_kv.emulator.hooks")}


def test_importing_the_runtime_loads_none_of_the_stand_ins():
    """The hook costs the runtime's import nothing: no CUDA or TensorRT stand-in, no
    ``cuda.bindings.driver`` (which the emulated driver imports)."""
    code = (
        "import json, sys, trt_kv.runtime.gpu.cuda; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('trt_kv.emulator')"
        " or m == 'cuda.bindings.driver')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=user_env(), check=True
    )
    assert json.loads(out.stdout) == ["trt_kv.emulator", "trt_kv.emulator.hooks"]


def test_an_installer_registered_inside_a_block_runs_at_once_and_is_undone_on_exit(
    monkeypatch,
):
    """As the runtime's probe reset is when ``trt_kv.runtime.gpu.cuda`` is first imported
    inside a block: its undo must still run when the block ends."""
    monkeypatch.setattr(hooks, "_INSTALLERS", [])  # the registry as it was, after the test
    steps = []

    def installer():
        steps.append("installed")
        return lambda: steps.append("undone")

    with emulated_gpu():
        hooks.register_installer(installer)
        assert steps == ["installed"]
    assert steps == ["installed", "undone"]
    with emulated_gpu():
        assert steps == ["installed", "undone", "installed"]
    assert steps[-1] == "undone"
