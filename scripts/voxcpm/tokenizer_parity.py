"""Writes VoxCPM's text-token ids for a fixed list of sentences, for the Go tokenizer's parity test.

    usage: python3 -m scripts.voxcpm.tokenizer_parity [--file-pipeline] [--fuzz] TOKENIZER_DIR OUT.json

Loads TOKENIZER_DIR with transformers' LlamaTokenizerFast, as VoxCPM does, and tokenizes each
sentence as VoxCPM's mask_multichar_chinese_tokens wrapper does: tokenize() (no <s>), every token
that is, after removing "▁", a vocabulary entry of two or more characters all in U+4E00..U+9FFF
is replaced by its single characters (the "▁" is dropped with it), then convert_tokens_to_ids
(a character outside the vocabulary becomes the unk id). OUT.json is {sentence: [ids]}; with the
tiny tokenizer (scripts/voxcpm/tokenizer.py) it is instance/text/testdata/llama_parity.json.

transformers 5's LlamaTokenizerFast replaces the file's normalizer and pre-tokenizer with a
Metaspace of its own; --file-pipeline loads tokenizer.json as the tokenizers library reads it
(PreTrainedTokenizerFast, as transformers 4's LlamaTokenizerFast did) instead, which gives
instance/text/testdata/llama_parity_file.json. --fuzz takes 400 random strings of FUZZ_PIECES
(a fixed seed, 382 distinct) instead of the sentences: instance/text/testdata/llama_fuzz.json.

Needs transformers (and tokenizers).
"""

import json
import random
import sys

SENTENCES = [
    "",
    "Hello world.",
    "Hello world. It's 12 o'clock, and the world is fine!",
    "the end",
    " Hello",
    "Hello ",
    "  Hello  world  ",
    "a  b   c",
    "Numbers: 3.14, 1234567890 and 42.",
    "Don't stop - we're \"quoted\" (parens); colon: yes?",
    "你好世界",
    "你好，世界！",
    "我们是中文的是",
    "你们",
    "中文",
    " 你好",
    "Hello 你好 world 世界",
    "中文 English 混合 text.",
    "emoji 😀 test",
    "😀",
    "Ünïcödé café",
    "Tab\tand\nnewline",
    "<|im_start|>Hello<|im_end|>",
    "<|im_start|>你好<|im_end|> world",
    "Hello<|im_end|><|im_end|>  ",
    "Hello <s> world </s>",
    "▁already",
]

# Pieces the tiny tokenizer has merges, byte fallback and added tokens for, and the spaces and
# control characters around them.
FUZZ_PIECES = ["Hello", "world", "the", " ", "  ", "你", "好", "世界", "我们", "中文", "你好世界", "😀",
               "é", "<s>", "</s>", "<|im_end|>", "<|im_start|>", "12", "3", ".", ",", "'s", "▁", "\t",
               "\n", "a", "nd", "is", "in", "混", "们", "▁我"]


def fuzz_texts():
    rng = random.Random(7)
    return sorted({"".join(rng.choice(FUZZ_PIECES) for _ in range(rng.randint(1, 12))) for _ in range(400)})


def is_multichar_chinese(token):
    return len(token) >= 2 and all("\u4e00" <= c <= "\u9fff" for c in token)


def voxcpm_ids(tok, multichar, text):
    out = []
    for token in tok.tokenize(text):
        clean = token.replace("▁", "")
        if clean in multichar:
            out.extend(clean)
        else:
            out.append(token)
    return tok.convert_tokens_to_ids(out)


def main():
    args = sys.argv[1:]
    file_pipeline = "--file-pipeline" in args
    fuzz = "--fuzz" in args
    args = [a for a in args if a not in ("--file-pipeline", "--fuzz")]
    if len(args) != 2:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    import os

    import tokenizers
    import transformers
    from transformers import LlamaTokenizerFast, PreTrainedTokenizerFast

    if file_pipeline:
        tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(args[0], "tokenizer.json"), unk_token="<unk>")
    else:
        tok = LlamaTokenizerFast.from_pretrained(args[0])
    multichar = {t for t in tok.vocab.keys() if is_multichar_chinese(t)}
    result = {s: voxcpm_ids(tok, multichar, s) for s in (fuzz_texts() if fuzz else SENTENCES)}
    with open(args[1], "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=1)
        f.write("\n")
    backend = tok.backend_tokenizer
    print(
        "transformers %s, tokenizers %s; normalizer %s; pre_tokenizer %s"
        % (transformers.__version__, tokenizers.__version__, backend.normalizer, backend.pre_tokenizer)
    )
    for s, ids in result.items():
        print(repr(s), ids, tok.convert_ids_to_tokens(ids))


if __name__ == "__main__":
    main()
