"""One boot of vLLM's real engine through ``LLM()``, in its own interpreter (the engine venv's).

Run as ``python tests/engine_boot.py MODEL_DIR OUT.json``. Builds ``LLM(...)`` for the tiny model
of tests/engine_model.py with the settings every engine test and the benchmark share
(:data:`ENGINE_ARGS`, mirrored by tests/engine_harness.py's ``vllm serve`` flags), generates
greedily for :data:`PROMPTS`, and writes the token ids and the constructor's wall time to
OUT.json. Greedy decoding with ``ignore_eos`` gives the same ids on every boot and through the
server, so boots can be compared by their ids alone.

vLLM's CPU platform starts its engine processes with ``spawn``: the work must sit under
``if __name__ == "__main__":``.
"""

import json
import sys
import time

ENGINE_ARGS = {
    "dtype": "bfloat16",
    "max_model_len": 256,
    "max_num_seqs": 4,
    "max_num_batched_tokens": 256,
    "kv_cache_memory_bytes": 64 * 1024 * 1024,  # else the CPU worker reserves 0.9 of the host's RAM
    "seed": 0,
}
PROMPTS = ["A serving node pulls", "Every byte from a store"]
MAX_TOKENS = 16
PRELOAD = (
    "vllm",
    "vllm.entrypoints.llm",
    "vllm.engine.arg_utils",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.engine.core_client",
    "vllm.sampling_params",
)
"""What :func:`main` imports before ``LLM()`` starts the engine (12 s of CPU here): the engine
tests' zygote imports it once and forks each boot's front process (tests/engine_harness.py)."""


def main(model: str, out: str) -> None:
    from vllm import LLM, SamplingParams

    started = time.monotonic()
    llm = LLM(model=model, **ENGINE_ARGS)
    constructor_s = time.monotonic() - started
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    report = {
        "constructor_s": constructor_s,
        "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
    }
    with open(out, "w") as f:
        json.dump(report, f)
    print("ENGINE_BOOT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
