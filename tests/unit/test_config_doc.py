"""docs/configuration.md is generated from the config definitions and must not drift."""

from __future__ import annotations

from rmq_mp.config.doc import DOC, SHIPPED_CONF, conf_comments, render
from rmq_mp.config.store_config import PROPERTY_NAMES


def test_configuration_md_matches_the_definitions() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), (
        "docs/configuration.md drifted from rmq_mp/config/store_config.py or conf/broker.conf: "
        "run `python -m rmq_mp.config.doc --write`"
    )


def test_every_property_has_a_row_and_a_comment() -> None:
    comments, sections = conf_comments(SHIPPED_CONF.read_text(encoding="utf-8"))
    text = render()
    for key in PROPERTY_NAMES:
        assert f"| `{key}` |" in text, key
        assert comments.get(key), f"{key} has no comment in conf/broker.conf"
        assert sections.get(key), f"{key} is under no section heading"


def test_a_changed_comment_changes_the_document(tmp_path, monkeypatch) -> None:
    """The generator reads the live conf: a new comment shows up (so the drift test can fail)."""
    import rmq_mp.config.doc as config_doc

    conf = tmp_path / "broker.conf"
    conf.write_text(
        SHIPPED_CONF.read_text(encoding="utf-8").replace("metricsPort=0", "# a changed line\nmetricsPort=0"),
        encoding="utf-8",
    )
    monkeypatch.setattr(config_doc, "SHIPPED_CONF", conf)
    changed = render()
    assert changed != DOC.read_text(encoding="utf-8")
    assert "a changed line" in changed
