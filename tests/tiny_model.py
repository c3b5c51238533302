"""Build a tiny causal LM in HF format from a config, with a byte-level BPE tokenizer trained on the spot.

No download: the weights are random and the tokenizer is trained on a few sentences. Real engines (vLLM,
transformers) load and run it exactly as they would a real model; the text it writes is noise.
"""

from __future__ import annotations

import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "The answer is 42. Reason step by step and put the final answer in a box.",
    '{"operations": [{"op": "add", "text": "Check units before answering."}]}',
    "0123456789 + - * / = ( ) { } [ ] boxed frac sqrt",
] * 20


def build(target: str | Path, hidden: int = 128, layers: int = 2) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    import torch

    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    raw.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        bos_token=None)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(target)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=1,  # head_dim 64: vLLM's CPU attention needs it max_position_embeddings=2048,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None, tie_word_embeddings=True, torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.save_pretrained(target)
    return target


if __name__ == "__main__":
    print(build(sys.argv[1], *(int(a) for a in sys.argv[2:4])))
