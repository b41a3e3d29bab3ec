"""Preference data: sources, formats, splits and reference-style tokenization, on real files."""

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from support import REPO

from dpo_sweeps.data.collate import collate
from dpo_sweeps.data.encoding import (
    IGNORE_INDEX,
    EncodedPair,
    GlobalBatchSampler,
    chat_format,
    encode_pairs,
    render_pair,
)
from dpo_sweeps.data.rows import longest_rows
from dpo_sweeps.data.sources import load_preference_rows, split_hh_dialogue
from dpo_sweeps.data.synthetic import generate_pairs, topic_preferences
from dpo_sweeps.errors import DataError, InvalidConfig
from dpo_sweeps.models.tokenizers import byte_tokenizer

REPO_CONF = __import__("pathlib").Path(__file__).resolve().parents[2] / "conf" / "data"


def data_cfg(name: str, **overrides):
    cfg = OmegaConf.load(REPO_CONF / f"{name}.yaml")
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def write_jsonl(path, rows, gz=False):
    opener = gzip.open if gz else open
    with opener(path, "wt") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


PAIRS = [{"prompt": f"question {i}?", "chosen": f" good {i}", "rejected": f" bad {i}"} for i in range(20)]


def test_hh_prompt_is_everything_up_to_the_last_assistant_turn():
    text = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how?\n\nAssistant: like this"
    prompt, response = split_hh_dialogue(text)
    assert prompt == "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how?\n\nAssistant:"
    assert response == " like this"


def test_hh_file_drops_pairs_whose_prompts_differ_and_holds_out_eval(hh_path):
    rows = load_preference_rows(data_cfg("hh", path=str(hh_path), eval_size=100), base_dir=hh_path.parent)
    # The shared split has 2,312 rows, 5 of them with different chosen/rejected prompts.
    assert rows.counts["train_dropped_prompt_mismatch"] == 5
    assert len(rows.train) + len(rows.eval) == 2312 - 5
    assert len(rows.eval) == 100 and rows.eval_source == "held out"
    assert all(r["prompt"].endswith("\n\nAssistant:") for r in rows.train[:50])


def test_held_out_split_is_deterministic_and_disjoint(tmp_path):
    path = write_jsonl(tmp_path / "prefs.jsonl.gz", PAIRS, gz=True)
    cfg = data_cfg("preference", path=str(path), eval_size=5, split_seed=3)
    a, b = load_preference_rows(cfg, tmp_path), load_preference_rows(cfg, tmp_path)
    assert a.train == b.train and a.eval == b.eval
    assert len(a.eval) == 5 and len(a.train) == 15
    assert not {r["prompt"] for r in a.train} & {r["prompt"] for r in a.eval}
    other = load_preference_rows(data_cfg("preference", path=str(path), eval_size=5, split_seed=4), tmp_path)
    assert other.eval != a.eval


def test_a_folder_with_its_own_test_split_uses_it(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", PAIRS[:15])
    write_jsonl(tmp_path / "test.jsonl", PAIRS[15:])
    rows = load_preference_rows(data_cfg("preference", path=str(tmp_path), eval_split="test"), tmp_path)
    assert rows.eval_source == "test"
    assert rows.train == PAIRS[:15] and rows.eval == PAIRS[15:]


def test_parquet_with_custom_columns(tmp_path):
    table = pa.table({"q": [p["prompt"] for p in PAIRS], "w": [p["chosen"] for p in PAIRS],
                      "l": [p["rejected"] for p in PAIRS]})
    pq.write_table(table, tmp_path / "prefs.parquet")
    cfg = data_cfg("preference", path="prefs.parquet", prompt_column="q", chosen_column="w", rejected_column="l", eval_size=4)
    rows = load_preference_rows(cfg, tmp_path)  # relative path resolves against base_dir
    assert len(rows.train) == 16 and set(rows.train[0]) == {"prompt", "chosen", "rejected"}


def test_missing_column_names_the_setting_and_lists_columns(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "chosen": "b", "worse": "c"}] * 3)
    with pytest.raises(DataError, match=r"data.rejected_column: column 'rejected' not in .*columns there: chosen, prompt, worse"):
        load_preference_rows(data_cfg("preference", path=str(path)), tmp_path)


def test_missing_path_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="data.path: no such file or folder './nope.jsonl'"):
        load_preference_rows(data_cfg("preference", path="./nope.jsonl"), tmp_path)


def test_data_empty_after_filtering_is_refused(tmp_path):
    rows = [{"chosen": "\n\nHuman: a\n\nAssistant: x", "rejected": "\n\nHuman: b\n\nAssistant: y"}] * 4
    path = write_jsonl(tmp_path / "hh.jsonl", rows)
    with pytest.raises((DataError, InvalidConfig), match="data"):
        load_preference_rows(data_cfg("hh", path=str(path), eval_size=1), tmp_path)


def test_conversational_rows_use_the_plain_rendering_without_a_chat_template():
    row = {"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
           "chosen": [{"role": "assistant", "content": "hello"}],
           "rejected": [{"role": "assistant", "content": "go away"}]}
    assert render_pair(row) == ("system: be brief\nuser: hi\nassistant:", " hello", " go away")


def test_conversational_rows_use_the_tokenizers_chat_template():
    tok = byte_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    row = {"prompt": [{"role": "user", "content": "hi"}],
           "chosen": [{"role": "assistant", "content": "hello"}],
           "rejected": [{"role": "assistant", "content": "no"}]}
    prompt, chosen, rejected = render_pair(row, chat_format(tok, "auto"))
    assert prompt == "<user>hi</user><assistant>"
    # The response is what the template adds after the prompt.
    assert (chosen, rejected) == ("hello</assistant>", "no</assistant>")


def test_a_value_that_is_neither_text_nor_messages_is_a_data_error():
    with pytest.raises(DataError, match="role"):
        render_pair({"prompt": [{"text": "x"}], "chosen": "a", "rejected": "b"})


def test_tokenization_appends_eos_and_masks_the_prompt():
    tok = byte_tokenizer()
    pairs, truncated = encode_pairs([("ab", "cd", "e")], tok, max_length=16, max_prompt_length=8, truncation_mode="keep_start")
    assert truncated == 0
    (pair,) = pairs
    assert pair.chosen[-1] == tok.eos_token_id and pair.rejected[-1] == tok.eos_token_id
    assert len(pair.chosen) == 3 and len(pair.rejected) == 2
    batch = collate(pairs, tok.pad_token_id)
    assert batch["input_ids"].shape == (2, 5)  # chosen row then rejected row, padded to 5
    assert batch["labels"][0].tolist()[:2] == [IGNORE_INDEX, IGNORE_INDEX]
    assert batch["labels"][0].tolist()[2:] == pair.chosen
    assert batch["labels"][1].tolist() == [IGNORE_INDEX, IGNORE_INDEX, *pair.rejected, IGNORE_INDEX]
    assert batch["attention_mask"][1].tolist() == [1, 1, 1, 1, 0]


@pytest.mark.parametrize("share_prompt", [False, True])
def test_pairs_at_their_longest_collate_to_the_rows_the_estimates_size_a_step_by(share_prompt):
    # Prompts at max_prompt_length, responses filling max_length: the worst case the fit check and the
    # cost prediction assume before any data is read (data/rows.py).
    max_length, max_prompt_length, pairs = 24, 10, 3
    longest = [EncodedPair(list(range(1, 11)), list(range(11, 25)), list(range(25, 39))) for _ in range(pairs)]
    batch = collate(longest, pad_id=0, share_prompt=share_prompt)
    rows = longest_rows(pairs, max_length, max_prompt_length, share_prompt=share_prompt)
    assert tuple(batch["input_ids"].shape) == (rows.rows, rows.length)
    assert len(batch["token_targets"]) == rows.response_tokens == 2 * pairs * (max_length - max_prompt_length)
    # A prefix-shared row holds the prompt once and both responses: longer than max_length.
    assert rows.length == (max_prompt_length + 2 * 14 if share_prompt else max_length)


@pytest.mark.parametrize("mode,kept", [("keep_end", "6789"), ("keep_start", "0123")])
def test_an_over_long_prompt_is_cut_first_keeping_its_end_or_start(mode, kept):
    tok = byte_tokenizer()
    pairs, truncated = encode_pairs([("0123456789", "ab", "c")], tok, max_length=8, max_prompt_length=4, truncation_mode=mode)
    assert truncated == 1
    assert tok.decode(pairs[0].prompt) == kept
    assert tok.decode(pairs[0].chosen) == "ab" + tok.eos_token  # responses fit once the prompt is cut


def test_responses_are_cut_to_max_length_minus_max_prompt_length_after_the_prompt():
    tok = byte_tokenizer()
    pairs, truncated = encode_pairs([("0123456789", "abcdefgh", "xy")], tok, max_length=8, max_prompt_length=4,
                                    truncation_mode="keep_end")
    assert truncated == 1
    assert tok.decode(pairs[0].prompt) == "6789"
    assert tok.decode(pairs[0].chosen) == "abcd" and pairs[0].length == 8
    assert tok.decode(pairs[0].rejected) == "xy" + tok.eos_token


def test_max_prompt_length_must_be_below_max_length():
    with pytest.raises(InvalidConfig, match=r"data.max_prompt_length: 8 with data.max_length=8"):
        encode_pairs([("a", "b", "c")], byte_tokenizer(), max_length=8, max_prompt_length=8, truncation_mode="keep_end")


def test_synthetic_task_is_deterministic_and_follows_its_rule():
    kwargs = dict(seed=1, num_topics=4, prompt_letters=5, response_letters=200, noise=0.0)
    a = generate_pairs(10, stream="train", **kwargs)
    assert a == generate_pairs(10, stream="train", **kwargs)
    assert a != generate_pairs(10, stream="eval", **kwargs)
    liked = topic_preferences(4, 1)
    for pair in a:
        topic = int(pair["prompt"].split()[1].rstrip(":"))
        assert set(pair["chosen"].strip()) <= set(liked[topic])
        assert not set(pair["rejected"].strip()) & set(liked[topic])


def test_sampler_is_a_pure_function_of_step_and_covers_each_epoch():
    sampler = GlobalBatchSampler(num_pairs=10, batch_size=4, seed=0)
    first_epoch = sampler.indices(0) + sampler.indices(1) + sampler.indices(2)[:2]
    assert sorted(first_epoch) == list(range(10))
    assert GlobalBatchSampler(10, 4, 0).indices(7) == sampler.indices(7)
    assert GlobalBatchSampler(10, 4, 1).indices(0) != sampler.indices(0)


# Truncation and the rows it could spoil: data/row_checks.py keeps empty responses, arguing that cutting
# to data.max_length never empties one; this tries prompts longer than max_length, max_prompt_length next
# to max_length, both truncation modes, and responses that end with the end-of-turn token themselves.
TEXT = st.text(alphabet="ab \n", max_size=12) | st.just("")
BYTES = byte_tokenizer()


@settings(max_examples=300, derandomize=True, deadline=None)
@given(rows=st.lists(st.tuples(st.text(alphabet="pq", max_size=30), TEXT, TEXT), min_size=1, max_size=4),
       max_length=st.integers(2, 24), prompt_share=st.floats(0, 1), mode=st.sampled_from(["keep_start", "keep_end"]),
       own_end=st.booleans())
def test_truncation_never_empties_a_response_nor_leaves_one_only_its_end_token(rows, max_length, prompt_share,
                                                                               mode, own_end):
    tok = BYTES
    eos = tok.eos_token
    max_prompt_length = min(max_length - 1, 1 + int(prompt_share * (max_length - 1)))
    texts = [(p, c + eos if own_end else c, r) for p, c, r in rows]  # a response that brings its end token
    pairs, _ = encode_pairs(texts, tok, max_length=max_length, max_prompt_length=max_prompt_length,
                            truncation_mode=mode, end_of_turn=eos if own_end else None)
    for pair, (prompt, chosen, rejected) in zip(pairs, texts, strict=True):
        assert len(pair.prompt) + max(len(pair.chosen), len(pair.rejected)) <= max_length
        for ids, text in ((pair.chosen, chosen), (pair.rejected, rejected)):
            assert ids, (prompt, text)  # never empty
            # Only a response that was empty before truncation is its end token alone (kept: it trains as EOS).
            assert ids != [tok.eos_token_id] or text in ("", eos), (text, max_length, max_prompt_length)


def test_pairs_made_identical_by_truncation_are_dropped_and_named_by_line(tmp_path):
    from hydra import compose, initialize_config_dir

    from dpo_sweeps.train.setup import _load_and_encode

    data = tmp_path / "prefs"
    data.mkdir()
    rows = [("q1", " yes, a", " no, b"), ("q2", " same start A", " same start B"), ("q3", " xy", " xz"),
            ("q4", " alike, then 1", " alike, then 2"), ("q5", " one", " two")]
    (data / "train.jsonl").write_text("".join(json.dumps(dict(zip(("prompt", "chosen", "rejected"), r))) + "\n"
                                              for r in rows))
    (data / "test.jsonl").write_text(json.dumps({"prompt": "q", "chosen": " a", "rejected": " b"}) + "\n")
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["data=preference", f"data.path={data}", "data.eval_split=test",
                                           "data.max_length=6", "data.max_prompt_length=2"])
    encoded = _load_and_encode(cfg, tmp_path)  # each response cut to 4 bytes: " sam", " ali" on both sides
    assert encoded.dropped.rows == {"identical_after_truncation": ["train.jsonl line 2", "train.jsonl line 4"]}
    assert encoded.counts["dropped_rows"] == {"identical_after_truncation": 2} and len(encoded.train_pairs) == 3
    assert encoded.counts["train_truncated"] == 4  # " xy" and its EOS fit beside the 2-byte prompt
