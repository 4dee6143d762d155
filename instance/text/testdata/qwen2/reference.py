import json
import os

import transformers
from transformers import AutoTokenizer, Qwen2Tokenizer
d = os.path.dirname(os.path.abspath(__file__))
specials = json.load(open(os.path.join(d, "cv3_specials.json")))
corpus = json.load(open(os.path.join(d, "corpus.json")))
st = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "additional_special_tokens": specials}
fast = AutoTokenizer.from_pretrained(d)
fast.add_special_tokens(st)
slow = Qwen2Tokenizer(os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt"), errors="replace", unk_token=None,
                      bos_token=None, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
slow.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
slow.add_special_tokens(st)
out = {"transformers": transformers.__version__, "fast_class": type(fast).__name__, "cases": []}
mism = 0
for t in corpus:
    a = fast([t])["input_ids"][0]
    b = slow([t])["input_ids"][0]
    if a != b:
        mism += 1
        print("MISMATCH slow/fast", repr(t), a, b)
    out["cases"].append({"text": t, "ids": a})
out["specials"] = {s: fast.convert_tokens_to_ids(s)
                   for s in ["<|endofprompt|>", "[breath]", "[laughter]", "<|endofsystem|>", "[ǜ]"]}
out["vocab_size"] = len(fast)
print("slow/fast mismatches:", mism, "len", len(fast), out["specials"])
dst = os.environ.get("OUT", "/tmp")
json.dump(out, open(os.path.join(dst, "ref_ids.json"), "w"), ensure_ascii=False)

fz = json.load(open(os.path.join(d, "fuzz.json")))
fout = {"transformers": transformers.__version__, "cases": []}
fm = 0
for t in fz:
    a = fast([t])["input_ids"][0]
    if a != slow([t])["input_ids"][0]:
        fm += 1
    fout["cases"].append({"text": t, "ids": a})
print("fuzz slow/fast mismatches:", fm, "of", len(fz))
json.dump(fout, open(os.path.join(dst, "fuzz_ids.json"), "w"), ensure_ascii=False)
