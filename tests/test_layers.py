"""The layers are a contract the suite checks: import-linter's ``layers`` and
``acyclic_siblings`` contracts in ``pyproject.toml`` (no ``ignore_imports``), every package
of trt_kv placed in a layer, and no module over 400 lines. Each way the contract can break is
shown to break it, on a copy of the package with one import added."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own TOML reader
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "trt_kv"
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
LINT = [
    sys.executable,
    "-c",
    "from importlinter.cli import lint_imports_command; lint_imports_command()",
]
MOST_LINES = 400


def _contract(kind: str) -> dict:
    """The first contract of ``kind`` (the package's layers, for ``"layers"``)."""
    return next(c for c in CONFIG["contracts"] if c["type"] == kind)


def _lint(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the trt_kv found under ``root``, with pyproject.toml's contracts."""
    return subprocess.run(
        [*LINT, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        capture_output=True,
        text=True,
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        check=False,
    )


def test_the_package_keeps_its_layers_and_has_no_import_circles():
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"Contracts: {len(CONFIG['contracts'])} kept, 0 broken." in out.stdout


def test_the_contracts_ignore_no_import():
    assert all("ignore_imports" not in c for c in CONFIG["contracts"])


def _top_level_parts() -> set[str]:
    """Every module and package directly under trt_kv/ (engine/'s parts one level down)."""
    parts = {p.stem for p in PACKAGE.glob("*.py")} | {
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()
    }
    parts -= {"__init__", "__main__", "engine"}
    parts |= {f"engine.{p.stem}" for p in (PACKAGE / "engine").glob("*.py")} - {"engine.__init__"}
    return {f"trt_kv.{p}" for p in parts}


def test_every_part_of_trt_kv_has_a_layer_and_every_package_is_checked_for_circles():
    layers = _contract("layers")["layers"]
    placed = {name.strip() for layer in layers for name in layer.split("|")}
    assert _top_level_parts() == placed
    packages = {p for p in _top_level_parts() if (PACKAGE / p.split(".")[1]).is_dir()}
    packages = {p for p in packages if not p.startswith("trt_kv.engine.")} | {"trt_kv.engine"}
    assert set(_contract("acyclic_siblings")["ancestors"]) == packages


@pytest.fixture
def copy(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "trt_kv", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _add_import(root: Path, module: str, imported: str) -> None:
    path = root / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = path.with_suffix("") / "__init__.py"
    path.write_text(path.read_text() + f"\nimport {imported}  # noqa\n")


@pytest.mark.parametrize(
    ("module", "imported", "broken"),
    [
        # an import running back up the layers
        ("trt_kv.errors", "trt_kv.cli", "trt_kv.errors is not allowed to import trt_kv.cli"),
        (
            "trt_kv.runtime.session",
            "trt_kv.models.llama",
            "trt_kv.runtime is not allowed to import trt_kv.models",
        ),
        # the emulator importing anything above the runtime, or the runtime itself
        (
            "trt_kv.emulator.engines",
            "trt_kv.engine.store",
            "trt_kv.emulator is not allowed to import trt_kv.engine.store",
        ),
        (
            "trt_kv.emulator.engines",
            "trt_kv.runtime.session",
            "trt_kv.emulator is not allowed to import trt_kv.runtime",
        ),
        # two packages of one layer are independent
        (
            "trt_kv.plugin.kernels",
            "trt_kv.reference.ops",
            "trt_kv.plugin is not allowed to import trt_kv.reference",
        ),
        # each model whole: GPT-2 imports nothing of Llama, the shared layers no model
        (
            "trt_kv.models.gpt2.network",
            "trt_kv.models.llama.rope",
            "trt_kv.models.gpt2 is not allowed to import trt_kv.models.llama",
        ),
        (
            "trt_kv.models.layers.graph",
            "trt_kv.models.gpt2.config",
            "trt_kv.models.layers is not allowed to import trt_kv.models.gpt2",
        ),
    ],
)
def test_an_import_running_back_up_breaks_the_layers(copy, module, imported, broken):
    _add_import(copy, module, imported)
    out = _lint(copy)
    assert out.returncode == 1, out.stdout + out.stderr
    assert broken in out.stdout


def test_an_import_circle_inside_a_package_breaks_the_contract(copy):
    # session imports cache_state; cache_state importing session closes a circle
    _add_import(copy, "trt_kv.runtime.cache_state", "trt_kv.runtime.session")
    out = _lint(copy)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "No cycles are allowed in trt_kv.runtime." in out.stdout


def test_no_module_of_trt_kv_is_over_400_lines():
    sizes = {p: len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    over = {str(p.relative_to(ROOT)): n for p, n in sizes.items() if n > MOST_LINES}
    assert over == {}


def _readme_layers() -> list[set[str]]:
    """The rows of README.md's Layout block as sets of module names (``engine/store.py`` ->
    ``trt_kv.engine.store``), continuation lines left out."""
    text = (ROOT / "README.md").read_text().split("## Layout", 1)[1]
    block = text.split("```\n", 2)[1]
    rows = []
    for line in block.splitlines():
        if line and not line.startswith(" "):
            paths = [
                n.strip().removesuffix(".py").strip("/") for n in line.split("  ")[0].split("|")
            ]
            rows.append({f"trt_kv.{p.replace('/', '.')}" for p in paths})
    return rows


def test_the_readme_draws_the_layers_of_the_contract():
    layers = _contract("layers")["layers"]
    assert _readme_layers() == [{n.strip() for n in layer.split("|")} for layer in layers]
