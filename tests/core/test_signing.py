"""Ed25519 signatures on the wire (CONTRACT.md §5.2), fuzzed: any change to a signed
object, its key or its signature fails verification, and nothing malformed raises."""

from __future__ import annotations

import base64
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from reaper.core.signing import (
    canonical_json,
    new_private_key,
    public_key_text,
    sign_heartbeat,
    verify,
)

KEY = new_private_key()
BEAT = sign_heartbeat(
    {"worker": "w1", "boot_id": "b", "seq": 17, "containers": ["c-1"], "volumes": []}, KEY
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)


def test_canonical_json_is_rfc8785_for_contract_payloads():
    assert canonical_json({"b": [1, "é"], "a": None}) == '{"a":null,"b":[1,"é"]}'.encode()


@settings(max_examples=120)
@given(member=st.sampled_from(sorted(BEAT)), value=json_values)
def test_any_changed_member_fails(member: str, value: Any):
    changed = {**BEAT, member: value}
    if changed == BEAT:
        return
    assert not verify(changed, BEAT["agent_key"]) or (member == "sig" and value == BEAT["sig"])


@settings(max_examples=120)
@given(extra=st.dictionaries(st.text(min_size=1, max_size=8), json_values, min_size=1))
def test_added_members_fail(extra: dict[str, Any]):
    added = {**extra, **BEAT} if set(extra) <= set(BEAT) else {**BEAT, **extra}
    assert verify(added, BEAT["agent_key"]) == (added == BEAT)


@settings(max_examples=120)
@given(flip=st.integers(0, 63), bit=st.integers(0, 7))
def test_a_flipped_signature_bit_fails(flip: int, bit: int):
    raw = bytearray(base64.b64decode(BEAT["sig"]))
    raw[flip] ^= 1 << bit
    assert not verify({**BEAT, "sig": base64.b64encode(bytes(raw)).decode()}, BEAT["agent_key"])


@settings(max_examples=120)
@given(key=json_values, sig=json_values)
def test_malformed_keys_and_signatures_never_raise(key: Any, sig: Any):
    assert verify({**BEAT, "sig": sig}, key) is False or (
        key == BEAT["agent_key"] and sig == BEAT["sig"]
    )


def test_another_key_fails():
    assert verify(BEAT, BEAT["agent_key"])
    assert not verify(BEAT, public_key_text(new_private_key()))


ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def test_only_the_canonical_spelling_of_a_signature_or_key_verifies():
    """64 bytes are 86 base64 characters and ``==``: the last character carries 2 bits and 4
    that decoders ignore. Its other spellings decode to the same signature; they must not
    verify, or a replayed signed operator signal would pass a guard that remembers
    signatures by their text. The same for the key (32 bytes: 43 characters and ``=``)."""
    sig, key = BEAT["sig"], BEAT["agent_key"]
    assert verify(BEAT, key)
    last = ALPHABET.index(sig[85])
    for other in (ALPHABET[last ^ low] for low in range(1, 16)):
        spelled = sig[:85] + other + "=="
        assert base64.b64decode(spelled) == base64.b64decode(sig)
        assert not verify({**BEAT, "sig": spelled}, key)
    last = ALPHABET.index(key[42])
    for other in (ALPHABET[last ^ low] for low in range(1, 4)):
        spelled = key[:42] + other + "="
        assert base64.b64decode(spelled) == base64.b64decode(key)
        assert not verify(BEAT, spelled)
