"""The docs build's hold on the pages that include code (`docs/hooks.py`): a
snippet marker the extension does not read fails the build, and so does a
built page that lacks the first line of a section it includes."""

from __future__ import annotations

import html
import importlib.util
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]
HANDLER = '--8<-- "docs/examples/scale_recipe.py:handler"'


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def page(name: str) -> SimpleNamespace:
    return SimpleNamespace(file=SimpleNamespace(src_uri=name))


@pytest.mark.parametrize(
    "marker",
    [
        '--8 < --"docs/examples/scale_recipe.py:handler"',  # what a formatter made of it
        '--8<--"docs/examples/scale_recipe.py:handler"',
        "--8&lt;-- 'docs/examples/scale_recipe.py'",
    ],
)
def test_a_marker_the_extension_does_not_read_fails_the_build(hooks, marker):
    with pytest.raises(PluginError, match="a snippet marker that is not read"):
        hooks.on_page_markdown(f"# A guide\n\n```python\n{marker}\n```\n", page=page("a.md"))


def test_a_built_page_without_the_code_it_includes_fails_the_build(hooks):
    markdown = f"# A guide\n\n```python\n{HANDLER}\n```\n"
    assert hooks.on_page_markdown(markdown, page=page("b.md")) == markdown
    with pytest.raises(PluginError, match=r"lacks docs/examples/scale_recipe\.py:handler"):
        hooks.on_post_page("<p>no code here</p>", page=page("b.md"))
    with pytest.raises(PluginError, match="shows a snippet marker"):
        hooks.on_post_page(f"<p>{html.escape(HANDLER)}</p>", page=page("b.md"))
    first = hooks._first_line("docs/examples/scale_recipe.py:handler")
    built = f"<pre><code><span>{html.escape(first)}</span></code></pre>"
    assert hooks.on_post_page(built, page=page("b.md")) == built
