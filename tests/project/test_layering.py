"""The package layering, checked on the import statements of every module (an AST pass, so an
import inside a function counts as much as one at the top):

    schemas/   the event contract: imports nothing of ours
    titoflow/  the library (tito, engine clients, bus, trainer client, settings, errors):
               imports schemas only, never a service
    ingress/   one deployable: schemas and titoflow, never workers; inside it, ``turns/`` (a
               turn, free of HTTP and Kafka) imports nothing of ``wire/``, ``control/`` or the bus
    workers/   the other: schemas and titoflow, never ingress
    cli/       the commands and the local stack (``cli/dev/``) on top: anything

and aiokafka and FastStream are imported by ``titoflow/bus/`` alone, torch (the optional extra
``titoflow[torch]``, never a core dependency) by ``titoflow/client/torch_data.py`` alone. In
tests/, no module imports a test module (``test_*.py``) or ``tests.conftest``: what tests
share lives in ``tests/support/``. The planted-violation tests show each check finds one,
so it cannot pass by reading nothing.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from titoflow.settings import PROJECT_ROOT

PACKAGES = ("schemas", "titoflow", "ingress", "workers", "cli")
MAY_IMPORT = {
    "schemas": {"schemas"},
    "titoflow": {"schemas", "titoflow"},
    "ingress": {"schemas", "titoflow", "ingress"},
    "workers": {"schemas", "titoflow", "workers"},
    "cli": set(PACKAGES),
}
KAFKA_HOME = Path("titoflow/bus")
KAFKA_CLIENTS = ("aiokafka", "faststream")
TURNS = Path("ingress/turns")
TURNS_MAY_NOT = ("ingress.wire", "ingress.control", "ingress.app", "ingress.server", "titoflow.bus")
TORCH_HOME = Path("titoflow/client/torch_data.py")


def imported(source: str) -> Iterator[tuple[int, str]]:
    """(line, module) of every absolute import in ``source``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def violations(root: Path) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            for line, module in imported(path.read_text()):
                top = module.split(".")[0]
                if top in PACKAGES and top not in MAY_IMPORT[package]:
                    found.append(f"{relative}:{line} imports {module}")
                if relative.is_relative_to(TURNS) and module.startswith(TURNS_MAY_NOT):
                    found.append(f"{relative}:{line} imports {module} (turns/ is below it)")
                if top in KAFKA_CLIENTS and not relative.is_relative_to(KAFKA_HOME):
                    found.append(f"{relative}:{line} imports {module} (only {KAFKA_HOME}/)")
                if top == "torch" and relative != TORCH_HOME:
                    found.append(f"{relative}:{line} imports {module} (only {TORCH_HOME})")
    return found


def imports_of_test_modules(root: Path) -> list[str]:
    """Imports of a test module (``test_*.py``) or of ``tests.conftest`` by a module of
    ``root/tests``: a ``from`` import counts with each name it takes (``from tests.x import
    test_y`` imports the module ``tests.x.test_y``)."""
    found = []
    for path in sorted((root / "tests").rglob("*.py")):
        relative = path.relative_to(root)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            hit = next((name for name in names if _names_a_test_module(name)), None)
            if hit is not None:
                found.append(f"{relative}:{node.lineno} imports {hit} (a test module)")
    return found


def _names_a_test_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "tests" and any(p.startswith("test_") or p == "conftest" for p in parts)


def test_every_package_imports_only_what_lies_below_it() -> None:
    for package in PACKAGES:
        assert any((PROJECT_ROOT / package).rglob("*.py")), f"{package}/ has no modules"
    assert violations(PROJECT_ROOT) == []


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        (
            "workers/x.py",
            "from ingress.turns.service import ChatService\n",
            "imports ingress.turns.service",
        ),
        ("ingress/x.py", "def f():\n    import workers.worker\n", "imports workers.worker"),
        ("titoflow/x.py", "from ingress import app\n", "imports ingress"),
        ("titoflow/tito/x.py", "from cli.main import main\n", "imports cli.main"),
        ("schemas/x.py", "from titoflow.settings import Settings\n", "imports titoflow.settings"),
        ("workers/x.py", "from aiokafka import TopicPartition\n", "(only titoflow/bus/)"),
        ("ingress/control/x.py", "from faststream import FastStream\n", "(only titoflow/bus/)"),
        ("titoflow/client/x.py", "import faststream.kafka\n", "(only titoflow/bus/)"),
        ("ingress/turns/x.py", "from ingress.wire.sse import x\n", "(turns/ is below it)"),
        ("ingress/turns/x.py", "import titoflow.bus\n", "(turns/ is below it)"),
        ("titoflow/client/x.py", "import torch\n", "(only titoflow/client/torch_data.py)"),
    ],
)
def test_a_planted_violation_is_found(
    tmp_path: Path, module: str, source: str, expected: str
) -> None:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / module).write_text(source)
    [found] = violations(tmp_path)
    assert found.startswith(module) and expected in found


def test_no_module_of_the_tests_imports_a_test_module_or_the_conftest() -> None:
    assert any((PROJECT_ROOT / "tests").rglob("test_*.py")), "tests/ has no test modules"
    assert imports_of_test_modules(PROJECT_ROOT) == []


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("tests/x/test_a.py", "from tests.y.test_b import helper\n", "imports tests.y.test_b"),
        ("tests/x/test_a.py", "from tests.conftest import witnessed\n", "imports tests.conftest"),
        ("tests/x/test_a.py", "def f():\n    import tests.y.test_b\n", "imports tests.y.test_b"),
        ("tests/x/test_a.py", "from tests.y import test_b\n", "imports tests.y.test_b"),
        ("tests/support/x.py", "from tests.y.test_b import helper\n", "imports tests.y.test_b"),
    ],
)
def test_a_planted_test_module_import_is_found(
    tmp_path: Path, module: str, source: str, expected: str
) -> None:
    """Beside it, a test module importing from tests/support/ is not one."""
    (tmp_path / "tests" / "support").mkdir(parents=True)
    (tmp_path / "tests" / "y").mkdir()
    (tmp_path / "tests" / "y" / "test_c.py").write_text("from tests.support.x import helper\n")
    (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / module).write_text(source)
    [found] = imports_of_test_modules(tmp_path)
    assert found.startswith(f"{module}:") and expected in found


def test_the_services_never_import_torch() -> None:
    """torch is the trainer's optional extra (installed here by the setup): an ingress or worker
    that loaded it would pay its second of start-up and its memory in every replica."""
    import subprocess
    import sys

    assert importlib.util.find_spec("torch") is not None, "the setup installs titoflow[torch]"
    probe = (
        "import sys; from pathlib import Path\n"
        "import ingress.app, workers.worker\n"
        "from titoflow.tito.tokenizer import load_tokenizer\n"
        "from titoflow.settings import PROJECT_ROOT\n"
        "load_tokenizer(PROJECT_ROOT / '.models' / 'tiny-qwen3-agent')\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout[:120]
