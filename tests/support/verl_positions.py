"""verl's own position ids for a batch's rows, run in .venv-verl (verl 0.7.1, transformers 4.57.6)
by tests/titoflow/client/test_image_inputs.py:

    .venv-verl/bin/python tests/support/verl_positions.py INPUT.pkl OUTPUT.json

INPUT holds the VL policy's directory and named batches, each its ``input_ids``,
``attention_mask`` and ``multi_modal_inputs`` (numpy, as ``to_verl`` made them). Each row goes,
as verl's agent loop hands it one sample at a time, through its
``AgentLoopWorker._compute_position_ids``, compiled from verl's source as written (its module
imports hydra, which this environment does not install; the method uses only torch and
``self.processor``). The processor is a stand-in holding what verl's ``hf_processor``
(verl/utils/tokenizer.py) puts on the real one, the model's config as ``config`` and the model
class's ``get_rope_index`` bound to it (the real one cannot load here: its image processor needs
PIL): for the Qwen3-VL policy's own config, for Qwen2-VL's and Qwen2.5-VL's default configs
(the same vision token ids and merge size), and no processor, as verl runs a text model.
OUTPUT maps each batch's name, then each of these (``"text"`` and the three model types), to the
batch's position ids.
"""

from __future__ import annotations

import ast
import json
import pickle
import sys
import types
from pathlib import Path
from typing import Any

import torch
import verl
from transformers import AutoConfig, Qwen2_5_VLConfig, Qwen2VLConfig
from transformers.models.qwen2_5_vl import Qwen2_5_VLModel
from transformers.models.qwen2_vl import Qwen2VLModel
from transformers.models.qwen3_vl import Qwen3VLModel
from verl.utils.model import compute_position_id_with_mask

AGENT_LOOP = Path(verl.__file__).parent / "experimental" / "agent_loop" / "agent_loop.py"


def compute_position_ids() -> Any:
    """``AgentLoopWorker._compute_position_ids``, compiled from verl's source."""
    tree = ast.parse(AGENT_LOOP.read_text())
    [worker] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "AgentLoopWorker"]
    [method] = [
        n
        for n in worker.body
        if isinstance(n, ast.FunctionDef) and n.name == "_compute_position_ids"
    ]
    namespace = {"torch": torch, "compute_position_id_with_mask": compute_position_id_with_mask}
    exec(compile(ast.Module([method], []), str(AGENT_LOOP), "exec"), namespace)
    return namespace["_compute_position_ids"]


def processor(model_class: Any, config: Any) -> Any:
    """What verl/utils/tokenizer.py hf_processor does to the processor, on a stand-in."""
    stand_in = types.SimpleNamespace(config=config)
    stand_in.get_rope_index = types.MethodType(model_class.get_rope_index, stand_in)
    return stand_in


def main(source: Path, target: Path) -> None:
    given = pickle.loads(source.read_bytes())
    method = compute_position_ids()
    workers = {
        "text": types.SimpleNamespace(processor=None),
        "qwen3_vl": types.SimpleNamespace(
            processor=processor(Qwen3VLModel, AutoConfig.from_pretrained(given["policy_path"]))
        ),
        "qwen2_vl": types.SimpleNamespace(processor=processor(Qwen2VLModel, Qwen2VLConfig())),
        "qwen2_5_vl": types.SimpleNamespace(
            processor=processor(Qwen2_5_VLModel, Qwen2_5_VLConfig())
        ),
    }
    out: dict[str, dict[str, Any]] = {}
    for batch_name, batch in given["batches"].items():
        ids, mask = torch.from_numpy(batch["input_ids"]), torch.from_numpy(batch["attention_mask"])
        out[batch_name] = {}
        for name, worker in workers.items():
            rows = [
                method(
                    worker,
                    ids[row : row + 1],
                    mask[row : row + 1],
                    {k: torch.from_numpy(v) for k, v in inputs.items()},
                )
                for row, inputs in enumerate(batch["multi_modal_inputs"])
            ]
            out[batch_name][name] = torch.cat(rows).tolist()
    target.write_text(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
