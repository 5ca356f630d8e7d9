"""A tiny Llama that vLLM's real engine runs on CPU, built offline and reproducibly.

Run as ``python tests/engine_model.py DIR`` (any venv with ``tokenizers``, ``transformers`` and
``torch``; the engine tests use the engine venv's). It writes a Hugging Face model directory:

* a byte-level BPE tokenizer (vocabulary of a few hundred, trained on a few sentences), wrapped
  in ``PreTrainedTokenizerFast`` with bos/eos/pad/unk and a toy chat template;
* ``LlamaForCausalLM`` with two layers, hidden size 128 and head_dim 32 (vLLM's CPU attention
  backend takes head sizes 32, 64, 80, ...), random weights seeded with 0, in bfloat16,
  saved as safetensors; the model's vocabulary is the tokenizer's length, so every id it
  samples decodes.

Why not a real checkpoint: there is no network for one, and the engine tests compare greedy
token ids between boots, which any fixed weights give. Seeded, so every build gives the same
model; about 7 s. Why not shared with tests/vllm_cpu.py's config-only model: that one has no
weights (it is never run), this one is run by the engine end to end.
"""

from __future__ import annotations

import sys
from pathlib import Path

CORPUS = [
    "plancache signs startup plans and compile caches for vLLM.",
    "A serving node pulls the signed cache, verifies it, and loads it.",
    "The quick brown fox jumps over the lazy dog.",
    "Every byte from a store is hostile until it is verified.",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def build(directory: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory, safe_serialization=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: engine_model.py DIR")
    build(Path(sys.argv[1]))
