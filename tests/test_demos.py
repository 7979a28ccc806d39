"""The demo commands print one JSON object each; the figures the course quotes are checked here."""
import json

import pytest

from engine.__main__ import main
from engine.cache.slots import blocks_needed
from engine.seeded import request_lengths


def run(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_paged_static_slots_waste_most_of_what_they_reserve(capsys):
    got = run(capsys, "paged")
    lengths = request_lengths(32, 20, 500, seed=0)
    assert got["requests"] == 32 and got["tokens_stored"] == sum(lengths)
    assert got["static_slots_reserved"] == 32 * 1024
    assert got["paged_slots_reserved"] == 16 * sum(blocks_needed(n, 16) for n in lengths)
    assert got["static_utilization"] == round(sum(lengths) / (32 * 1024), 3)
    assert got["paged_utilization"] == round(sum(lengths) / got["paged_slots_reserved"], 3)
    # the shape of the seed's figures (about 0.30 vs 0.98), computed here from this workload
    assert got["static_utilization"] < 0.35 and got["paged_utilization"] > 0.95
    # a paged request wastes less than one block: at most 15 empty slots each
    assert got["paged_slots_reserved"] - got["tokens_stored"] < 32 * 16


def test_paged_sweep_plots_utilization_against_block_size(capsys, tmp_path):
    out = tmp_path / "sweep.png"
    got = run(capsys, "paged", "--sweep", "--out", str(out))
    sizes = [row["block_size"] for row in got["sweep"]]
    assert sizes == [1, 2, 4, 8, 16, 32, 64, 128]
    utilization = [row["utilization"] for row in got["sweep"]]
    tables = [row["mean_table_length"] for row in got["sweep"]]
    assert utilization[0] == 1.0 and utilization == sorted(utilization, reverse=True)
    # 128x fewer entries, less the rounding up of the last block
    assert tables == sorted(tables, reverse=True) and tables[0] > 64 * tables[-1]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("model", ["trained", "tiny"])
def test_fork_shares_the_prompt_and_copies_one_block_per_fork(capsys, model):
    got = run(capsys, "fork", "--model", model)
    assert (got["parent_blocks"], got["new_blocks_after_forking"],
            got["new_blocks_after_each_fork_writes_a_token"]) == (3, 0, 4)
    assert got["blocks_for_independent_copies"] == 12
    # float32 rounding: the seeded model's logits are O(1); the trained one's reach 16-32, where one ulp is
    # 2**-19 (1.9e-6), so a few ulps of a different summation order pass 1e-5 there
    assert got["max_abs_diff_vs_scratch"] < (1e-5 if model == "tiny" else 20 * 2 ** -19)


@pytest.mark.parametrize("model", [[], ["--model", "trained"], ["--model", "tiny"]], ids=["default", "trained", "tiny"])
def test_prefix_prefills_the_system_prompt_once(capsys, model):
    got = run(capsys, "prefix", *model)
    assert (got["prompt_tokens"], got["tokens_prefilled"], got["blocks_in_use"], got["blocks_without_sharing"]) \
        == (832, 160, 14, 56)
    assert got["prefix_cache"] == {"queries": 8, "hits": 7, "tokens_saved": 7 * 96, "cached_blocks": 6}
    # float32 rounding: the trained model's logits are an order larger than the seeded one's (see the fork test)
    assert got["max_abs_diff_vs_cold_prefill"] < (1e-5 if model[-1:] == ["tiny"] else 20 * 2 ** -19)


def test_prefix_runs_the_trained_model_on_the_course_s_text_by_default(monkeypatch, capsys):
    """The default is the trained tiny model prompted with the course's prose; --model tiny the seeded one."""
    import engine.serve.shared_prompt as shared_prompt
    seen = []

    def recording(*args, **kwargs):
        seen.append((kwargs["model"], kwargs["tokens"](16, 0)))
        return shared_prompt.run(*args, **kwargs)
    monkeypatch.setattr("engine.tools.demos.prefix.run", recording)
    run(capsys, "prefix", "--requests", "2")
    run(capsys, "prefix", "--requests", "2", "--model", "tiny")
    from engine.checkpoint import trained_config
    from engine.seeded import seeded_tokens
    (trained, text), (seeded, ids) = seen
    assert trained.config == trained_config() and seeded.config != trained_config()
    assert bytes(text).decode().isprintable() and ids == seeded_tokens(16, 0)


@pytest.mark.parametrize("model", ["trained", "tiny"])
@pytest.mark.parametrize("block_size, shared_blocks", [(8, 12), (32, 3)])
def test_prefix_figures_follow_the_block_size(capsys, block_size, shared_blocks, model):
    # The 96 shared tokens fill 12 blocks of 8 or 3 of 32; each request's own 8 tokens take one block. In
    # blocks of 8 those are a full block, cached too: the course's text has two paragraphs that start with
    # "The mode", so the later request reuses all but its last token (prefilled into a copy of that block).
    from engine.tools.demos import demo_prompt
    got = run(capsys, "prefix", "--block-size", str(block_size), "--model", model)
    own = [bytes(demo_prompt(model, 8, 1 + i)) for i in range(8)]
    repeats = sum(block_size == 8 and text in own[:i] for i, text in enumerate(own))
    assert (model, block_size, repeats) in {("trained", 8, 1), ("trained", 32, 0), ("tiny", 8, 0), ("tiny", 32, 0)}
    assert got["blocks_in_use"] == shared_blocks + 8
    assert got["tokens_prefilled"] == 104 + (7 - repeats) * 8 + repeats


def test_bench_alloc_reports_every_pool_size(capsys):
    # A benchmark, not a timed test: only the shape of its output is checked.
    got = run(capsys, "bench-alloc", "--ops", "500", "--repeats", "1", "--sizes", "1000", "10000")
    assert set(got["allocate_ns"]) == set(got["release_ns"]) == {"1000", "10000"}
    assert all(v > 0 for v in list(got["allocate_ns"].values()) + list(got["release_ns"].values()))


@pytest.mark.parametrize("model", ["trained", "tiny"])
def test_beam_search_command_shares_the_prompt_and_frees_every_beam(capsys, model):
    """`python -m engine beam` on the trained tiny model (the default; its prompt is the course's first
    paragraph) or the seeded one: the search of engine/serve/beam.py, its figures."""
    from engine.checkpoint import tiny_model, trained_model
    from engine.generate import scratch_logits
    from engine.seeded import seeded_tokens
    from engine.serve.beam import Beam, select
    got = run(capsys, "beam", "--prompt-tokens", "40", "--width", "4", "--tokens", "8", "--model", model)
    assert (got["width"], got["tokens"], len(got["beams"])) == (4, 8, 4)
    assert all(len(beam["tokens"]) == 8 for beam in got["beams"])
    scores = [beam["score"] for beam in got["beams"]]
    assert scores == sorted(scores, reverse=True)                 # best first
    # the prompt's 40 tokens (3 blocks of 16) stored once: far fewer blocks than 4 private copies at the peak
    assert got["unshared_blocks"] == 4 * blocks_needed(40 + 8 - 1, 16) and got["peak_blocks"] < got["unshared_blocks"]
    assert got["blocks_in_use_after"] == 0                        # every beam's sequence freed
    # the best beam's first token is the greedy choice after the prompt, as select() takes it
    if model == "trained":
        assert got["prompt"] == "A language model writes one token at a t"
        assert all(bytes(beam["tokens"]).decode() == beam["text"] for beam in got["beams"])
        weights, prompt = trained_model(), list(got["prompt"].encode())
    else:
        weights, prompt = tiny_model(seed=0), seeded_tokens(40, 0)
    logits = scratch_logits(weights, [prompt])[0][-1:]
    first = select([Beam(0)], logits, 4)
    assert got["beams"][0]["tokens"][0] in {token for _, token, _ in first}


def test_beam_search_command_refuses_a_width_out_of_range(capsys):
    assert main(["beam", "--width", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: argument --width: 0 is not")
