"""Every op wheel, and the template a new one is copied from, has the same files for the same roles
(docs/adding-an-operator.md): a newcomer who knows one op knows where everything is in the others."""

import ast
from pathlib import Path

import pytest

PACKAGES = Path(__file__).resolve().parents[3] / "packages"
# spec: the import-light entry; seam: the vLLM side and its installation; kernels: @triton.jit only; launch:
# launchers and default launch sizes; policy: which calls the kernel takes and the tuning file's settings;
# reference: fp32 references for tests and benchmarks
ROLES = {"__init__.py", "version.py", "spec.py", "seam.py", "kernels.py", "launch.py", "policy.py", "reference.py"}
OPTIONAL = {"tune.py"}  # an op's own tuner, run by `infera-vllm tune OP` (OpSpec.tune)
TEMPLATE = PACKAGES / "_template"


def op_dirs() -> list[Path]:
    return sorted(p for p in PACKAGES.glob("*/src/infera_ops/*") if p.is_dir() and p.name != "__pycache__")


@pytest.mark.parametrize("op_dir", op_dirs(), ids=lambda p: p.parts[-4])
def test_each_op_has_the_same_modules(op_dir):
    modules = {p.name for p in op_dir.glob("*.py")}
    assert ROLES <= modules, f"{op_dir}: missing {sorted(ROLES - modules)}"
    assert modules <= ROLES | OPTIONAL, f"{op_dir}: modules outside the roles: {sorted(modules - ROLES - OPTIONAL)}"
    assert not [p for p in op_dir.iterdir() if p.is_dir() and p.name not in ("tuning", "__pycache__")]
    tests = {p.name for p in (op_dir.parents[2] / "tests").glob("test_*.py")}
    name = op_dir.name
    assert {f"test_{name}_wheel.py", f"test_{name}_kernels.py"} <= tests


@pytest.mark.parametrize("op_dir", op_dirs(), ids=lambda p: p.parts[-4])
def test_kernels_modules_hold_only_triton_functions(op_dir):
    tree = ast.parse((op_dir / "kernels.py").read_text())
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Try)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the module docstring
        assert isinstance(node, ast.FunctionDef), f"{op_dir.name}/kernels.py line {node.lineno}: not a kernel"
        assert any("jit" in ast.unparse(d) for d in node.decorator_list), f"{node.name} is not @triton.jit"


def test_the_template_has_every_role_and_parses_once_filled_in():
    (op_dir,) = [p for p in (TEMPLATE / "src" / "infera_ops").iterdir() if p.is_dir()]
    assert {p.name for p in op_dir.glob("*.py")} == ROLES
    assert (op_dir / "tuning").is_dir()
    tests = {p.name for p in (TEMPLATE / "tests").glob("*.py")}
    assert tests == {"conftest.py", "test_REPLACE_ME_MODULE_wheel.py", "test_REPLACE_ME_MODULE_kernels.py"}
    for path in [*op_dir.glob("*.py"), *(TEMPLATE / "tests").glob("*.py")]:
        ast.parse(path.read_text().replace("REPLACE_ME_MODULE", "my_op").replace("REPLACE_ME", "my_op"),
                  filename=str(path))
