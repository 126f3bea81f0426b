"""`lookalikes`: text that reads as Cellblock's name, however a server spells it."""

from __future__ import annotations

import pytest

from cellblock.policy.lookalikes import skeleton, speaks_as_cellblock

SPELLINGS = {
    "plain": "Cellblock",
    "a capital I for the l": "CellbIock",
    "all capitals with an I": "CELLBIOCK",
    "a dotless i": "Cellb\u0131ock",
    "digits": "Ce11b10ck",
    "a 3 and a 0": "C3llbl0ck",
    "pipes": "Ce||b|ock",
    "Cyrillic": "Сеllblосk",
    "Cyrillic palochka": "Сеӏӏbӏосk",
    "Greek": "Ϲellblοϲκ",
    "lunate sigma (NFKD makes it a sigma)": "\u03f9ellblock",
    "Cherokee": "ᏟᎬᏞᏞᏴᏞᎾᏟᏦ",
    "Lisu": "ꓚꓰꓡꓡꓐꓡꓳꓚꓗ",
    "fullwidth": "Ｃｅｌｌｂｌｏｃｋ",
    "mathematical bold": "𝐂𝐞𝐥𝐥𝐛𝐥𝐨𝐜𝐤",
    "circled": "ⓒⓔⓛⓛⓑⓛⓞⓒⓚ",
    "small capitals": "ᴄᴇʟʟʙʟᴏᴄᴋ",
    "accents": "Céllblöck",
    "a combining mark": "Cel\u0301lblock",
    "a zero-width space": "Cell\u200bblock",
    "a zero-width joiner": "Cel\u200dlblock",
    "a bidi override": "Cell\u202eblock",
    "a Unicode tag": "Cell\U000e0041block",
    "a Hangul filler (shows blank)": "Cell\u3164block",
    "spaced out": "C e l l b l o c k",
    "a hyphen": "Cell-Block",
    "inside a sentence": "Message from the cellblock gateway:",
}


@pytest.mark.parametrize("text", SPELLINGS.values(), ids=SPELLINGS.keys())
def test_every_spelling_reads_as_cellblock(text: str) -> None:
    assert speaks_as_cellblock(text)


PLAIN = ["Hello", "Select a block", "cells", "Block list", "Excel block size", "Cancel lock", "List the files"]


@pytest.mark.parametrize("text", PLAIN)
def test_control_other_words_do_not(text: str) -> None:
    assert not speaks_as_cellblock(text)


def test_the_approval_words_are_compared_as_they_look() -> None:
    assert skeleton("АIIow once") == skeleton("allow_once") == skeleton("Allow Once!")
    assert skeleton("Show all argurnents") == skeleton("show_all_arguments")
    assert skeleton("Allow always") != skeleton("Allow once")
