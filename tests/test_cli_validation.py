"""Every bad input is refused before any work: one `error:` line naming the option, the value and the
allowed range, exit status 2, no traceback; refused API calls change no state (issue 22).

The commands run in-process through `python -m engine`'s main(argv), with every function that does
real work (building a model, serving, timing) replaced by one that fails the test if it is reached:
a refusal is fast because nothing runs, not because a clock says so.
"""
import json
import math
import subprocess
import sys

import pytest
import torch

from engine.tools import cli_args
from engine.__main__ import main
from engine.cache.paged import PagedKVCache
from engine.cache.quantized import QuantizedPagedKVCache
from engine.checkpoint import load_model, tiny_config, tiny_model, write_tiny_checkpoint
from engine.errors import InputError
from engine.generate import cached_step
from engine.model import Qwen3Model
from engine.sampling import SamplingParams
from fixtures.commands import run_command
from engine.serve.engine import Engine
from engine.serve.scheduler import SchedulerConfig

GIB = 1024 ** 3

# (argv, what the one error line must say after "error: ")
CLI_CASES = [
    # bench: each value by its type
    (["bench", "--requests", "0"], "argument --requests: 0 is not a whole number from 1 to 100000"),
    (["bench", "--requests", "-5"], "argument --requests: -5 is not a whole number from 1 to 100000"),
    (["bench", "--requests", "10000000000"], "argument --requests: 10000000000 is not a whole number from 1"),
    (["bench", "--requests", "2.5"], "argument --requests: 2.5 is not a whole number from 1 to 100000"),
    (["bench", "--token-budget", "0"], "argument --token-budget: 0 is not a whole number >= 1"),
    (["bench", "--scale", "0"], "argument --scale: 0 is not a finite number > 0"),
    (["bench", "--scale", "-1"], "argument --scale: -1 is not a finite number > 0"),
    (["bench", "--scale", "inf"], "argument --scale: inf is not a finite number > 0"),
    (["bench", "--request-rate", "nan"], "argument --request-rate: nan is not a finite number > 0"),
    (["bench", "--request-rate", "0"], "argument --request-rate: 0 is not a finite number > 0"),
    (["bench", "--prefix", "--system-len", "0"], "argument --system-len: 0 is not a whole number >= 1"),
    (["bench", "--block-size", "0"], "argument --block-size: 0 is not a whole number >= 1"),
    (["bench", "--block-size", "-16"], "argument --block-size: -16 is not a whole number >= 1"),
    (["bench", "--slots", "0"], "argument --slots: 0 is not a whole number >= 1"),
    (["bench", "--slots", "-1"], "argument --slots: -1 is not a whole number >= 1"),
    (["bench", "--max-len", "0"], "argument --max-len: 0 is not a whole number >= 1"),
    (["bench", "--seed", "-1"], "argument --seed: -1 is not a seed: a whole number from 0 to 2**63 - 1"),
    (["bench", "--prompt-len", "50", "10"], "argument --prompt-len: MIN 50 is greater than MAX 10"),
    (["bench", "--output-len", "0", "10"], "argument --output-len: 0 is not a whole number >= 1"),
    (["bench", "--kinds", "paged", "paged"], "argument --kinds: paged is given twice"),
    (["bench", "--gpu", "H900"], "argument --gpu: invalid choice: 'H900'"),
    (["bench", "--plot", "/no/such/folder/kv.png"],
     "argument --plot: /no/such/folder/kv.png: the folder '/no/such/folder' does not exist; create it first"),
    (["bench", "--plot", "kv.txt"], "argument --plot: kv.txt does not end in .png, .pdf, .svg"),
    # bench: the options together, and what they imply (Setup.check), before the model is built
    (["bench", "--block-size", "100000"],
     "--kinds paged: the KV budget of --slots 12 x (--max-len 1024 x --scale 0.5 = 512) tokens, in blocks of "
     "--block-size 100000, holds requests of at most 0 positions, but the longest request (--prompt-len MAX 250 "
     "+ --output-len MAX 100 (scaled by 0.5) = 350 tokens) needs 349"),
    (["bench", "--max-len", "100"], "--kinds max: the KV budget of --slots 12 x (--max-len 100 x --scale 0.5 = 50)"),
    (["bench", "--scale=1e400"], "argument --scale: 1e400 is not a finite number > 0"),
    (["bench", "--scale", "20"], "past the model's trained context of 4096"),
    (["bench", "--slots", "1", "--max-len", "700", "--prompt-len", "300", "400", "--output-len", "200", "300",
      "--scale", "1", "--kinds", "pow2"], "--kinds pow2: the KV budget of --slots 1 x (--max-len 700) tokens, "
                                          "in regions of a power of two, holds requests of at most 511 positions"),
    (["bench", "--prefix", "--system-len", "5000"], "reaches position 5079, past the model's trained context"),
    (["bench", "--workload", "sharegpt", "--max-len", "100"],
     "--max-len 100 x --scale 0.5 = 50 is too short for the sharegpt mix"),
    (["bench", "--slots", "100000000"], "two engines' KV pools (--slots 100000000 x (--max-len 1024 x --scale 0.5 = "
                                        "512) tokens x 128 bytes) need 12,207.0 GiB, more than 50% of this "
                                        "machine's 16.0 GiB"),
    (["bench", "--prefix", "--request-rate", "2"], "--request-rate 2 does not apply to --prefix"),
    (["bench", "--prefix", "--workload", "alpaca"], "--workload alpaca does not apply to --prefix"),
    (["bench", "--simulate", "qwen3-0.6b", "--model-config", "qwen3-0.6b"], "--simulate qwen3-0.6b already names"),
    # an option the chosen mode ignores, and an empty config name, are refused (not silently dropped)
    (["bench", "--prefix", "--kinds", "max"], "--kinds max does not apply to --prefix, which runs the paged cache"),
    (["bench", "--prefix", "--prompt-len", "1", "2"], "--prompt-len 1 2 does not apply to --prefix"),
    (["bench", "--prefix", "--output-len", "5", "9"], "--output-len 5 9 does not apply to --prefix"),
    (["bench", "--workload", "sharegpt", "--prompt-len", "1", "2"],
     "--prompt-len 1 2 does not apply to --workload sharegpt, which draws its own lengths"),
    (["bench", "--simulate", "qwen3-0.6b", "--slots", "5"], "--slots 5 does not apply to --simulate"),
    (["bench", "--system-len", "100"], "--system-len 100 applies to --prefix only"),
    (["bench", "--simulate", ""], "argument --simulate: '' is empty"),
    (["bench", "--model-config", ""], "argument --model-config: '' is empty"),
    (["bench", "--gpu", "H200"], "--gpu H200 names the card of a simulation"),
    (["bench", "--simulate", "no-such-model"], "no config 'no-such-model': give a path or one of"),
    (["bench", "--simulate", "llama-3-8b", "--gpu", "laptop-8GB"], "llama-3-8b does not fit on laptop-8GB"),
    (["bench", "--simulate", "qwen3-0.6b", "--requests", "100000", "--prompt-len", "30000", "40000",
      "--max-len", "40960", "--kinds", "paged"],
     "--requests 100000 requests of up to 40200 tokens need 30.0 GiB"),
    # bench-peer
    (["bench-peer", "--heads", "3", "2"], "--heads 3 2: Q 3 is not a multiple of KV 2"),
    (["bench-peer", "--heads", "0", "2"], "argument --heads: 0 is not a whole number >= 1"),
    (["bench-peer", "--hidden", "0"], "argument --hidden: 0 is not a whole number >= 1"),
    (["bench-peer", "--hidden", "30"], "--hidden 30 with Q 8 heads: the head size hidden / Q must be a whole, even"),
    (["bench-peer", "--hidden", "24"], "--hidden 24 with Q 8 heads: the head size hidden / Q must be a whole, even"),
    (["bench-peer", "--layers", "0"], "argument --layers: 0 is not a whole number >= 1"),
    (["bench-peer", "--threads", "0"], "argument --threads: 0 is not a whole number from 1 to 256"),
    (["bench-peer", "--token-budget", "0"], "argument --token-budget: 0 is not a whole number >= 1"),
    (["bench-peer", "--scale", "-1"], "argument --scale: -1 is not a finite number > 0"),
    (["bench-peer", "--scale", "nan"], "argument --scale: nan is not a finite number > 0"),
    (["bench-peer", "--scale", "20"], "--scale 20: the batched workload's longest request needs 5264 positions"),
    (["bench-peer", "--scale", "0.0001"], "--scale 0.0001: the sharegpt workload's max_len 1024 x 0.0001 = 1 is "
                                          "too short"),
    (["bench-peer", "--hidden", "65536", "--layers", "64"], "--hidden 65536 x --layers 64 (3 copies of"),
    (["bench-peer", "--workloads", "single", "single"], "argument --workloads: single is given twice"),
    # bench-prefix and bench-alloc
    (["bench-prefix", "--sizes", "0"], "argument --sizes: 0 is not a whole number from 2 to 10000000"),
    (["bench-prefix", "--sizes", "1"], "argument --sizes: 1 is not a whole number from 2 to 10000000"),
    (["bench-prefix", "--sizes", "-5"], "argument --sizes: -5 is not a whole number from 2 to 10000000"),
    (["bench-prefix", "--sizes", "1000", "1000"], "argument --sizes: 1000 is given twice"),
    (["bench-prefix", "--rounds", "0"], "argument --rounds: 0 is not a whole number from 1 to 1000"),
    (["bench-alloc", "--sizes", "0"], "argument --sizes: 0 is not a whole number from 1 to 100000000"),
    (["bench-alloc", "--ops", "-3"], "argument --ops: -3 is not a whole number from 1 to 100000000"),
    (["bench-alloc", "--repeats", "0"], "argument --repeats: 0 is not a whole number from 1 to 1000"),
    # the demos
    (["paged", "--requests", "0"], "argument --requests: 0 is not a whole number from 1 to 100000"),
    (["paged", "--min-tokens", "50", "--max-tokens", "10"], "--min-tokens 50 is greater than --max-tokens 10"),
    (["paged", "--max-tokens", "2000"], "--max-tokens 2000 is greater than --capacity 1024"),
    (["paged", "--block-size", "0"], "argument --block-size: 0 is not a whole number >= 1"),
    (["paged", "--capacity", "1000000000"], "--capacity 1000000000 + --max-tokens 500 + --block-size 16) tokens need"),
    (["paged", "--sweep", "--out", "/no/such/folder/sweep.png"], "argument --out: /no/such/folder/sweep.png: the "
                                                                  "folder '/no/such/folder' does not exist"),
    (["fork", "--forks", "0"], "argument --forks: 0 is not a whole number from 1 to 256"),
    (["fork", "--prompt-tokens", "5000"], "sequences of 5001 tokens, past the tiny model's trained context of 4096"),
    (["fork", "--block-size", "1000000000"], "--block-size 1000000000 need"),
    (["fork", "--seed", str(2 ** 70)], f"argument --seed: {2 ** 70} is not a seed"),
    (["prefix", "--system-tokens", "0"], "argument --system-tokens: 0 is not a whole number >= 1"),
    (["prefix", "--own-tokens", "-1"], "argument --own-tokens: -1 is not a whole number >= 0"),
    (["prefix", "--system-tokens", "4000", "--own-tokens", "200"], "sequences of 4200 tokens, past the tiny model"),
    # generate
    (["generate", "--prompt", "hi", "--seed", str(2 ** 70)],
     f"argument --seed: {2 ** 70} is not a seed: a whole number from 0 to 2**63 - 1"),
    (["generate", "--prompt", "hi", "--seed", "2**70"], "argument --seed: 2**70 is not a seed"),
    (["generate", "--prompt", ""], "argument --prompt: '' is empty"),
    (["generate", "--prompt", "hi", "--model", ""],
     "argument --model: '' is empty: give 'trained', 'tiny' or a checkpoint"),
    (["generate", "--prompt", "hi", "--model", "engine/configs/qwen3-0.6b.json"],
     "argument --model: engine/configs/qwen3-0.6b.json is a file: give the checkpoint folder"),
    (["generate", "--prompt", "hi", "--max-tokens", "0"], "argument --max-tokens: 0 is not a whole number >= 1"),
    (["generate", "--prompt", "hi", "--top-p", "0"], "argument --top-p: 0 is not a finite number in (0, 1]"),
    (["generate", "--prompt", "hi", "--top-p", "nan"], "argument --top-p: nan is not a finite number in (0, 1]"),
    (["generate", "--prompt", "hi", "--top-k", "-1"], "argument --top-k: -1 is not a whole number >= 0"),
    (["generate", "--prompt", "hi", "--temperature=-inf"], "argument --temperature: -inf is not a finite number"),
    (["generate", "--prompt", "hi", "--cache", "fp8"], "argument --cache: invalid choice: 'fp8'"),
    # python -m engine itself
    ([], "the following arguments are required: COMMAND"),
    (["bench", "--no-such-option"], "unrecognized arguments: --no-such-option"),
]


def fail_if_reached(name):
    def reached(*args, **kwargs):
        raise AssertionError(f"{name} ran: the refusal came after work had started")
    return reached


@pytest.fixture
def no_work(monkeypatch):
    """Every function that builds a model or a workload, serves, or times fails the test if reached;
    the machine has 16 GiB, so the memory checks say the same everywhere. Every command's module is
    imported first, so a name it imports binds the real function (not this test's stand-in, for later
    tests), and the stand-in goes where the command looks it up (generate_cli's own `generate`)."""
    import importlib

    from engine import checkpoint, generate
    from engine.tools.cli import COMMANDS
    for module_name, _ in COMMANDS.values():
        importlib.import_module(module_name)
    from engine.tools.demos import bench_alloc, bench_prefix, fork, paged, prefix
    from engine.tools import bench, bench_setup, generate_cli, peer_bench
    for module, name in [(bench_setup.Setup, "build_model"), (bench, "capacity"), (bench, "prefix"),
                         (bench, "run_kinds"), (peer_bench, "build_models"), (peer_bench, "compare"),
                         (bench_prefix, "time_evict"), (bench_alloc, "time_pool"), (paged, "static_figures"),
                         (paged, "paged_figures"), (fork, "run"), (prefix, "run"), (checkpoint, "tiny_model"),
                         (checkpoint, "load_model"), (generate, "generate"), (generate_cli, "generate")]:
        monkeypatch.setattr(module, name, fail_if_reached(f"{getattr(module, '__name__', module)}.{name}"))
    monkeypatch.setattr(cli_args, "machine_memory", lambda: 16 * GIB)


@pytest.mark.parametrize("argv, message", CLI_CASES, ids=[" ".join(argv)[:60] for argv, _ in CLI_CASES])
def test_a_bad_option_is_refused_in_one_line_before_any_work(no_work, capsys, argv, message):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err, err


@pytest.mark.parametrize("argv", [["bench", "--requests", "2"], ["bench", "--simulate", "qwen3-0.6b"], ["bench-peer"],
                                  ["bench-prefix"], ["bench-alloc"], ["paged"], ["fork"], ["prefix"],
                                  ["generate", "--prompt", "hi"]])
def test_good_options_do_reach_the_work_so_the_guard_is_real(no_work, argv):
    with pytest.raises(AssertionError, match="ran: the refusal came after work had started"):
        main(argv)


@pytest.mark.parametrize("argv", [["bench", "--requests", "0"], ["bench-peer", "--heads", "3", "2"]])
def test_the_real_command_exits_2_with_one_line(argv):
    result = subprocess.run([sys.executable, "-m", "engine", *argv], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr


COMMANDS = ["generate", "bench", "bench-peer", "bench-prefix", "bench-alloc", "paged", "fork", "prefix"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_documents_the_limits(capsys, command):
    assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Limits:" in text and "exits with status 2" in text


def test_a_checkpoint_whose_head_dim_rope_cannot_rotate_is_refused_naming_file_and_field(tmp_path, capsys):
    write_tiny_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "head_dim": 15}))
    with pytest.raises(InputError, match=r"config\.json: head_dim = 15 is not supported: rotary position embeddings "
                                         r"rotate pairs of dimensions, so head_dim must be even") as info:
        load_model(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value)
    assert main(["generate", "--model", str(tmp_path), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'config.json'}: head_dim = 15") and err.count("\n") == 1
    # without head_dim it is hidden_size // num_attention_heads, and that must be even too
    (tmp_path / "config.json").write_text(json.dumps({**config, "head_dim": None, "hidden_size": 60}))
    with pytest.raises(InputError, match=r"head_dim = 15 is not supported: no head_dim is given, so it is "
                                         r"hidden_size 60 // num_attention_heads 4"):
        load_model(tmp_path)
    with pytest.raises(InputError, match="head_dim 15 is odd"):
        Qwen3Model(tiny_config(head_dim=15))
    assert tiny_config(head_dim=15).kv_bytes_per_token() > 0      # byte arithmetic takes any shape


# ---- the Python API: named errors, and no state changed by a refusal ----------------------------------

@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.bool])
def test_an_int8_cache_must_read_back_floats(dtype):
    with pytest.raises(InputError, match=f"must be a floating dtype such as torch.float32, got {dtype}"):
        QuantizedPagedKVCache(tiny_config(), num_blocks=4, block_size=4, dtype=dtype)


@pytest.mark.parametrize("field, value, message", [
    ("swap_space_tokens", -5, "swap_space_tokens must be an int >= 0, got -5"),
    ("swap_min_tokens", -1, "swap_min_tokens must be an int >= 0, got -1"),
    ("max_num_seqs", 0, "max_num_seqs must be an int >= 1, got 0"),
    ("max_num_seqs", 2.5, "max_num_seqs must be an int >= 1, got 2.5"),
    ("max_batched_tokens", 0, "max_batched_tokens must be an int >= 1, got 0"),
    ("margin_blocks", -1, "margin_blocks must be an int >= 0, got -1"),
    ("watermark", 1.0, r"watermark must be a fraction of the pool in \[0, 1\), got 1.0"),
    ("watermark", math.nan, r"watermark must be a fraction of the pool in \[0, 1\), got nan"),
    ("preemption", "sometimes", "preemption must be 'recompute', 'swap' or 'auto', got 'sometimes'"),
])
def test_scheduler_config_refuses_each_bad_field_by_name(field, value, message):
    with pytest.raises(InputError, match=f"SchedulerConfig: {message}"):
        SchedulerConfig(**{field: value})


@pytest.mark.parametrize("field, value, message", [
    ("seed", 2 ** 70, "seed must be an int from -2\\*\\*63 to 2\\*\\*64 - 1"),
    ("max_tokens", 2.5, "max_tokens must be an int >= 0, got 2.5"),
    ("temperature", math.inf, "temperature must be a finite number, got inf"),
    ("top_p", math.nan, "top_p must be a finite number, got nan"),
])
def test_sampling_params_refuse_each_bad_field_by_name(field, value, message):
    with pytest.raises(InputError, match=f"SamplingParams: {message}"):
        SamplingParams(**{field: value})


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def make_engine(model, blocks=16):
    return Engine(model, PagedKVCache(model.config, num_blocks=blocks, block_size=4, dtype=torch.float32))


def engine_state(engine):
    """Everything a refused call must leave as it was."""
    scheduler, cache = engine.scheduler, engine.cache
    return (sorted(engine.requests), len(engine.upcoming), len(scheduler.waiting), len(scheduler.running),
            len(scheduler.swapped), engine.now, len(engine.metrics.steps), cache.allocator.num_free,
            {seq: list(table) for seq, table in cache.tables.items()}, dict(cache.lengths))


GREEDY = SamplingParams(max_tokens=3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompt=torch.tensor([[1, 2], [3, 4]])), r"request 5: a tensor of token ids must be 1-D and of an integer "
                                                  r"dtype, got shape \(2, 2\)"),
    (dict(prompt=torch.tensor([1.0, 2.0])), "request 5: a tensor of token ids must be 1-D and of an integer dtype"),
    (dict(prompt="hello"), "request 5: give token ids, not text"),
    (dict(prompt=[]), "request 5: the prompt is empty"),
    (dict(prompt=[1, 2], n=0), "request 5: n \\(samples\\) must be an int >= 1, got 0"),
    (dict(prompt=[1, 2], seed=2 ** 70), "request 5: seed must be an int from -2\\*\\*63"),
    (dict(prompt=[1, 2], seed=2 ** 64 - 2, n=3), "request 5: seed must be an int from -2\\*\\*63 to 2\\*\\*64 - 3"),
    (dict(prompt=[1, 2], arrival=math.nan), "request 5: arrival must be a finite number of engine-clock seconds"),
    (dict(prompt=[1, 2], params="greedy"), "request 5: params must be a SamplingParams, got str"),
    (dict(prompt=[1, 999]), r"request 5: token 999 at position 1 is not an id in \[0, 260\)"),
    (dict(prompt=[1, 2], request_id=0), "request 0: this request_id is taken"),
    (dict(prompt=list(range(100))), "request 5 rejected: its prompt of 100 tokens needs 100 KV token slots"),
])
def test_add_request_refuses_by_name_and_changes_nothing(model, kwargs, message):
    engine = make_engine(model)
    engine.add_request([1, 2, 3], GREEDY, request_id=0)
    engine.step()
    before = engine_state(engine)
    kwargs = {"params": GREEDY, "request_id": 5, **kwargs}
    with pytest.raises(InputError, match=message):
        engine.add_request(**kwargs)
    assert engine_state(engine) == before


def test_a_prompt_may_be_a_1d_integer_tensor(model):
    engine = make_engine(model)
    as_list = engine.add_request([5, 6, 7, 8], GREEDY, seed=1)
    as_tensor = engine.add_request(torch.tensor([5, 6, 7, 8]), GREEDY, seed=1)
    engine.run(progress=False)
    assert as_tensor.prompt == [5, 6, 7, 8] and as_tensor.outputs == as_list.outputs and len(as_list.outputs[0]) == 3


def test_aborting_a_request_for_n_samples_before_its_prompt_ran_finishes_it(model):
    engine = make_engine(model)
    request = engine.add_request([1, 2, 3, 4, 5], GREEDY, n=3)
    engine.abort(request.request_id)
    assert request.finished and request.aborted and not engine.has_unfinished()
    assert engine.cache.allocator.num_free == 16
    assert engine.run(progress=False) == [request]                 # and the engine does not wait for it


def test_an_idle_step_returns_no_work_and_changes_nothing(model):
    engine = make_engine(model)
    before = engine_state(engine)
    assert engine.step() == [] and engine_state(engine) == before
    engine.generate([[1, 2, 3]], GREEDY)
    before = engine_state(engine)
    assert engine.step() == [] and engine_state(engine) == before


def cache_state(cache):
    return ({seq: list(table) for seq, table in cache.tables.items()}, dict(cache.lengths),
            cache.allocator.num_free)


def test_cached_step_checks_ids_before_reserving(model):
    cache = PagedKVCache(model.config, num_blocks=8, block_size=4, dtype=torch.float32)
    cache.create(0)
    cache.create(1)
    cached_step(model, cache, [0], [[1, 2, 3]])
    before = cache_state(cache)
    with pytest.raises(InputError, match=r"new_tokens\[1\] \(sequence 1\): token 260 at position 2 is not an id"):
        cached_step(model, cache, [0, 1], [[4], [5, 6, 260]])
    assert cache_state(cache) == before
    with pytest.raises(InputError, match="one row of new tokens per distinct sequence"):
        cached_step(model, cache, [0, 0], [[4], [5]])
    assert cache_state(cache) == before
    with pytest.raises(MemoryError):                               # the second does not fit: the first gives back
        cached_step(model, cache, [0, 1], [[4, 5, 6], list(range(40))])
    assert cache_state(cache) == before


# ---- the course commands --------------------------------------------------------------------------

@pytest.mark.parametrize("module, args, words", [
    ("engine.course.grading.grade", ["--jobs", "0"], "argument --jobs: 0 is not a whole number from 1 to 256"),
    ("engine.course.grading.grade", ["--timeout", "nan"], "argument --timeout: nan is not a finite number > 0"),
    ("engine.course.grading.grade", ["/no/such/folder"], "/no/such/folder is not a folder of notebooks"),
    ("engine.course.grading.autograde", ["--jobs", "-3", "."],
     "argument --jobs: -3 is not a whole number from 1 to 256"),
    ("engine.course.grading.autograde", ["--timeout", "0", "."], "argument --timeout: 0 is not a whole number >= 1"),
    ("engine.course.grading.autograde", ["--sandbox", "maybe", "."], "argument --sandbox: invalid choice: 'maybe'"),
    ("engine.course.authoring.edition", ["--chapters", "chapter2"], "no chapter 'chapter2' in solutions/"),
    ("engine.course.authoring.edition", ["--chapters", ""], "name the chapters to hand out"),
    ("engine.course.authoring.edition", ["--chapters", "ch02_typo_here"], "no chapter 'ch02_typo_here' in solutions/"),
    ("engine.course.grading.autograde", [""], "SUBMISSIONS is empty"),
    ("engine.course.grading.grade", [""], "DIR is empty"),
    ("engine.course.authoring.lint", ["/no/such/ch02_x.py"], "CHAPTER /no/such/ch02_x.py does not exist"),
    ("engine.course.authoring.release", ["README.md"], "CHAPTER README.md is not a chapter source"),
    ("engine.course.authoring.book", ["--pdf", "--instructor"], "--instructor does not apply to --pdf"),
    ("engine.course.authoring.release", ["--bogus"], "unrecognized arguments: --bogus"),
])
def test_a_course_command_refuses_a_bad_value_in_one_line(module, args, words, tmp_path):
    done = run_command(module, *args, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert words in done.stderr, done.stderr


def test_a_prompt_past_the_context_is_told_to_shrink_not_to_lower_max_tokens_to_0():
    from engine.generate import check_limits
    with pytest.raises(InputError, match=r"context of 4096 \(max_position_embeddings\); shorten the prompt$"):
        check_limits([[1] * 5000], 32, 4096)
    with pytest.raises(InputError, match="lower --max-tokens to at most 96$"):
        check_limits([[1] * 4000], 100, 4096)
