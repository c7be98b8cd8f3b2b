"""The one name -> builder table: every name a config can give resolves, and every conf/ option names one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainrun import kinds, registry
from trainrun.schema import DataConfig, ModelConfig, TaskConfig

CONF = Path(__file__).resolve().parents[1] / "conf"


@pytest.mark.parametrize("kind", registry.KINDS)
def test_every_registered_name_resolves_to_a_builder(kind):
    for name in registry.names(kind):
        assert callable(registry.builder(kind, name)), (kind, name)


@pytest.mark.parametrize(("group", "config"), [("model", ModelConfig), ("data", DataConfig)])
def test_each_conf_option_names_a_registered_builder(group, config):
    names = kinds.option_names(group, config().name)  # an option that sets no name keeps the schema's default
    assert set(names.values()) == set(registry.names(group)), names  # none unregistered, none unreachable


def test_tasks_are_chosen_by_their_registered_name():
    for path in (CONF / "task").glob("*.yaml"):
        chosen = (yaml.safe_load(path.read_text()) or {}).get("task", {}).get("name", TaskConfig().name)
        assert chosen == path.stem
    assert set(registry.names("task")) == {path.stem for path in (CONF / "task").glob("*.yaml")}


def test_an_unregistered_builder_is_a_key_error_not_an_import():
    with pytest.raises(KeyError):
        registry.builder("model", "resnet9000")
