"""Whether text a server wrote can pass for Cellblock's: names, titles and questions, read as a
person reads them.

A server may not speak in Cellblock's name: its tool titles, its bare tool and prompt names, its
resource names and the questions it puts to the user are read here the way an eye reads them, and
text that reads as "Cellblock" (or, for a question, as one of Cellblock's approval choices) is
caught however it is spelled: `CellbIock` with a capital I, Cyrillic or Greek letters, `Ce11bl0ck`,
fullwidth or mathematical letters, small capitals, accents, zero-width and bidi characters, and
spaces or punctuation between the letters.

`skeleton` folds text to what it looks like: compatibility forms (NFKD: fullwidth, mathematical,
circled), case, accents, the look-alike letters of other scripts (a table taken from Unicode's
confusables.txt, UTS #39), digits read as letters, the letters a sans-serif font draws
alike (I, l, 1, |), and everything that is not a letter or digit dropped. One skeleton is compared
with another, so the words checked go through it too.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["OWN_NAME", "skeleton", "speaks_as_cellblock"]

# No maintained library does this: `confusable-homoglyphs` (one release since 2018) tells mixed
# scripts apart but gives no skeleton, and `confusables` has had no release since 2021. So this
# table is ours: from Unicode's confusables.txt (2021), every single character whose prototype is
# a Latin letter (a stroke or mark on it read past) and that NFKD, case folding and the rest of
# this table do not already bring to it.
_CONFUSABLES = {
    "ɑαаᎪᗅẚ⍶⍺ꓮ𐊠𖽀": "a",
    "ƀƃƄɓΒБВЬѣҍᏏᏴᑲᑳᖯᗷꓐꞴ𐊂𐊡𐌁": "b",
    "¢ȼϲϹсҫᏟ₡ⲥꓚ𐊢𐌂𐐽𐔜𑣩𑣲🝌": "c",
    "ÐđƌɖɗԁᎠᏧᑯᗞᗪ₫ꓒꓓ": "d",
    "ɇΕеҽҿᎬ℮⋿ⴹꓰꬲ𐊆𑢦𑢮": "e",
    "ſƒϜքᖴᵮẝꓝꞙꬵ𐊇𐊥𐔥𑣂𝈓": "f",
    "ƍǥɠɡԌցᏀᏳᶃꓖ": "g",
    "ħɦΗНћҢһӇӉհᎻᏂᏲᕼᵸⱧⲎꓧꚕ𐋏": "h",
    "ɉϳјᎫᒍꓙꞲ": "j",
    "ƙКҚҞᏦᛕ₭ⱩⲔꓗꝀ𐔘": "k",
    "ıɨɩ˛ιіӏᎥᵻᵼ⍳⍸ꙇ𑣃|łƚǀɫɭ׀וןا١ٳ۱ߊᏞᒪᛁ∣⏽ⲒⳐⵏꓡꓲ￨𐊊𐌉𐌠𐐛𐔦𑢲𖼖𖼨𝈪𞣇": "l",
    "ΜϺМӍᎷᗰᛖⲘꓟ𐊰𐌑": "m",
    "ƝƞɳΝηոռᵰⲚꓠ𐆎𐔓": "n",
    "øɵθοσоѳөօסه٥ھہە۵ۿ߀०০੦૦ଠ୦௦ం౦ಂ೦ംഠ൦ං๐໐ဝ၀ჿዐᎾᏫᴑ⊖⊝⍬ⲟⴱⵁⵔ〇ꓳꝋꬽꬾꭴ𐊒𐊫𐐬𐓪𐔖𑓐𑢵𑣈𑣗𑣠𝈚🜔": "o",
    "ƥρрᏢᑭᵽ⍴ⲣꓑ𐊕": "p",
    "ʠԛգզⵕ": "q",
    "ɍɼɽгғᎡᏒᖇᴦᵲⲅꓣꭇꭈꮁ𐒴𖼵𝈖": "r",
    "ƽʂѕՏᏕᏚᵴꓢ𐊖𐑈𑣁𖼺": "s",
    "ŧƭƮȾΤТҬᎢᵵ₮⊤⍡⟙Ⲧꓔ𐊗𐊱𐌕𑢼𖼊🝨": "t",
    "ɄʋυսሀᏌᑌᵾ∪⋃ꓴꞟꭎꭒ𐓶𑣘𖽂": "u",
    "νѵט٧۷Ꮩᐯ∨⋁ⴸꓦꛟ𐆗𐔝𑜆𑣀𖼈𝈍🜈": "v",
    "ɯѡѽԝաᎳᏔ₩ꓪꝡ𑓅𑜊𑜎𑜏𑣦𑣯": "w",
    "×ΧхҲᕁᕽ᙭᙮ᚷ╳⤫⤬⨯⨰ⲬⵝꓫꞳ𐆖𐊐𐊴𐌗𐌢𐔧𑣬": "x",
    "¥ƴɏɣΥγуүұყᎩᎽᶌỿⲨꓬꭚ𐊲𑢤𑣜𖽃": "y",
    "ƶȥʐΖᏃᵶꓜ𐋵𑢩𑣄𑣥": "z",
}
_EXTRA = {
    "κĸ": "kk",  # Greek small kappa and kra, which confusables.txt leaves out
    "ᴀʙᴄᴅᴇꜰɢʜɪᴊᴋʟᴍɴᴏᴘʀꜱᴛᴜᴠᴡʏᴢ": "abcdefghijklmnoprstuvwyz",  # small capitals: NFKD keeps them
    "i1": "ll",  # what a sans-serif font draws as l: an I (folded to i), a 1 (| is in the table)
    "034578": "oeastb",  # digits read as letters (Ce11bl0ck, C3llblock)
}
_PROTOTYPES = str.maketrans(
    {
        **{ch: "l" if letter == "i" else letter for chars, letter in _CONFUSABLES.items() for ch in chars},
        **{ch: letter for chars, letters in _EXTRA.items() for ch, letter in zip(chars, letters, strict=True)},
        # letters that show as blank space, which `isalnum` keeps
        **dict.fromkeys("\u115f\u1160\u3164\uffa0", ""),
    }
)
_PAIRS = re.compile("rn|vv")  # two letters that read as one: m, w
OWN_NAME = "cellblock"


def skeleton(text: str) -> str:
    """`text` as it looks: lower-case Latin letters and digits only, look-alikes read as the
    letters they resemble (see the module docstring)."""
    # folded before and after NFKD and case folding: those turn some look-alikes into other letters
    # (a lunate sigma becomes a sigma, which reads as o), and others into ones the table knows
    folded = unicodedata.normalize("NFKD", text.translate(_PROTOTYPES)).translate(_PROTOTYPES).casefold()
    letters = "".join(ch for ch in unicodedata.normalize("NFKD", folded).translate(_PROTOTYPES) if ch.isalnum())
    return _PAIRS.sub(lambda pair: "m" if pair.group() == "rn" else "w", letters)


def speaks_as_cellblock(text: str) -> bool:
    """Whether `text` anywhere reads as Cellblock's name."""
    return OWN_NAME in skeleton(text)
