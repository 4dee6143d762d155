"""Imports OpenBMB/VoxCPM's own v1 model code (VoxCPMModel, AudioVAE) from a copy of its
`src/voxcpm` package, for scripts/voxcpm/parity.py and scripts/voxcpm/baseline.py. The copy is not
part of voxmux: scripts/voxcpm/fetch_reference.sh puts it in the git-ignored `.ref/`.

    import voxcpm_reference as vref
    vref.install("/path/to/.ref")          # .ref/src/voxcpm or .ref/voxcpm
    VoxCPMModel = vref.model_module().VoxCPMModel

What is replaced, and why:
- `pydantic`, where it is not installed: the v1 configs only need a BaseModel with defaults,
  nested models built from dicts, model_copy(deep=True), model_validate_json and model_rebuild;
  `PydanticShim` below does that much (extra keys are ignored, as pydantic does by default).
- the packages `voxcpm` and `voxcpm.model` are made without running their `__init__`: those import
  the command-line front end (huggingface_hub, the ZipEnhancer denoiser, timestamps) and VoxCPM2
  (librosa), none of which the v1 model's inference uses. Every module the v1 model imports is
  the reference's own file.

install_test_shims() stands in for what only a small CPU test lacks (einops, transformers'
tokenizer, safetensors, torch.func, scaled_dot_product_attention of torch < 2); the real runs
never call it.
"""

import copy
import json
import os
import sys
import types
import typing


# ---------------------------------------------------------------------------------------------
# pydantic shim


def _coerce(tp, v):
    """v as the annotation tp asks, for the types the v1 configs use."""
    if v is None or tp is typing.Any:
        return v
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        for a in args:
            if a is type(None):
                continue
            if isinstance(a, type) and issubclass(a, PydanticShim) and isinstance(v, dict):
                return a(**v)
        rest = [a for a in args if a is not type(None)]
        return _coerce(rest[0], v) if len(rest) == 1 else v
    if origin in (list, typing.List):
        return [_coerce(args[0], x) for x in v] if args else list(v)
    if origin in (tuple, typing.Tuple):
        if args and args[-1] is not Ellipsis:
            return tuple(_coerce(a, x) for a, x in zip(args, v))
        return tuple(v)
    if isinstance(tp, type):
        if issubclass(tp, PydanticShim):
            return v if isinstance(v, tp) else tp(**v)
        if tp is float and isinstance(v, int) and not isinstance(v, bool):
            return float(v)
        if tp is int and isinstance(v, float) and v.is_integer():
            return int(v)
    return v


class PydanticShim:
    """The part of pydantic.BaseModel the reference's v1 configs use."""

    @classmethod
    def _fields(cls):
        fields, defaults = {}, {}
        for klass in reversed(cls.__mro__):
            for name, tp in klass.__dict__.get("__annotations__", {}).items():
                fields[name] = tp
                if name in klass.__dict__:
                    defaults[name] = klass.__dict__[name]
        return fields, defaults

    def __init__(self, **data):
        fields, defaults = self._fields()
        for name, tp in fields.items():
            if name in data:
                value = _coerce(tp, data[name])
            elif name in defaults:
                value = copy.deepcopy(defaults[name])
            else:
                raise TypeError("%s: field %r is required" % (type(self).__name__, name))
            object.__setattr__(self, name, value)

    def model_copy(self, deep=False, update=None):
        c = copy.deepcopy(self) if deep else copy.copy(self)
        for k, v in (update or {}).items():
            setattr(c, k, v)
        return c

    def model_dump(self):
        def dump(v):
            if isinstance(v, PydanticShim):
                return v.model_dump()
            if isinstance(v, (list, tuple)):
                return [dump(x) for x in v]
            return v
        return {k: dump(getattr(self, k)) for k in self._fields()[0]}

    @classmethod
    def model_validate(cls, obj):
        return obj if isinstance(obj, cls) else cls(**obj)

    @classmethod
    def model_validate_json(cls, data):
        return cls(**json.loads(data))

    @classmethod
    def model_rebuild(cls, **_):
        return None

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % (k, getattr(self, k)) for k in self._fields()[0]))


def _install_pydantic():
    """The real pydantic where it is installed, the shim otherwise; returns which."""
    try:
        import pydantic
        return "pydantic " + getattr(pydantic, "VERSION", getattr(pydantic, "__version__", "?"))
    except ImportError:
        mod = types.ModuleType("pydantic")
        mod.BaseModel = PydanticShim
        sys.modules["pydantic"] = mod
        return "shim (scripts/voxcpm/reference.py)"


# ---------------------------------------------------------------------------------------------
# The reference package


INFO = {}


def package_dir(ref):
    for cand in (os.path.join(ref, "src", "voxcpm"), os.path.join(ref, "voxcpm"), ref):
        if os.path.exists(os.path.join(cand, "model", "voxcpm.py")):
            return os.path.abspath(cand)
    raise SystemExit("%s: no voxcpm package (src/voxcpm/model/voxcpm.py); run scripts/voxcpm/fetch_reference.sh" % ref)


def install(ref):
    """Makes `voxcpm.model.voxcpm` importable from the reference copy at ref."""
    pkg = package_dir(ref)
    INFO["pydantic"] = _install_pydantic()
    INFO["package"] = pkg
    for name, path in (("voxcpm", pkg), ("voxcpm.model", os.path.join(pkg, "model"))):
        if name in sys.modules:
            continue
        mod = types.ModuleType(name)
        mod.__path__ = [path]
        mod.__file__ = os.path.join(path, "__init__.py")
        sys.modules[name] = mod
    return pkg


def model_module():
    import importlib
    return importlib.import_module("voxcpm.model.voxcpm")


def cfm_module():
    import importlib
    return importlib.import_module("voxcpm.modules.locdit.unified_cfm")


def load_model(model_dir, device, dtype=None, optimize=False, fast_init=True):
    """VoxCPMModel.from_local(model_dir) as the reference loads it, with the config's dtype (and
    device) replaced by dtype where given: from_local reads them from config.json only.
    fast_init skips the random initialization of Linear and Embedding weights that from_local
    overwrites at once from the checkpoint (it saves half a minute at full size; a weight the
    checkpoint lacked would then be garbage, which scripts/voxcpm/parity.py's reload check would see)."""
    import torch
    vm = model_module()
    cls = vm.VoxCPMConfig
    own = cls.__dict__.get("model_validate_json")
    parse = cls.model_validate_json

    def validate(data):
        c = parse(data)
        if dtype:
            c.dtype = dtype
        c.device = device
        return c
    cls.model_validate_json = staticmethod(validate)
    saved = {}
    if fast_init:
        for k in (torch.nn.Linear, torch.nn.Embedding):
            saved[k] = k.reset_parameters
            k.reset_parameters = lambda self: None
    try:
        return vm.VoxCPMModel.from_local(model_dir, optimize=optimize, device=device)
    finally:
        if own is None:
            del cls.model_validate_json
        else:
            cls.model_validate_json = own
        for k, f in saved.items():
            k.reset_parameters = f


class TorchWithNoise:
    """Stands in for the module `torch` inside unified_cfm.py so that UnifiedCFM.forward's
    `z = torch.randn(...)` takes the next of the given noises: the same starting noise can then go
    to the exported step graph. Everything else is torch's."""

    def __init__(self, torch):
        self._torch = torch
        self.queue = []

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def randn(self, *size, **kw):
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, self._torch.Size)) else tuple(size)
        if not self.queue:
            raise RuntimeError("unified_cfm drew more noise than was queued")
        z = self.queue.pop(0)
        if tuple(z.shape) != shape:
            raise RuntimeError("queued noise has shape %s, the solver asked for %s" % (tuple(z.shape), shape))
        return z.to(device=kw.get("device"), dtype=kw.get("dtype") or z.dtype)


def patch_cfm_noise():
    """Installs TorchWithNoise in unified_cfm.py; returns it (put noises in .queue)."""
    import torch
    mod = cfm_module()
    if not isinstance(mod.torch, TorchWithNoise):
        mod.torch = TorchWithNoise(torch)
    return mod.torch


# ---------------------------------------------------------------------------------------------
# Test-only stand-ins (a CPU host with Debian's torch 1.13 and nothing else)


def install_test_shims():
    import torch
    import torch.nn.functional as F
    shims = []

    if not hasattr(F, "scaled_dot_product_attention"):
        def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
            if enable_gqa and k.shape[-3] != q.shape[-3]:
                rep = q.shape[-3] // k.shape[-3]
                k = k.repeat_interleave(rep, dim=-3)
                v = v.repeat_interleave(rep, dim=-3)
            s = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
            if is_causal:
                L, S = q.shape[-2], k.shape[-2]
                s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool, device=q.device).tril(), float("-inf"))
            if attn_mask is not None:
                s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
            return torch.softmax(s, dim=-1) @ v
        F.scaled_dot_product_attention = sdpa
        shims.append("scaled_dot_product_attention")

    try:
        import torch.func  # noqa: F401
    except ImportError:
        m = types.ModuleType("torch.func")
        m.jvp = None
        sys.modules["torch.func"] = m
        torch.func = m
        shims.append("torch.func")

    try:
        import einops  # noqa: F401
    except ImportError:
        m = types.ModuleType("einops")
        m.rearrange = _rearrange
        sys.modules["einops"] = m
        shims.append("einops")

    try:
        import safetensors.torch  # noqa: F401
    except ImportError:
        st = types.ModuleType("safetensors")
        stt = types.ModuleType("safetensors.torch")
        stt.save_file, stt.load_file = _st_save, _st_load
        st.torch = stt
        sys.modules["safetensors"], sys.modules["safetensors.torch"] = st, stt
        shims.append("safetensors")

    try:
        import transformers  # noqa: F401
    except ImportError:
        m = types.ModuleType("transformers")
        m.LlamaTokenizerFast = _CharTokenizer
        m.PreTrainedTokenizer = _CharTokenizer
        sys.modules["transformers"] = m
        shims.append("transformers")
    INFO["test_shims"] = shims
    return shims


def _groups(side):
    out, cur = [], None
    for tok in side.replace("(", " ( ").replace(")", " ) ").split():
        if tok == "(":
            cur = []
        elif tok == ")":
            out.append(cur)
            cur = None
        elif cur is not None:
            cur.append(tok)
        else:
            out.append([tok])
    return out


def _rearrange(x, pattern, **sizes):
    lhs, rhs = (_groups(s) for s in pattern.split("->"))
    dims = dict(sizes)
    for g, n in zip(lhs, x.shape):
        known = 1
        for name in g:
            known *= dims.get(name, 1)
        missing = [name for name in g if name not in dims]
        if missing:
            dims[missing[0]] = n // known
    flat = [name for g in lhs for name in g]
    x = x.reshape([dims[n] for n in flat])
    order = [name for g in rhs for name in g]
    x = x.permute([flat.index(n) for n in order])
    shape = []
    for g in rhs:
        n = 1
        for name in g:
            n *= dims[name]
        shape.append(n)
    return x.reshape(shape)


_ST_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "I64": "int64", "I32": "int32"}


def _st_save(tensors, path, metadata=None):
    import torch
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        code = [k for k, v in _ST_DTYPES.items() if getattr(torch, v) == t.dtype][0]
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
        for b in blobs:
            f.write(b)


def _st_load(path, device="cpu"):
    import torch
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        s, e = meta["data_offsets"]
        dt = getattr(torch, _ST_DTYPES[meta["dtype"]])
        buf = bytearray(data[8 + n + s:8 + n + e])
        out[name] = (torch.frombuffer(buf, dtype=dt).reshape(meta["shape"]).clone() if e > s
                     else torch.zeros(meta["shape"], dtype=dt))
    return out


class _CharTokenizer:
    """A stand-in for LlamaTokenizerFast over tokenizer.json's vocabulary: one token per character
    (the vocabulary's, else its byte-fallback tokens), for tests where transformers is missing."""

    def __init__(self, vocab):
        self.vocab = vocab

    @classmethod
    def from_pretrained(cls, path):
        with open(os.path.join(path, "tokenizer.json"), encoding="utf-8") as f:
            tj = json.load(f)
        vocab = dict(tj["model"]["vocab"])
        for t in tj.get("added_tokens", []):
            vocab[t["content"]] = t["id"]
        return cls(vocab)

    def __len__(self):
        return max(self.vocab.values()) + 1

    def tokenize(self, text, **_):
        out = []
        for ch in text.replace(" ", "\u2581"):
            if ch in self.vocab:
                out.append(ch)
            else:
                out += ["<0x%02X>" % b for b in ch.encode("utf-8")]
        return out

    def convert_tokens_to_ids(self, tokens):
        unk = self.vocab.get("<unk>", 0)
        return [self.vocab.get(t, unk) for t in tokens]
