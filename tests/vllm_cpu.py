"""vLLM 0.33 on a CPU-only machine: a tiny model, a real VllmConfig, the smallest Worker stand-in.

Shared by tests/test_vllm_plugin.py and scripts/bench_plugin.py. The code under test is vLLM's
own (``Worker.determine_available_memory``, ``startup_plan``'s fingerprint, load and gate); only
what needs a GPU is faked, because this machine has none:

* the model: ``write_tiny_model`` writes a two-layer Llama config and a word-level tokenizer, so
  ``EngineArgs(...).create_engine_config()`` builds a real ``VllmConfig`` offline, with dummy
  weights that are never loaded (no GPU to put them on, and no network for a real checkpoint);
* the device: ``pin_device`` makes the platform report an H100's name and total memory, which
  vLLM's fingerprint and the plugin's plan conditions read (the CPU platform has neither);
* the worker: ``make_worker`` builds ``object.__new__(Worker)`` with only the attributes the
  startup-plan path reads, because ``Worker.__init__``/``init_device`` need a CUDA device; the
  free-memory snapshot is a fixed number instead of a ``cudaMemGetInfo`` reading;
* the model runner: ``FakeRunner`` stands in for ``GPUModelRunner``, whose ``profile_run`` and
  ``load_model`` run the model on the GPU; it counts profile runs and sleeps for a simulated
  weight load.

Nothing here imports vLLM at module import time: the callers set ``VLLM_TARGET_DEVICE=cpu`` and
friends (``cpu_environ``) first and choose when the ~10 s import happens, so every function that
needs vLLM imports it itself.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

GIB = 2**30
DEVICE_NAME = "NVIDIA H100 80GB HBM3"
DEVICE_TOTAL = 80 * GIB
FREE = 70 * GIB
"""The worker's free-memory snapshot at start (vLLM's ``init_snapshot.free_memory``)."""
UTIL = 0.9
PLANNED_KV = 50 * GIB
"""The KV cache size the test and bench plans carry."""


def cpu_environ(cache_root: Path) -> dict[str, str]:
    """The environment vLLM must see before it is imported: CPU platform, no hub, a private
    cache."""
    return {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(cache_root)}


def write_tiny_model(directory: Path) -> None:
    """A model directory vLLM's config code accepts offline: 2 layers, hidden size 64, 128
    tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 128,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "float16",
    }
    (directory / "config.json").write_text(json.dumps(config))
    vocab = {"[UNK]": 0, **{f"t{i}": i for i in range(1, 128)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"})
    )
    (directory / "generation_config.json").write_text("{}")


def engine_config(model: Path) -> Any:
    """A real ``VllmConfig`` for the tiny model: eager (no cudagraphs on CPU), dummy weights."""
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=str(model), max_model_len=128, enforce_eager=True, load_format="dummy"
    ).create_engine_config()


def load_plugins_like_vllm() -> None:
    """What a vLLM worker does on start: ``vllm.plugins.load_general_plugins()``, afresh."""
    import vllm.plugins

    vllm.plugins.plugins_loaded = False
    vllm.plugins.load_general_plugins()


def pin_device(set_attr: Callable[[Any, str, Any], Any] = setattr) -> None:
    """Make ``current_platform`` report the H100 the plans are for (the CPU platform has no such
    facts).

    ``set_attr`` is ``setattr`` for a process that keeps the pins (the bench), or a pytest
    monkeypatch's ``setattr`` (with ``raising=False``) for one test."""
    from vllm.platforms import current_platform

    set_attr(current_platform, "get_device_name", lambda device_id=0: DEVICE_NAME)
    set_attr(current_platform, "get_device_total_memory", lambda device_id=0: DEVICE_TOTAL)


class FakeRunner:
    """The model runner's GPU work: counts profile runs, loads no weights but sleeps
    ``load_seconds``."""

    model_memory_usage = 1 * GIB

    def __init__(self, load_seconds: float = 0.0) -> None:
        self.profile_runs = 0
        self.load_seconds = load_seconds
        self.slept = 0.0
        """How long the last simulated weight load really took (the bench subtracts it)."""

    def profile_run(self, randomize_inputs: bool = False) -> None:
        self.profile_runs += 1

    def load_model(self, load_dummy_weights: bool = False) -> None:
        t0 = time.perf_counter()
        time.sleep(self.load_seconds)  # the simulated weight load
        self.slept = time.perf_counter() - t0


def make_worker(
    worker_class: type,
    config: Any,
    free: int = FREE,
    util: float = UTIL,
    kv: int | None = None,
    load_seconds: float = 0.0,
) -> Any:
    """A ``Worker`` without ``__init__`` (which needs CUDA): a deep copy of ``config`` and the
    fields vLLM reads."""
    config = copy.deepcopy(config)
    config.cache_config.gpu_memory_utilization = util
    config.cache_config.kv_cache_memory_bytes = kv
    worker = object.__new__(worker_class)
    worker.vllm_config = config
    worker.cache_config = config.cache_config
    worker.parallel_config = config.parallel_config
    worker.model_config = config.model_config
    worker.rank = 0
    worker.local_rank = 0
    worker.init_snapshot = SimpleNamespace(free_memory=free, total_memory=DEVICE_TOTAL)
    worker.requested_memory = int(DEVICE_TOTAL * util)
    worker.model_runner = FakeRunner(load_seconds)
    return worker


def conditions(util: float = UTIL) -> dict[str, Any]:
    """The plan conditions a signed plan records for this pinned device and utilisation."""
    return {
        "gpu_memory_utilization": util,
        "device_name": DEVICE_NAME,
        "device_total_memory": DEVICE_TOTAL,
    }
