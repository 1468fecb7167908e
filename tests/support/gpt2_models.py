"""A seeded random-weight GPT-2 of odd sizes, saved by transformers' ``save_pretrained``."""

from pathlib import Path

# odd sizes: V prime, H = 12, F not a multiple of D, n_positions just above the tests' S_max
HF_CONFIG = dict(
    vocab_size=101,
    n_positions=40,
    n_embd=60,
    n_layer=2,
    n_head=5,
    n_inner=97,
    initializer_range=0.3,  # logits far apart: greedy ids that vary
    bos_token_id=1,
    eos_token_id=2,
)
# sizes only: every other key at GPT2Config's default (eos_token_id 50256, past this
# vocabulary; n_inner null), n_positions below the default S_max (512)
SIZES_ONLY = dict(vocab_size=211, n_positions=48, n_embd=32, n_layer=2, n_head=4)
PROMPTS = [[5, 17, 42, 8, 99, 3, 61], [61, 3]]  # ragged


def save_gpt2(folder: Path, seed: int = 0, base: dict = HF_CONFIG, **overrides: object) -> object:
    """``GPT2LMHeadModel`` of ``GPT2Config(**base, **overrides)`` with seeded random weights
    saved into ``folder``; returns the model (eval mode)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(**{**base, **overrides})).eval()
    model.save_pretrained(folder)
    return model


def hf_greedy(model: object, prompt: list[int], n: int) -> list[int]:
    """``n`` greedy ids after ``prompt`` from transformers (no early stop)."""
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def save_tokenizer(folder: Path) -> int:
    """A small byte-level BPE ``tokenizer.json`` (GPT-2's kind) trained on one sentence;
    returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
    )
    tokenizer.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 5, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer.get_vocab_size()
