"""Packaging: pyproject.toml's metadata, the version in one place, the one-line refusal of an isolated build, and
the refusal to load a C++ extension compiled against another torch (docs/install.md).

Building a wheel takes minutes (the whole C++ extension), so it is not part of the suite; docs/install.md records
how it was checked by hand.
"""
from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pyproject():
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        tomllib = pytest.importorskip("tomli")
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _run(code: str, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=False, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, **kwargs)


def test_build_system_is_setuptools_without_torch(pyproject):
    build = pyproject["build-system"]
    assert build["build-backend"] == "setuptools.build_meta"
    # torch in the isolated build environment would compile the extension against a torch the user does not run
    assert not any(re.match(r"torch\b", r) for r in build["requires"]), build["requires"]


def test_metadata_is_complete(pyproject):
    project = pyproject["project"]
    for field in ("name", "description", "readme", "requires-python", "license", "authors", "classifiers",
                  "dependencies", "optional-dependencies", "scripts"):
        assert project.get(field), f"pyproject.toml [project]: {field} missing or empty"
    assert (ROOT / project["readme"]).is_file()
    assert project["scripts"]["vitfast"] == "vitfast.cli:main"
    assert {"export", "bench", "dev"} <= set(project["optional-dependencies"])
    assert {"onnx", "onnxruntime", "onnxscript"} <= set(project["optional-dependencies"]["export"])


def _requirement_names(requirements):
    return {re.match(r"[A-Za-z0-9_.-]+", r).group().lower() for r in requirements}


def test_dependencies_never_pin_torch(pyproject):
    """A pin (or an upper bound) on torch or torchvision would let pip replace the user's torch."""
    deps = pyproject["project"]["dependencies"]
    names = _requirement_names(deps)
    assert {"torch", "torchvision", "timm", "numpy", "safetensors"} <= names
    for req in deps:
        if _requirement_names([req]) & {"torch", "torchvision"}:
            assert not re.search(r"==|<|~=", req), f"{req!r}: lower bounds only"


def test_imported_third_party_modules_are_declared(pyproject):
    """Every top-level import of the package is a dependency, an extra, or the standard library."""
    if not hasattr(sys, "stdlib_module_names"):
        pytest.skip("sys.stdlib_module_names: Python >= 3.10")
    project = pyproject["project"]
    declared = _requirement_names(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared |= _requirement_names(extra)
    aliases = {"sklearn": "scikit-learn", "PIL": "pillow", "yaml": "pyyaml"}
    # pulled by torch or timm themselves, or only imported on a GPU machine (Triton ships with CUDA torch)
    indirect = {"triton", "pillow", "pyyaml", "huggingface_hub", "typing_extensions"}
    found = set()
    for path in list((ROOT / "vitfast").rglob("*.py")) + list((ROOT / "kernels").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                found.add(node.module.split(".")[0])
    third_party = {aliases.get(n, n).lower() for n in found
                   if n not in sys.stdlib_module_names and n not in ("vitfast", "kernels", "__future__")}
    missing = third_party - declared - indirect
    assert not missing, f"imported but not declared in pyproject.toml: {sorted(missing)}"


def test_version_has_one_source(pyproject):
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "vitfast._version.__version__"}
    assert not re.search(r"\bversion\s*=", (ROOT / "setup.py").read_text()), "setup.py: version= (pyproject has it)"
    assigned = [str(p.relative_to(ROOT)) for p in (ROOT / "vitfast").rglob("*.py")
                if re.search(r"^__version__\s*=", p.read_text(), re.MULTILINE)]
    assert assigned == ["vitfast/_version.py"], assigned


def test_version_is_read_without_importing_torch():
    """setuptools reads the version with ast (no import): a build environment without torch gets the metadata."""
    result = _run("""
        import sys
        from setuptools.config.expand import read_attr
        version = read_attr("vitfast._version.__version__", root_dir=".")
        assert "torch" not in sys.modules and "vitfast" not in sys.modules, sorted(sys.modules)
        import vitfast._version
        assert version == vitfast._version.__version__
        print(version)
    """)
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", result.stdout.strip())


def test_setup_py_without_torch_says_one_line():
    """What a plain `pip install .` shows (its isolated build environment has no torch): one line, no traceback."""
    result = _run("""
        import runpy, sys
        sys.modules["torch"] = None  # `import torch` raises ImportError, as in pip's isolated build environment
        sys.argv = ["setup.py", "egg_info"]
        runpy.run_path("setup.py", run_name="__main__")
    """)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install --no-build-isolation ." in lines[0], result.stderr


MISMATCH = """
    import sys, types, warnings
    import torch
    record = types.ModuleType("vitfast.ops._torch_build")
    record.TORCH_VERSION, record.CXX11_ABI = {version!r}, {abi}
    sys.modules["vitfast.ops._torch_build"] = record
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import vitfast
    messages = [str(w.message) for w in caught if "vitfast._C" in str(w.message)]
    assert len(messages) == 1 and "\\n" not in messages[0], messages
    print(messages[0])
    assert not vitfast.ops.extension_loaded() and vitfast.ops.cpu_isa() == "reference"
    x, w, b = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
    torch.testing.assert_close(torch.ops.vitfast.linear(x, w, b, None), torch.nn.functional.linear(x, w, b))
"""


def test_extension_built_for_another_torch_is_not_loaded():
    """Not a crash and not a silent fallback: one line naming both torch versions and the rebuild command."""
    result = _run(MISMATCH.format(version="2.3.1+cpu", abi="torch._C._GLIBCXX_USE_CXX11_ABI"))
    assert result.returncode == 0, result.stderr
    running = re.match(r"\d+\.\d+", str(__import__("torch").__version__)).group()
    message = result.stdout.strip()
    assert f"built for torch 2.3, this is torch {running}" in message, message
    assert "pip install --no-build-isolation --force-reinstall" in message, message


def test_extension_built_with_the_other_cxx11_abi_is_not_loaded():
    import torch

    result = _run(MISMATCH.format(version=str(torch.__version__), abi="not torch._C._GLIBCXX_USE_CXX11_ABI"))
    assert result.returncode == 0, result.stderr
    assert "_GLIBCXX_USE_CXX11_ABI" in result.stdout, result.stdout


def test_extension_built_for_this_torch_loads():
    import torch

    import vitfast

    if not vitfast.ops.extension_loaded():
        pytest.skip("the C++ extension is not built in this checkout")
    result = _run(f"""
        import sys, types, torch
        record = types.ModuleType("vitfast.ops._torch_build")
        record.TORCH_VERSION, record.CXX11_ABI = {str(torch.__version__)!r}, torch._C._GLIBCXX_USE_CXX11_ABI
        sys.modules["vitfast.ops._torch_build"] = record
        import vitfast
        assert vitfast.ops.extension_loaded(), vitfast.ops._extension._EXTENSION_ERROR
    """)
    assert result.returncode == 0, result.stderr
    assert "vitfast._C" not in result.stderr


def test_requirements_txt_matches_pyproject(pyproject):
    """scripts/setup.sh installs requirements.txt: the same requirements as pyproject.toml, less torch/torchvision."""
    project = pyproject["project"]
    wanted = set(project["dependencies"])
    for extra in ("export", "bench", "dev"):
        wanted |= {r for r in project["optional-dependencies"][extra] if not r.startswith("vitfast[")}
    wanted = {re.sub(r"\s*#.*", "", r) for r in wanted if not _requirement_names([r]) & {"torch", "torchvision"}}
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    listed = {line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()}
    assert listed == wanted, f"only in requirements.txt: {sorted(listed - wanted)}; only in pyproject.toml: " \
                             f"{sorted(wanted - listed)}"
