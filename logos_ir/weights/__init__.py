"""Weight stores: the tensors of a Llama-family model, read from safetensors, GGUF, or made up at random.

Every store answers in one vocabulary, the Hugging Face tensor names and layouts
(`model.layers.0.self_attn.q_proj.weight` is [out_features, in_features]), as read-only float32 arrays,
converted at most once and cached. Files are untrusted input: each failure is a `WeightError` naming the file
and, where there is one, the tensor.

- `store`: the `WeightStore` interface, `RandomWeights`, `ArrayStore` and the tensors a spec needs;
- `safetensors`: Hugging Face model folders, written (`save_model`, `hf_config`) and read (`SafetensorsStore`);
- `gguf`: llama.cpp's GGUF files (`GGUFFile`, `GGUFStore`) and its tensor names and Q/K row order;
- `hub`: the local Hugging Face cache and the embedded model.

`open_model` opens a model by the name a user gives.
"""

from __future__ import annotations

from pathlib import Path

from logos_ir.errors import WeightError
from logos_ir.spec import ModelSpec
from logos_ir.weights.gguf import GGUFFile, GGUFStore, gguf_tensor_name, hf_tensor_name, permute_qk, unpermute_qk
from logos_ir.weights.hub import embedded_model_path, hub_snapshot, is_hub_id, resolve_hub_id
from logos_ir.weights.safetensors import SafetensorsStore, hf_config, read_index, save_model
from logos_ir.weights.store import ArrayStore, RandomWeights, WeightStore, expected_weights

__all__ = [
    "ArrayStore",
    "GGUFFile",
    "GGUFStore",
    "RandomWeights",
    "SafetensorsStore",
    "WeightStore",
    "embedded_model_path",
    "expected_weights",
    "gguf_tensor_name",
    "hf_config",
    "hf_tensor_name",
    "hub_snapshot",
    "is_hub_id",
    "open_model",
    "permute_qk",
    "read_index",
    "resolve_hub_id",
    "save_model",
    "unpermute_qk",
]


def open_model(model: str | Path | None = None, seed: int = 0) -> WeightStore:
    """A weight store by name: a preset (random weights from `seed`), a Hugging Face folder, a `.gguf` file,
    or None, "" or "embedded" for the embedded SmolLM2-135M-Instruct."""
    if model is None or model in ("", "embedded"):
        return GGUFStore(embedded_model_path())
    if isinstance(model, str) and model in ModelSpec.presets():
        return RandomWeights(ModelSpec.preset(model), seed)
    path = Path(model)
    if path.is_dir():
        return SafetensorsStore(path)
    if path.suffix.lower() == ".gguf":
        return GGUFStore(path)
    if isinstance(model, str) and is_hub_id(model):
        return SafetensorsStore(resolve_hub_id(model))
    raise WeightError(
        f"'{model}' is not a model preset, a model folder, a .gguf file or a hub id in the local cache",
        hint=f"give 'embedded', a preset ({', '.join(ModelSpec.presets())}), a folder with config.json and "
        "safetensors, a .gguf file, or a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct",
    )
