#!/usr/bin/env python3
"""Tiny models a real vLLM can load here, where no weights can be downloaded.

Each model has random weights and a byte-level BPE tokenizer trained locally in about a second, and is
written in a Hugging Face cache layout (``<cache>/models--ORG--NAME/snapshots/<commit>/`` with
``refs/main``), so that vLLM loads it offline by its Hub id (``HF_HUB_OFFLINE=1``, ``HF_HUB_CACHE``) and
the project's Hub client resolves the same id through a local Hub-shaped server serving the same files.

The shapes cover what the planner's KV arithmetic distinguishes: grouped-query attention, multi-query
attention, tied embeddings, a sliding window (also one longer than the context), Gemma 2's alternating
layers with and without ``layer_types``, and a longer model for overload runs. Runs in the CPU
vLLM's virtual environment (torch, transformers, tokenizers, safetensors):

    $(python3 hack/cluster.py vllm path) hack/tiny_models.py DIR [NAME ...]

prints one JSON line per model: ``{"id": ..., "snapshot": ..., "config": {...}}``. Idempotent: a model
whose snapshot is complete is left as it is.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ORG = "llm-autopilot"
#: a fixed seed: the same files (and so the same commit hash) on every machine
SEED = 20261201
VOCAB = 512
SENTENCES = [
    "The operator plans vLLM settings that fit the GPU memory budget.",
    "When the KV cache is too small, the estimated maximum model length is lower.",
    "Kubernetes restarts the container and the kubelet records why it ended.",
    "Tensor parallel size, quantization and max_model_len are chosen together.",
    "Hello world. The quick brown fox jumps over the lazy dog 0123456789.",
]


@dataclass(frozen=True)
class TinyModel:
    name: str
    architecture: str  # transformers class name, as config.json `architectures` spells it
    config: dict[str, Any] = field(default_factory=dict)
    #: keys left out of the written config.json (transformers fills them in when it reads the config back)
    drop: tuple[str, ...] = ()

    @property
    def hub_id(self) -> str:
        return f"{ORG}/{self.name}"


_LLAMA = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 32, "intermediate_size": 256, "vocab_size": VOCAB, "max_position_embeddings": 32768,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False}

MODELS: tuple[TinyModel, ...] = (
    TinyModel("tiny-llama-gqa", "LlamaForCausalLM", dict(_LLAMA)),
    TinyModel("tiny-llama-mqa", "LlamaForCausalLM", {**_LLAMA, "num_key_value_heads": 1}),
    TinyModel("tiny-llama-tied", "LlamaForCausalLM", {**_LLAMA, "num_hidden_layers": 3, "num_key_value_heads": 4,
                                                      "tie_word_embeddings": True}),
    TinyModel("tiny-mistral-swa", "MistralForCausalLM", {**_LLAMA, "sliding_window": 256}),
    # a model-level window longer than the context, as Phi-3-mini-128k's 262,144 over 131,072 positions
    TinyModel("tiny-phi3-longwindow", "Phi3ForCausalLM", {**_LLAMA, "sliding_window": 65536, "pad_token_id": 2}),
    # Gemma 2 as the Hub's configs have it, without layer_types: transformers slides layers 0, 2, ..., 8 (5 of 9),
    # so 4 full + 5 sliding, near-equal counts vLLM groups by the larger one
    TinyModel("tiny-gemma2-9", "Gemma2ForCausalLM", {**_LLAMA, "num_hidden_layers": 9, "sliding_window": 256,
                                                    "tie_word_embeddings": True, "pad_token_id": 2},
              drop=("layer_types",)),
    # 3 full + 5 sliding layers named by layer_types: 5 is not below 1.5 x 3, so groups of the smaller count
    TinyModel("tiny-gemma2-3f5s", "Gemma2ForCausalLM", {
        **_LLAMA, "num_hidden_layers": 8, "sliding_window": 256, "tie_word_embeddings": True, "pad_token_id": 2,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                        "full_attention", "sliding_attention", "sliding_attention", "full_attention"]}),
)
BY_NAME = {m.name: m for m in MODELS}


# torch, transformers and tokenizers exist only in vLLM's environment; the project's tests import the model table
def _tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(SENTENCES * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(folder)


def _weights(model: TinyModel, folder: Path) -> None:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    torch.manual_seed(SEED)
    config_class = getattr(transformers, model.architecture.replace("ForCausalLM", "Config"))
    config = config_class(**model.config, bos_token_id=0, eos_token_id=1, architectures=[model.architecture])
    network = getattr(transformers, model.architecture)(config).to(torch.bfloat16)
    network.save_pretrained(folder, safe_serialization=True)
    # save_pretrained writes `dtype` on newer transformers; planners and older readers look for torch_dtype
    written = json.loads((folder / "config.json").read_text())
    written.setdefault("torch_dtype", "bfloat16")
    for key in model.drop:
        written.pop(key, None)
    (folder / "config.json").write_text(json.dumps(written, indent=2, sort_keys=True) + "\n")


def make(model: TinyModel, cache: Path) -> dict[str, Any]:
    """Write ``model`` into the Hugging Face cache ``cache`` (once); its id, snapshot folder and config."""
    repo = cache / f"models--{ORG}--{model.name}"
    ref = repo / "refs" / "main"
    if ref.is_file():
        snapshot = repo / "snapshots" / ref.read_text().strip()
        if (snapshot / "config.json").is_file() and (snapshot / "model.safetensors").is_file():
            return _describe(model, snapshot)
    staging = repo / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    _tokenizer(staging)
    _weights(model, staging)
    digest = hashlib.sha1()
    for path in sorted(staging.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    commit = digest.hexdigest()
    snapshot = repo / "snapshots" / commit
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    if snapshot.exists():
        shutil.rmtree(staging)
    else:
        staging.rename(snapshot)
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)  # written last: a half-made model is never found
    return _describe(model, snapshot)


def _describe(model: TinyModel, snapshot: Path) -> dict[str, Any]:
    config = json.loads((snapshot / "config.json").read_text())
    return {"id": model.hub_id, "snapshot": str(snapshot), "commit": snapshot.name, "config": config,
            "weight_bytes": (snapshot / "model.safetensors").stat().st_size}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    cache = Path(argv[0])
    names = argv[1:] or [m.name for m in MODELS]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        print(f"unknown model(s) {unknown}; known: {', '.join(BY_NAME)}", file=sys.stderr)
        return 2
    for name in names:
        print(json.dumps(make(BY_NAME[name], cache)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
