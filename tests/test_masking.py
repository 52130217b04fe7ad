"""Masking the secrets URLs carry, before a job is shown to a person."""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mealquest.masking import MAX_FAILURE_MESSAGE, mask, mask_url
from mealquest.masking import bounded_failure_message as _bounded


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("https://x.example/r?token=SECRET", "https://x.example/r?token=***"),
        ("https://x.example/r?a=1&sig=SECRET&b=", "https://x.example/r?a=***&sig=***&b=***"),
        ("https://x.example/r?SECRET", "https://x.example/r?***"),
        ("https://x.example/r#access_token=SECRET", "https://x.example/r#***"),
        ("https://user:SECRET@x.example:8443/r", "https://***@x.example:8443/r"),
        ("https://x.example/recipes/soup", "https://x.example/recipes/soup"),
        ("http://[::1/r?token=SECRET", "http://[::1/r?token=***"),
    ],
    ids=["query", "several", "bare-value", "fragment", "user-info", "plain", "malformed"],
)
def test_mask_url_keeps_what_identifies_the_request_and_hides_the_rest(url, masked):
    assert mask_url(url) == masked


def test_mask_finds_urls_anywhere_in_nested_values():
    value = {
        "url": "https://x.example/r?token=SECRET1",
        "pages": ["see https://y.example/?k=SECRET2 and ftp://u:SECRET3@z.example/f", 7],
        "nested": {"deeper": ("https://x.example/#SECRET4", None, True)},
        "note": "no address here ?token=kept",
    }
    masked = mask(value)
    assert "SECRET" not in repr(masked)
    assert masked["url"] == "https://x.example/r?token=***"
    assert masked["pages"] == ["see https://y.example/?k=*** and ftp://***@z.example/f", 7]
    assert masked["nested"] == {"deeper": ["https://x.example/#***", None, True]}
    # A credential's name with its value is masked wherever it is written.
    assert masked["note"] == "no address here ?token=***"
    assert value["url"].endswith("SECRET1")  # the input is left as it was


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        # A quote is a character a URL may hold (RFC 3986's sub-delims): the
        # import's validation lets it through, so masking must not stop there.
        (
            "https://example.com/r?x=1'&token=SECRET",
            "https://example.com/r?x=***&token=***",
        ),
        ('<a href="https://x.example/r?k=SECRET">soup</a>', '<a href="https://x.example/r?k=***'),
        ("https://x.example/r?x=1\u3000&token=SECRET", "https://x.example/r?x=***&token=***"),
        ("https://x.example/r?x=<b>&token=SECRET", "https://x.example/r?x=***&token=***"),
        # One address written right after another: the second's user info is
        # in the first one's path, and still masked.
        ("foo://barhttps://u:SECRET@x.example/", "foo://barhttps://***@x.example/"),
        ("https://u:p@ss:SECRET@x.example/r", "https://***@x.example/r"),
        # A parameter that does not look like a name is masked whole.
        ("https://x.example/r?a=1&SECRET'x=2", "https://x.example/r?a=***&***"),
    ],
    ids=[
        "quote",
        "html",
        "unicode-space",
        "angle-brackets",
        "glued",
        "at-in-user-info",
        "odd-name",
    ],
)
def test_masking_goes_on_past_any_character_a_url_may_hold(text, masked):
    assert mask(text) == masked
    assert "SECRET" not in mask(text)


# -- whatever surrounds a URL, and whatever is inside it -----------------------------------

# Put around and between the characters of every secret: a secret shown even
# in part shows one (the first character shown, or the last, is next to one).
# It has no meaning in URLs and is no character of a parameter's name.
MARK = "\u00a7"
# Characters a URL in a text may hold: all but spaces and control characters
# (which end a URL in a text, and which the import's validation refuses) and
# lone surrogates; with the ones that mean something in a URL drawn often.
SPECIALS = [*"'\"<>@#&=?/:;,%[]\\`{}|^~!$()*+", "%41", "%26", "://", "\u3000", "\u00a0", "\u0085"]


def url_text(exclude: str = "", max_size: int = 10) -> st.SearchStrategy[str]:
    char = st.characters(
        min_codepoint=0x21,
        blacklist_categories=("Cs",),
        blacklist_characters="\x7f" + MARK + exclude,
    )
    specials = [s for s in SPECIALS if not set(s) & set(exclude)]
    return st.lists(st.one_of(char, st.sampled_from(specials)), max_size=max_size).map("".join)


def secret(exclude: str = "") -> st.SearchStrategy[str]:
    chunks = st.lists(url_text(exclude), min_size=1, max_size=3)
    return chunks.map(lambda parts: MARK + MARK.join(parts) + MARK)


NAME_CHARS = string.ascii_letters + string.digits + "_.-"
names = st.text(NAME_CHARS, min_size=1, max_size=8)
labels = st.text(string.ascii_lowercase + string.digits + "-", min_size=1, max_size=10)
ports = st.none() | st.integers(0, 65535).map(lambda port: f":{port}")
hosts = st.builds(
    lambda parts, port: ".".join(parts) + (port or ""),
    st.lists(labels, min_size=1, max_size=3),
    ports,
)
schemes = st.sampled_from(["http", "https", "HTTPS", "ftp", "git+ssh", "x-custom"])


@st.composite
def url_parts(draw: st.DrawFn, value_chars_exclude: str = "&") -> tuple[str, str]:
    """A URL whose user info, query values and fragment are secrets (each
    between MARKs; a value may hold `&` only if `value_chars_exclude` lets
    it), and how its masked form begins: the scheme, `***@` for its user
    info, the host and port."""
    userinfo = draw(st.none() | secret(exclude="/?#"))
    path = draw(st.just("") | url_text(exclude="?#").map(lambda text: "/" + text))
    pairs = draw(
        st.lists(
            st.tuples(st.none() | names, secret(exclude=value_chars_exclude)),
            max_size=3,
        )
    )
    fragment = draw(st.none() | secret())
    scheme, host = draw(schemes), draw(hosts)
    url = scheme + "://" + ("" if userinfo is None else userinfo + "@") + host + path
    if pairs:
        url += "?" + "&".join(value if key is None else f"{key}={value}" for key, value in pairs)
    if fragment is not None:
        url += "#" + fragment
    return url, scheme + "://" + ("" if userinfo is None else "***@") + host


def urls(value_chars_exclude: str = "&") -> st.SearchStrategy[str]:
    return url_parts(value_chars_exclude).map(lambda parts: parts[0])


# Anything at all around the URLs, spaces, control characters and other URLs
# included (without the mark, which only secrets hold).
surroundings = st.lists(
    st.one_of(
        st.characters(blacklist_categories=("Cs",), blacklist_characters=MARK),
        st.sampled_from([*SPECIALS, " ", "\n", "\t", "http://", "https://x.example/?a="]),
    ),
    max_size=12,
).map("".join)


@st.composite
def texts_with_urls(draw: st.DrawFn, value_chars_exclude: str = "&") -> str:
    parts = [draw(surroundings)]
    for _ in range(draw(st.integers(1, 3))):
        parts += [draw(urls(value_chars_exclude)), draw(surroundings)]
    return "".join(parts)


PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(texts_with_urls())
def test_no_secret_of_any_url_survives_whatever_surrounds_it(text):
    assert MARK not in mask(text)
    assert MARK not in mask({"nested": [text]})["nested"][0]


@PROPERTY
@given(url_parts())
def test_a_url_alone_keeps_its_scheme_and_host(parts):
    url, masked_start = parts
    masked = mask(url)
    assert MARK not in masked
    assert masked.startswith(masked_start)


@PROPERTY
@given(
    st.lists(
        st.one_of(
            st.characters(
                min_codepoint=0x21, blacklist_categories=("Cs",), blacklist_characters="\x7f"
            ),
            st.just("&"),
        ),
        min_size=1,
        max_size=12,
    ).map(lambda chars: MARK + MARK.join(chars) + MARK),
    surroundings,
)
def test_a_raw_ampersand_in_a_value_shows_no_part_of_it(value, after):
    # A raw `&` ends the value (the URL's own syntax) and what follows is read
    # as another parameter; its name is shown only if it looks like a name.
    text = f"https://x.example/r?token={value}{after}"
    assert MARK not in mask(text)


@PROPERTY
@given(texts_with_urls(), st.integers(0, MAX_FAILURE_MESSAGE))
def test_a_failure_message_cut_to_its_bound_is_still_masked_whole(text, padding):
    # The runner cuts long failure messages; a cut through a URL could lose
    # what marks its secrets (the `@` of its user info), so it cuts before it.
    message = "x" * padding + text + " " + "y" * MAX_FAILURE_MESSAGE
    assert MARK not in mask(_bounded(message))
