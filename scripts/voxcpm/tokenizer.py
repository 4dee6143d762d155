"""Writes a tiny tokenizer in the format of MiniCPM-4's (VoxCPM 1.5's text tokenizer).

    usage: python3 -m scripts.voxcpm.tokenizer OUT_DIR

write_tiny_tokenizer(out_dir) writes tokenizer.json, tokenizer_config.json and
special_tokens_map.json as the published model has them (a Hugging Face `tokenizers` BPE
converted from sentencepiece in Llama's legacy form: a Prepend("▁") + Replace(" ", "▁")
normalizer, no pre-tokenizer, byte_fallback, fuse_unk, a TemplateProcessing that adds <s>),
with a vocabulary of a few hundred entries laid out as sentencepiece lays out MiniCPM's: the
specials <unk> <s> </s> at 0..2, reserved pieces, the audio start/end specials at 101 and 102
(the ids VoxCPM hard-codes; their names here are this file's), the 256 byte pieces
<0x00>..<0xFF>, then "▁", single characters and the merged pieces, and MiniCPM's chat specials
last. Multi-character Chinese pieces ("你好", "世界", ...) are there so that VoxCPM's split of
them into single characters is exercised. tokenizer_config.json has what MiniCPM's has
(add_bos_token true, legacy true, eos <|im_end|>); legacy true makes transformers 5's
LlamaTokenizerFast put "▁" in front of every piece between added tokens.

Plain json writing: runs on Debian's python3 without transformers or tokenizers.
"""

import json
import os
import sys

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
AUDIO_START, AUDIO_END = "<|audio_start|>", "<|audio_end|>"
AUDIO_START_ID, AUDIO_END_ID = 101, 102
# MiniCPM's chat specials, in its order after the vocabulary (73440.. in the published one).
CHAT_SPECIALS = [
    "<|im_end|>",
    "<|im_start|>",
    "<|tool_call|>",
    "<|execute_start|>",
    "<|execute_end|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
]

CHARS = (
    [chr(c) for c in range(ord("a"), ord("z") + 1)]
    + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    + [str(d) for d in range(10)]
    + list(".,!?'\"-:;()")
    + list("你好世界我们中文的是")
)

# Merge order is rank order. Each result joins the vocabulary after the single characters.
MERGES = [
    ("▁", "t"),
    ("h", "e"),
    ("▁t", "he"),
    ("l", "l"),
    ("e", "ll"),
    ("ell", "o"),
    ("▁", "H"),
    ("▁H", "ello"),
    ("o", "r"),
    ("▁", "w"),
    ("▁w", "or"),
    ("l", "d"),
    ("▁wor", "ld"),
    ("i", "n"),
    ("▁", "a"),
    ("n", "d"),
    ("▁a", "nd"),
    ("'", "s"),
    ("▁", "▁"),
    ("1", "2"),
    ("▁", "1"),
    ("e", "r"),
    ("i", "s"),
    ("▁", "is"),
    ("你", "好"),
    ("世", "界"),
    ("▁", "你"),
    ("▁你", "好"),
    ("你好", "世界"),
    ("中", "文"),
    # "▁我" merges before "我们", so "▁我们" forms: a multi-character token with a "▁".
    ("▁", "我"),
    ("▁我", "们"),
    ("我", "们"),
    ("▁", "中"),
    ("的", "是"),
]


def _vocab():
    pieces = [UNK, BOS, EOS]
    pieces += ["<reserved_%d>" % i for i in range(len(pieces), AUDIO_START_ID)]
    pieces += [AUDIO_START, AUDIO_END]
    pieces += ["<0x%02X>" % b for b in range(256)]
    pieces += ["▁"] + CHARS
    for a, b in MERGES:
        if a + b not in pieces:
            pieces.append(a + b)
    pieces += CHAT_SPECIALS
    assert len(set(pieces)) == len(pieces), "duplicate piece"
    assert pieces[AUDIO_START_ID] == AUDIO_START and pieces[AUDIO_END_ID] == AUDIO_END
    return {p: i for i, p in enumerate(pieces)}


def _added(content, id_):
    return {
        "id": id_,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def tokenizer_json():
    vocab = _vocab()
    specials = [UNK, BOS, EOS, AUDIO_START, AUDIO_END] + CHAT_SPECIALS
    for a, b in MERGES:
        assert a in vocab and b in vocab, (a, b)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added(s, vocab[s]) for s in specials],
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
            ],
        },
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": BOS, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": BOS, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": BOS, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {BOS: {"id": BOS, "ids": [vocab[BOS]], "tokens": [BOS]}},
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": UNK,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "vocab": vocab,
            "merges": ["%s %s" % m for m in MERGES],
        },
    }


def tokenizer_config(vocab):
    specials = [UNK, BOS, EOS, AUDIO_START, AUDIO_END] + CHAT_SPECIALS
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": {
            str(vocab[s]): {k: v for k, v in _added(s, vocab[s]).items() if k != "id"} for s in specials
        },
        "additional_special_tokens": [AUDIO_START, AUDIO_END] + CHAT_SPECIALS,
        "bos_token": BOS,
        "clean_up_tokenization_spaces": False,
        "eos_token": CHAT_SPECIALS[0],
        "legacy": True,
        "model_max_length": 1000000000000000019884624838656,
        "pad_token": None,
        "sp_model_kwargs": {},
        "spaces_between_special_tokens": False,
        "tokenizer_class": "LlamaTokenizerFast",
        "unk_token": UNK,
        "use_default_system_prompt": False,
    }


def special_tokens_map():
    def tok(s):
        return {"content": s, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}

    return {
        "additional_special_tokens": [AUDIO_START, AUDIO_END] + CHAT_SPECIALS,
        "bos_token": tok(BOS),
        "eos_token": tok(CHAT_SPECIALS[0]),
        "unk_token": tok(UNK),
    }


def write_tiny_tokenizer(out_dir):
    """Writes the three tokenizer files into out_dir (created if missing)."""
    os.makedirs(out_dir, exist_ok=True)
    tj = tokenizer_json()
    files = {
        "tokenizer.json": tj,
        "tokenizer_config.json": tokenizer_config(tj["model"]["vocab"]),
        "special_tokens_map.json": special_tokens_map(),
    }
    for name, obj in files.items():
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=2)
            f.write("\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    write_tiny_tokenizer(sys.argv[1])
