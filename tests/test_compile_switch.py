"""``PLANCACHE_COMPILE_CACHE`` (issue 17 item 3): one strict parser for the plugin and doctor.

``1/0/true/false/yes/no/on/off`` in any case; any other value is one ERROR line naming the
variable and the guard stays **on** (a typo never runs an unverified cache). The plugin half
runs vLLM's real ``register()`` path in one subprocess (one vLLM import for every value): for
each value, is the compile-cache guard installed on vLLM 0.33's modules, and what was logged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plancache.cli.main import main
from plancache.settings import compile_cache_switch

SRC = str(Path(__file__).resolve().parent.parent / "src")
ON = ["1", "true", "TRUE", "True", "yes", "YES", "on", "On", " 1 ", "yes\n"]
OFF = ["0", "false", "FALSE", "no", "No", "off", "OFF"]
INVALID = ["", "2", "enabled", "y", "n", "tru", "1 1", "-1", "\x1b[31mon", "ON!", "disabled"]


@pytest.mark.parametrize("value", ON + OFF + INVALID)
def test_the_parser_knows_eight_words_and_keeps_the_guard_on_otherwise(value: str) -> None:
    on, problem = compile_cache_switch(value)
    if value in OFF:
        assert (on, problem) == (False, "")
    elif value in ON:
        assert (on, problem) == (True, "")
    else:
        assert (
            on is True and problem.startswith("PLANCACHE_COMPILE_CACHE=") and "stays on" in problem
        )
        assert "\n" not in problem and "\x1b" not in problem
    assert compile_cache_switch(None) == (False, "")


PROBE = r"""
import io, json, logging, os, sys
stream = io.StringIO()
handler = logging.StreamHandler(stream)
handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
logging.getLogger("vllm.plancache").addHandler(handler)
import plancache.vllm_plugin as plugin
from plancache.vllm_plugin import plugin_state
from plancache.vllm_plugin.compile_cache import guard as compile_guard
out = {}
for value in json.loads(sys.argv[1]):
    os.environ.pop("PLANCACHE_COMPILE_CACHE", None)
    if value is not None:
        os.environ["PLANCACHE_COMPILE_CACHE"] = value
    plugin_state.start_boot()  # a boot of its own: one ERROR line a boot
    stream.seek(0); stream.truncate()
    plugin.register()
    plugin.register()  # vLLM may call it more than once: still one ERROR line
    from vllm.compilation import decorators
    guarded = getattr(decorators._try_load_aot_compiled_fn, "__plancache__", False)
    out[repr(value)] = {"guarded": guarded, "log": stream.getvalue().splitlines()}
    compile_guard.uninstall()
print("SWITCH " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def registered() -> dict[str, dict[str, object]]:
    values: list[str | None] = [None, *ON, *OFF, *INVALID]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PLANCACHE_", "VLLM_ENABLE_STARTUP_PLAN"))
    }
    env.update(PYTHONPATH=SRC, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(values)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("SWITCH ")]
    assert lines, done.stderr[-3000:]
    return json.loads(lines[0][len("SWITCH ") :])


@pytest.mark.parametrize("value", [None, *ON, *OFF, *INVALID])
def test_register_installs_the_guard_for_every_on_word_and_every_unknown_value(
    registered: dict[str, dict[str, object]], value: str | None
) -> None:
    seen = registered[repr(value)]
    errors = [line for line in seen["log"] if line.startswith("ERROR")]
    if value is None or value in OFF:
        assert seen == {"guarded": False, "log": []}
    elif value in ON:
        assert seen == {"guarded": True, "log": []}
    else:
        assert seen["guarded"] is True
        assert (
            len(errors) == 1 and "PLANCACHE_COMPILE_CACHE=" in errors[0] and "stays on" in errors[0]
        ), seen


@pytest.mark.parametrize(
    ("value", "status"), [(None, "skip"), ("off", "skip"), ("Yes", "ok"), ("ture", "warn")]
)
def test_doctor_reads_the_switch_with_the_same_parser(
    value: str | None,
    status: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.delenv("PLANCACHE_COMPILE_CACHE", raising=False)
    if value is not None:
        monkeypatch.setenv("PLANCACHE_COMPILE_CACHE", value)
    main(["doctor", "--json"])
    (check,) = [
        c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "compile-cache"
    ]
    assert check["status"] == status and check["data"]["enabled"] is (value not in (None, "off")), (
        check
    )
    if status == "warn":
        assert "stays on" in check["detail"]
