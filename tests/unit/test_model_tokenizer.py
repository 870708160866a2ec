"""Tokenizers: llama2.c encode/decode, byte fallback, the byte tokenizer."""

from __future__ import annotations

import pytest

from inferctl.engine.tokenizer import ByteTokenizer, Llama2cTokenizer


@pytest.fixture(scope="module")
def tok(stories_dir):
    return Llama2cTokenizer(stories_dir / "tok512.bin")


def test_llama2c_vocabulary(tok):
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (512, 1, 2)
    assert tok.id_to_piece(3) == "<0x00>" and tok.id_to_piece(3 + 0x41) == "<0x41>"
    assert tok.id_to_piece(265) == " the"


@pytest.mark.parametrize("text", ["Once upon a time, there was a little girl named Lily.",
                                  "Tom said: \"Hi!\"\n\tTabs and  double  spaces.",
                                  "Café, naïve, é — and an emoji 🎉 ✓ 日本"])
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert ids[0] == tok.bos_id
    assert tok.decode(ids) == text
    assert tok.encode(text, bos=False) == ids[1:]


def test_byte_fallback_for_non_ascii(tok):
    ids = tok.encode("🎉", bos=False)
    # " " dummy prefix, then the 4 UTF-8 bytes F0 9F 8E 89 as byte tokens 3 + b
    assert ids[-4:] == [3 + 0xF0, 3 + 0x9F, 3 + 0x8E, 3 + 0x89]
    # a prefix cut inside the character decodes with a replacement char, never raises
    assert tok.decode(ids[:-1]).endswith("\ufffd")
    assert tok.decode(ids) == " 🎉"  # no BOS before it: the dummy-prefix space is kept


def test_leading_space_after_bos_only(tok):
    ids = tok.encode("Once upon a time")
    assert tok.decode(ids) == "Once upon a time"
    assert tok.decode(ids[1:]) == " Once upon a time"
    assert tok.encode("") == [1] and tok.encode("", bos=False) == []
    assert tok.decode(ids + [tok.eos_id]) == "Once upon a time"


def test_merges_pick_highest_score(tok):
    # dummy prefix " " + "t" "h" "e" merge all the way to the single piece " the" (id 265)
    assert tok.encode("the", bos=False) == [265]
    # "  the": the first space stays alone, the second one joins "the"
    assert tok.encode(" the", bos=False) == [tok._lookup[b" "], 265]


def test_bad_ids_and_files(tok, tmp_path):
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([1, 600])
    with pytest.raises(FileNotFoundError):
        Llama2cTokenizer(tmp_path / "nope.bin")
    bad = tmp_path / "bad.bin"
    # length 255 > 2 bytes left
    bad.write_bytes(b"\x07\x00\x00\x00" + b"\x00\x00\x00\x00" + b"\xff\x00\x00\x00" + b"ab")
    with pytest.raises(ValueError, match="invalid length"):
        Llama2cTokenizer(bad)


def test_byte_tokenizer():
    t = ByteTokenizer()
    assert (t.vocab_size, t.bos_id, t.eos_id) == (259, 1, 2)
    ids = t.encode("hé")
    assert ids == [1, 3 + ord("h"), 3 + 0xC3, 3 + 0xA9]
    assert t.decode(ids) == "hé"
    assert t.decode(ids[:-1]) == "h\ufffd"
    assert t.id_to_piece(3 + 0xC3) == "<0xC3>"


def test_hf_byte_level_tokenizer(tmp_path):
    """A GPT-2-style byte-level tokenizer.json (trained here) decodes through the byte table."""
    from pathlib import Path

    from tokenizers import ByteLevelBPETokenizer

    from inferctl.engine.tokenizer import HFTokenizer

    text = (Path(__file__).resolve().parents[1] / "data" / "eval_stories.txt").read_text(encoding="utf-8")
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator([text], vocab_size=400, min_frequency=2, special_tokens=["<s>", "</s>"])
    trainer.save(str(tmp_path / "tokenizer.json"))
    t = HFTokenizer(tmp_path / "tokenizer.json")
    assert (t.bos_id, t.eos_id) == (0, 1) and not t.add_dummy_prefix
    for s in ("Once upon a time, Lily", "Café 🎉 日本", " leading space"):
        ids = t.encode(s)
        assert ids[0] == t.bos_id and len(ids) > 1
        assert t.decode(ids) == s
    ids = t.encode("🎉", bos=False)
    assert t.decode(ids[:-1]).endswith("\ufffd") or len(ids) == 1
