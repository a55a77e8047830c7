"""Documents from users are read with depth and YAML alias expansion bounded; every failure is
a one-line DocumentError naming the source, and error messages quote bounded excerpts."""

from __future__ import annotations

import pytest

from thundersync.protocol import documents
from thundersync.protocol.documents import DocumentError, excerpt, load_file

DEEP = 10_000


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """``levels`` anchors, each a list of ``width`` aliases of the one before: a few hundred
    bytes standing for width**levels strings."""
    lines = ["a0: &a0 [" + ", ".join(['"lol"'] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    lines.append(f"tags: *a{levels - 1}")
    return "\n".join(lines) + "\n"


def assert_one_line_naming(err: pytest.ExceptionInfo, source: object) -> None:
    message = str(err.value)
    assert message.startswith(f"{source}: "), message
    assert "\n" not in message and len(message) < 500, message


def test_a_yaml_alias_bomb_is_refused_before_it_is_built():
    text = alias_bomb()
    assert len(text) < 600
    with pytest.raises(DocumentError, match="aliases followed") as err:
        documents.load_yaml(text, "task.yaml")
    assert_one_line_naming(err, "task.yaml")


def test_yaml_aliases_within_the_bound_keep_working():
    text = "base: &base {image: x, cpus: 1}\nweb: {<<: *base, cpus: 2}\nall: [*base, *base]\n"
    assert documents.load_yaml(text, "f.yaml") == {
        "base": {"image": "x", "cpus": 1},
        "web": {"image": "x", "cpus": 2},
        "all": [{"image": "x", "cpus": 1}, {"image": "x", "cpus": 1}],
    }
    assert documents.load_yaml(alias_bomb(levels=3, width=9), "f.yaml")["tags"][8][8] == ["lol"] * 9


def test_an_alias_inside_its_own_anchor_is_refused():
    with pytest.raises(DocumentError, match="refers to a node that holds it") as err:
        documents.load_yaml("a: &a [1, *a]\n", "f.yaml")
    assert_one_line_naming(err, "f.yaml")


def test_aliases_count_towards_the_depth_where_they_are_used():
    inner = "[" * 60 + "]" * 60
    text = f"a: &a {inner}\nb: {'[' * 50}*a{']' * 50}\n"
    with pytest.raises(DocumentError, match=f"more than {documents.MAX_DEPTH} levels"):
        documents.load_yaml(text, "f.yaml")


@pytest.mark.parametrize(
    ("loader", "text"),
    [
        (documents.load_json, "[" * DEEP + "]" * DEEP),
        (documents.load_json, '{"a": ' * DEEP + "1" + "}" * DEEP),
        (documents.load_toml, "a = " + "[" * DEEP + "]" * DEEP),
        (documents.load_toml, "a = " + "{b = " * DEEP + "1" + "}" * DEEP),
        (documents.load_toml, "a" + ".a" * DEEP + " = 1"),
        (documents.load_yaml, "[" * DEEP + "]" * DEEP),
        (documents.load_yaml, "".join(f"{' ' * i}a:\n" for i in range(DEEP)) + " " * DEEP + "1\n"),
    ],
    ids=[
        "json-arrays",
        "json-objects",
        "toml-arrays",
        "toml-tables",
        "toml-dotted-keys",
        "yaml-flow",
        "yaml-block",
    ],
)
def test_nesting_10000_deep_is_a_one_line_error(loader, text):
    with pytest.raises(DocumentError, match=f"nested more than {documents.MAX_DEPTH} levels") as e:
        loader(text, "in.doc")
    assert_one_line_naming(e, "in.doc")


def test_nesting_up_to_the_bound_loads():
    depth = documents.MAX_DEPTH
    assert documents.load_json("[" * depth + "]" * depth, "f.json") is not None
    with pytest.raises(DocumentError):
        documents.load_json("[" * (depth + 1) + "]" * (depth + 1), "f.json")


@pytest.mark.parametrize(
    ("loader", "text", "expected"),
    [
        (documents.load_json, '{"a": [1,', "expected valid JSON"),
        (documents.load_json, "1" * 5000, "expected valid JSON"),
        (documents.load_toml, "a = [1,", "expected valid TOML"),
        (documents.load_yaml, "a: [1,\n  b: {", "expected valid YAML"),
        (documents.load_yaml, "a: " + "1" * 5000, "expected valid YAML"),
    ],
)
def test_malformed_documents_are_one_line_errors(loader, text, expected):
    with pytest.raises(DocumentError, match=expected) as err:
        loader(text, "in.doc")
    assert_one_line_naming(err, "in.doc")


def test_load_file_reads_by_suffix_and_bounds_the_size(tmp_path):
    (tmp_path / "a.toml").write_text("x = 1\n")
    (tmp_path / "a.yaml").write_text("x: 1\n")
    (tmp_path / "a.json").write_text('{"x": 1}')
    assert [load_file(tmp_path / f"a.{s}") for s in ("toml", "yaml", "json")] == [{"x": 1}] * 3
    with pytest.raises(DocumentError, match="at most 4 bytes") as err:
        load_file(tmp_path / "a.json", max_bytes=4)
    assert_one_line_naming(err, tmp_path / "a.json")


def test_an_excerpt_of_a_huge_shared_structure_is_short():
    level: object = ["lol"] * 9
    for _ in range(8):
        level = [level] * 9  # 9**9 leaves if expanded
    text = excerpt(level)
    assert len(text) <= documents.MAX_EXCERPT_CHARS and "\n" not in text
    assert excerpt("x" * 10_000).startswith("'xxx") and len(excerpt("x" * 10_000)) < 100
    assert excerpt("short") == "'short'"
