"""The router's incremental detokenization (`stitch.IncrementalText`, issue 47): the text is decode(all ids)
for valid output whatever the chunking and however tokens split characters, and the window decoded per
delta stays bounded where sglang's detokenizer holds it open (bytes that never complete a character)."""

from __future__ import annotations

import codecs
import random

import pytest

from sglang_pdd.router.request import stitch
from sglang_pdd.router.request.stitch import IncrementalText

EMOJI = "😀".encode()  # 4 bytes
CONT = 0x80  # a lone UTF-8 continuation byte


codecs.register_error("pdd_test_per_byte", lambda e: ("\ufffd" * (e.end - e.start), e.end))
ERRORS = ["replace", "pdd_test_per_byte"]  # one U+FFFD per maximal invalid part (byte-level BPE) or per byte


class Vocab:
    """Token i is the byte string `pieces[i]` (a token may hold parts of two characters, as byte-level
    BPE merges do); decode joins the bytes and replaces what is not UTF-8: one U+FFFD per maximal
    invalid part as byte-level decoders do, or (`pdd_test_per_byte`) one per byte, as SentencePiece's
    byte fallback does, so that an incomplete character is not always one character long. Counts the
    tokens each decode call is given."""

    def __init__(self, errors: str = "replace"):
        self.errors = errors
        self.pieces: list[bytes] = []
        self.index: dict[bytes, int] = {}
        self.calls: list[int] = []

    def ids(self, pieces: list[bytes]) -> list[int]:
        for p in pieces:
            if p not in self.index:
                self.index[p] = len(self.pieces)
                self.pieces.append(p)
        return [self.index[p] for p in pieces]

    def decode(self, ids: list[int]) -> str:
        self.calls.append(len(ids))
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors=self.errors)


def stream(text: IncrementalText, ids: list[int], sizes) -> list[str]:
    """`ids` pushed in deltas of `sizes` tokens, the last one final: the text of each delta."""
    out, n = [], 0
    for size in sizes:
        n = min(len(ids), n + size)
        out.append(text.push(ids[:n], n == len(ids)))
        if n == len(ids):
            return out
    raise AssertionError("sizes ran out")


def split(data: bytes, rng: random.Random, widths=(1, 1, 1, 2, 3, 4)) -> list[bytes]:
    pieces, i = [], 0
    while i < len(data):
        w = rng.choice(widths)
        pieces.append(data[i:i + w])
        i += w
    return pieces


def deltas(rng: random.Random):
    while True:
        yield rng.choice((1, 1, 1, 2, 5))


@pytest.mark.parametrize("text", ["plain words, and more of them", "中文的文本，混合 English 和标点。",
                                  "emoji 😀🎉👍🏽 and flags 🇫🇷", "é€𝄞" * 20], ids=["ascii", "cjk", "emoji", "mixed"])
@pytest.mark.parametrize("errors", ERRORS)
def test_valid_text_is_the_whole_decode_for_any_chunking_and_any_token_split(text, errors):
    rng = random.Random(len(text))
    for _ in range(200):
        v = Vocab(errors)
        ids = v.ids(split(text.encode(), rng))
        assert "".join(stream(IncrementalText(v.decode), ids, deltas(rng))) == text


@pytest.mark.parametrize("errors", ERRORS)
def test_invalid_bytes_come_out_as_decode_of_all_ids_with_their_replacement_characters(errors):
    """Lone continuation bytes, truncated and overlong sequences, between and inside valid characters:
    the text is still decode(all ids) (byte-level decoders replace each maximal invalid subpart)."""
    rng = random.Random(7)
    junk = [0x80, 0x9F, 0xBF, 0xC3, 0xE0, 0xE2, 0xED, 0xA0, 0xF0, 0xF4, 0x90, 0x41]
    for _ in range(3000):
        data = bytes(rng.choice(junk) for _ in range(rng.randrange(1, 40)))
        if rng.random() < 0.5:
            data += "😀中é".encode() + data
        v = Vocab(errors)
        ids = v.ids(split(data, rng))
        assert "".join(stream(IncrementalText(v.decode), ids, deltas(rng))) == v.decode(ids)


def _lone_continuation_bytes(n: int) -> tuple[Vocab, list[str]]:
    v = Vocab()
    ids = v.ids([bytes([CONT])] * n)
    text = IncrementalText(v.decode)
    return v, [text.push(ids[:i + 1], i == n - 1) for i in range(n)]


def test_lone_continuation_bytes_are_decoded_in_a_bounded_window():
    """10k bytes that never complete a character, one per delta: each delta decodes a few calls of a
    few tokens (sglang's detokenizer re-decodes the whole output at every step), and the replacement
    characters come out as they go, a few tokens behind."""
    n = 10_000
    v, out = _lone_continuation_bytes(n)
    assert "".join(out) == "\ufffd" * n
    assert len(v.calls) <= 3 * n and max(v.calls) <= 2 * stitch.HOLD_TOKENS
    sent = 0
    for i, chunk in enumerate(out[:-1], 1):
        sent += len(chunk)
        assert i - sent <= stitch.HOLD_TOKENS


def test_without_the_cut_the_window_grows_with_the_output(monkeypatch):
    """Negative control: held for as long as the text ends in U+FFFD (sglang's rule), every delta
    decodes the whole output and nothing comes out until the end."""
    monkeypatch.setattr(stitch, "HOLD_TOKENS", 10**9)
    n = 500
    v, out = _lone_continuation_bytes(n)
    assert "".join(out) == "\ufffd" * n and out[-1] == "\ufffd" * n
    assert max(v.calls) == n


@pytest.mark.parametrize("errors", ERRORS)
def test_tokens_that_each_split_a_character_are_bounded_and_exact(errors):
    """Every token ends an emoji and starts the next (b'\\x98\\x80\\xf0\\x9f'): the text ends in U+FFFD at
    every delta and every cut splits a character; the split character is held, not replaced."""
    n = 3000
    v = Vocab(errors)
    ids = v.ids([EMOJI[:2]] + [EMOJI[2:] + EMOJI[:2]] * (n - 1) + [EMOJI[2:]])
    out = stream(IncrementalText(v.decode), ids, [1] * len(ids))
    assert "".join(out) == "😀" * n
    assert max(v.calls) <= 2 * stitch.HOLD_TOKENS
    assert sum(map(len, out[:-1])) >= n - stitch.HOLD_TOKENS  # streamed as it went, not at the end


def _byte_level_char(b: int) -> str:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for 256, 257, ..."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    if b in printable:
        return chr(b)
    return chr(256 + [x for x in range(256) if x not in printable].index(b))


def test_a_real_byte_level_tokenizer_bounded_and_exact(tiny_model):
    """The tiny model's byte-level BPE tokenizer (Rust's lossy UTF-8): CJK and emoji whose bytes are
    separate tokens, then a run of lone continuation-byte tokens, then text again."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    calls: list[int] = []

    def decode(ids):
        calls.append(len(ids))
        return tok.decode(ids)

    cont = tok.convert_tokens_to_ids(_byte_level_char(CONT))
    assert tok.decode([cont] * 3) == "\ufffd" * 3
    ids = tok.encode("hello 中文 😀🎉 world", add_special_tokens=False)
    ids = ids + [cont] * 2000 + ids
    rng = random.Random(5)
    for sizes in ([1] * len(ids), deltas(rng)):
        calls.clear()
        assert "".join(stream(IncrementalText(decode), ids, sizes)) == tok.decode(ids)
        assert max(calls) <= 2 * stitch.HOLD_TOKENS + 10
