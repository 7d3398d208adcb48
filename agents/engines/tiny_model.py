"""A tiny Llama made here, never downloaded: what the real SGLang serves on a CPU in the tests,
the local fleet and the fidelity benchmark, and the simulator's tokenizer.

A byte-level BPE tokenizer is trained on a corpus drawn from a fixed word list, and the
weights are random numbers, both from one seed: the same seed writes the same files, byte
for byte. The weights are written as safetensors by hand (the format is a length, a JSON
header and the raw tensors), so that the project's own environment makes the model without
torch or transformers; SGLang's environment loads it with them.

The model says nothing meaningful: its answers are random tokens. What it is for is the
engine's contract (its endpoints, its tokenizer, its scheduler, its radix cache, its metrics
and KV events), which are all SGLang's real code.
"""

from __future__ import annotations

import json
import random
import struct
from array import array
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS, EOS, PAD = "<|begin_of_text|>", "<|im_end|>", "<|pad|>"
IM_START = "<|im_start|>"
SPECIAL = [BOS, EOS, PAD, IM_START]
VOCAB_SIZE = 512
HIDDEN, INTERMEDIATE, LAYERS, HEADS = 64, 128, 2, 4
CONTEXT = 4096
# ChatML, as SGLang renders a chat template with its own Jinja (and the router with its own)
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if "
    "so no what can more out up about into them some could time only other new these two "
    "may first then do any like my now over such our man me even most made after also did "
    "many before must through back years where much your way well down should because each "
    "just those people how too little state good very make world still own see men work "
    "long get here between both life being under never day same another know while last "
    "might us great old year off come since against go came right used take three engine "
    "token cache prefix region model request answer stream worker route serve quick brown "
    "fox jumps over lazy dog hello how are you today question tell story about river city"
)
WORDS = tuple(_TEXT.split(" "))


def corpus(seed: int, lines: int = 400) -> list[str]:
    """Sentences of the word list with punctuation and digits, from the seed."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 16))]
        words[0] = words[0].capitalize()
        end = rng.choice([".", "?", "!", ",", ":", f" {rng.randint(0, 999)}."])
        out.append(" ".join(words) + end)
    return out


def train_tokenizer(seed: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(seed), trainer=trainer)
    return tokenizer


def _shapes(vocab: int) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, HIDDEN)}
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[f"{p}self_attn.{name}.weight"] = (HIDDEN, HIDDEN)
        shapes[f"{p}mlp.gate_proj.weight"] = (INTERMEDIATE, HIDDEN)
        shapes[f"{p}mlp.up_proj.weight"] = (INTERMEDIATE, HIDDEN)
        shapes[f"{p}mlp.down_proj.weight"] = (HIDDEN, INTERMEDIATE)
        shapes[f"{p}input_layernorm.weight"] = (HIDDEN,)
        shapes[f"{p}post_attention_layernorm.weight"] = (HIDDEN,)
    shapes["model.norm.weight"] = (HIDDEN,)
    shapes["lm_head.weight"] = (vocab, HIDDEN)
    return shapes


def _bf16(values: list[float]) -> bytes:
    """bfloat16, little-endian: the upper half of each float32 (rounded to nearest)."""
    words = array("I", array("f", values).tobytes())
    return array("H", ((w + 0x7FFF + ((w >> 16) & 1)) >> 16 for w in words)).tobytes()


def safetensors(shapes: dict[str, tuple[int, ...]], seed: int) -> bytes:
    """Random bf16 weights (norms 1.0), as a safetensors file."""
    rng = random.Random(seed)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, shape in shapes.items():
        count = 1
        for size in shape:
            count *= size
        if name.endswith("norm.weight"):
            values = [1.0] * count
        else:
            values = [rng.gauss(0.0, 0.05) for _ in range(count)]
        blob = _bf16(values)
        header[name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [offset, offset + len(blob)]}  # fmt: skip
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the header padded to 8 bytes, as the format allows
    return struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs)


def write(directory: Path, seed: int = 0) -> Path:
    """Write the model into `directory` (made if missing); the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(seed)
    vocab = tokenizer.get_vocab_size()
    ids = {name: tokenizer.token_to_id(name) for name in SPECIAL}
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": HIDDEN // HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[EOS],
        "pad_token_id": ids[PAD],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "attention_bias": False,
        "mlp_bias": False,
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": CONTEXT,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    generation = {"bos_token_id": ids[BOS], "eos_token_id": ids[EOS], "pad_token_id": ids[PAD]}
    special_map = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    files = {
        "config.json": config,
        "tokenizer_config.json": tokenizer_config,
        "generation_config.json": generation,
        "special_tokens_map.json": special_map,
    }
    for name, document in files.items():
        (directory / name).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    (directory / "model.safetensors").write_bytes(safetensors(_shapes(vocab), seed))
    return directory


ADAPTER_TARGETS = ("q_proj", "v_proj")


def write_adapter(
    directory: Path, model_dir: Path, seed: int = 1, rank: int = 4,
    targets: tuple[str, ...] = ADAPTER_TARGETS,
) -> Path:  # fmt: skip
    """A LoRA adapter for the tiny model, as PEFT saves one (`adapter_config.json` and
    `adapter_model.safetensors`: each target projection's `lora_A` (rank x in) and `lora_B`
    (out x rank)), its weights random from `seed`, written into `directory` (made if
    missing); the directory. Written by hand, as the model is: PEFT needs torch, which the
    project's own environment does not have. SGLang loads it (`/load_lora_adapter`) as it
    loads any PEFT adapter."""
    directory.mkdir(parents=True, exist_ok=True)
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in range(LAYERS):
        for name in targets:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}."
            shapes[prefix + "lora_A.weight"] = (rank, HIDDEN)
            shapes[prefix + "lora_B.weight"] = (HIDDEN, rank)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model_dir),
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": list(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "adapter_model.safetensors").write_bytes(safetensors(shapes, seed))
    return directory
