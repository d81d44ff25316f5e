"""SGLang's own request/response definitions, read from its published package (pinned), for
tests/titoflow/engine/test_sglang_contract.py. No SGLang server runs on these machines; the package
is never
installed or imported: ``python -m tests.support.sglang_reference`` (run by scripts/setup.sh)
downloads the wheel once with pip and extracts just these files into ``.tools/sglang-<version>``.
Only ``api_types.py`` (the generated JSON contract, which needs nothing but msgspec) is loaded
as a module; the others are parsed with ``ast``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from types import ModuleType

from titoflow.settings import PROJECT_ROOT

VERSION = "0.5.23"
ROOT = PROJECT_ROOT / ".tools" / f"sglang-{VERSION}"
FILES = (
    "sglang/api/v1/api_types.py",  # the JSON contract both SGLang servers enforce
    "sglang/srt/managers/io_struct.py",  # GenerateReqInput: what the Python server parses
    "sglang/srt/sampling/sampling_params.py",  # SamplingParams: what it samples with
    "sglang/srt/managers/tokenizer_manager.py",  # builds meta_info
    "sglang/srt/utils/weight_versions.py",  # meta_info weight_version(s)
    "sglang/srt/entrypoints/http_server.py",  # /generate SSE framing, /abort_request
)


PIP_DOWNLOAD = (sys.executable, "-m", "pip", "download", "--quiet", "--no-deps")


def path(name: str) -> Path:
    found = ROOT / name
    if not found.is_file():
        raise FileNotFoundError(
            f"{found} is missing: run `python -m tests.support.sglang_reference`"
        )
    return found


def api_types() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sglang_api_types", path(FILES[0]))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # msgspec resolves the annotations through it
    spec.loader.exec_module(module)
    return module


def fetch() -> None:
    if all((ROOT / name).is_file() for name in FILES):
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [*PIP_DOWNLOAD, f"sglang=={VERSION}", "-d", tmp],
            check=True,
        )
        [wheel] = Path(tmp).glob("sglang-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            for name in FILES:
                target = ROOT / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(name))


if __name__ == "__main__":
    fetch()
