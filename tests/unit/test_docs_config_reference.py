"""The config reference page (docs/hooks/config_reference.py) is generated from the schema: every section of
Config, every key of every section and the docstring under it, and a section added to Config with no change
to the generator."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys

from omegaconf import MISSING
from support import REPO

from dpo_sweeps.config.schema import Config
from dpo_sweeps.config.section import Section


def generator():
    spec = importlib.util.spec_from_file_location("config_reference", REPO / "docs" / "hooks" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as MkDocs loads a hook
    spec.loader.exec_module(module)
    return module


def test_every_key_of_every_section_is_on_the_page_with_its_docstring():
    hooks = generator()
    page = hooks.render()
    for section in dataclasses.fields(Config):
        assert f"## {section.name}\n" in page, section.name
    # A plain section, a nested one, a section typed per source (data) and per loss, each key with its docstring.
    assert "| `train.batch_size` | `int` | `32` | Global batch, in preference pairs" in page  # its default is the schema's (issue 49)
    assert "| `train.lr_schedule` | `str` | `constant` |" in page
    assert "`model.tokenizer.vocab_size`" in page and "`data.num_topics`" in page and "`data.prompt_column`" in page
    assert "### `loss=simpo`" in page and "`loss.gamma`" in page
    assert "model=&lt;conf/model file&gt;" in page  # a docstring's <placeholder> is text, not an HTML tag
    for field in dataclasses.fields(Config.__dataclass_fields__["train"].default_factory()):
        assert f"`train.{field.name}`" in page, field.name


@dataclasses.dataclass
class ExampleSection(Section):
    rank: int = 8
    """The adapters' rank, a section only this test has."""


def test_a_section_added_to_config_is_rendered_with_no_change_to_the_generator():
    bigger = dataclasses.make_dataclass("BiggerConfig", [("example", ExampleSection | None, dataclasses.field(default=MISSING))],
                                        bases=(Config,))
    page = generator().render(bigger)
    assert "## example\n" in page
    assert "| `example.rank` | `int` | `8` | The adapters' rank, a section only this test has. |" in page
