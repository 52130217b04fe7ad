"""Masking the secrets URLs carry, before a job is shown to a person."""

from __future__ import annotations

import pytest

from mealquest.masking import mask, mask_url


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("https://x.example/r?token=SECRET", "https://x.example/r?token=***"),
        ("https://x.example/r?a=1&sig=SECRET&b=", "https://x.example/r?a=***&sig=***&b=***"),
        ("https://x.example/r?SECRET", "https://x.example/r?***"),
        ("https://x.example/r#access_token=SECRET", "https://x.example/r#***"),
        ("https://user:SECRET@x.example:8443/r", "https://***@x.example:8443/r"),
        ("https://x.example/recipes/soup", "https://x.example/recipes/soup"),
        ("http://[::1/r?token=SECRET", "http://***"),
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
    assert masked["note"] == "no address here ?token=kept"
    assert value["url"].endswith("SECRET1")  # the input is left as it was
