"""Untrusted chat templates under budgets: every hang, blow-up and crash below (huge powers and
repeats, runaway loops and recursion, deep nesting) ends quickly in a ChatTemplateError naming
where the template came from, real templates render exactly as Jinja2's sandbox renders them
in-process, and fuzzed sources either render or fail cleanly."""
from __future__ import annotations

import threading
import time

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from exactedit.quant.model.chat_template import ChatTemplate, ChatTemplateError, TemplateBudget

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there é"},
        {"role": "assistant", "content": " Hello! How can I help? "}, {"role": "user", "content": "Tell me."}]
SMALL = TemplateBudget(seconds=1.0, memory_bytes=1 << 28, output_chars=1 << 20)
GUARD_S = 30.0     # the test's own limit: the budget plus starting a process on a loaded machine

CHATML_TPL = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
              "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SMOLLM2_TPL = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
               "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
               "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
               "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
               "{% endif %}")
GEMMA2_TPL = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
              "supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
              "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
              "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}"
              "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
              "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
              "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")
QWEN25_TPL = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
TOOLS = [{"type": "function", "function": {"name": "get_time", "description": "now", "parameters": {}}}]


def _reference(source: str, messages, **variables) -> str:
    """Jinja2's sandbox in this process, configured as chat templates were rendered before budgets."""
    import json

    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, indent=indent, ensure_ascii=False)
    return env.from_string(source).render(messages=messages, **variables)


def _within(seconds: float, fn):
    """fn()'s result or exception, failing the test when it has not ended after `seconds`."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"], time.monotonic() - t0


def _fails(source: str, match: str, messages=MSGS, budget: TemplateBudget = SMALL) -> ChatTemplateError:
    """The template fails (at compile or render) within the guard, with `match` in its message."""
    def go():
        with ChatTemplate(source, where="evil.gguf", budget=budget) as t:
            return t.render(messages)
    with pytest.raises(ChatTemplateError, match=match) as e:
        _within(GUARD_S, go)
    assert str(e.value).startswith("evil.gguf: tokenizer.chat_template: "), str(e.value)
    return e.value


@pytest.mark.parametrize("name,source,variables", [
    ("chatml", CHATML_TPL, {}),
    ("smollm2", SMOLLM2_TPL, {}),
    ("qwen2.5", QWEN25_TPL, {}),
    ("qwen2.5-tools", QWEN25_TPL, {"tools": TOOLS}),
    ("gemma2", GEMMA2_TPL, {}),
])
def test_real_templates_render_as_the_sandbox_does_in_process(name, source, variables):
    msgs = MSGS[1:] if name == "gemma2" else MSGS
    with ChatTemplate(source, bos_token="<bos>", eos_token="<eos>") as t:
        for gen in (False, True):
            want = _reference(source, msgs, add_generation_prompt=gen, bos_token="<bos>", eos_token="<eos>", **variables)
            assert t.render(msgs, add_generation_prompt=gen, **variables) == want
        assert t.render_many([msgs, msgs[:1]], add_generation_prompt=True, **variables) == \
            [t.render(msgs, add_generation_prompt=True, **variables), t.render(msgs[:1], add_generation_prompt=True,
                                                                                **variables)]


def test_constant_folding_of_a_huge_power_ends_quickly():
    # Jinja2 folds constants while compiling: this hung before any engine loaded
    _fails("{{ 9**(9**10) }}", "over its budget .*integer limit")
    _fails("{{ 10**(10**3) * 10**(10**5) }}", "over its budget")


def test_nested_loops_and_recursive_macros_are_stopped_by_the_time_budget():
    _fails("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
           r"over its time budget \(1 s\) while rendering: stopped")
    _fails("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
           "over its time budget")
    _fails("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "failed while rendering .RecursionError")


def test_memory_blow_ups_are_clean_errors():
    _fails("{{ 'a' * 10**9 }}", "over its budget while rendering: repeating a str")
    _fails("{{ [1, 2] * 10**9 }}", "repeating a list")
    _fails("{{ 'a'.ljust(10**9) }}", r"over its memory budget \(256 MiB\) while rendering")
    _fails("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
           "{{ ns.s | length }}", "over its memory budget")
    _fails("{% for i in range(2000) %}{{ 'x' * 1000 }}{% endfor %}", r"rendered 2000000 chars, over the output limit")


def test_deeply_nested_templates_fail_to_compile_cleanly():
    e = _fails("{% if messages %}" * 120 + "x" + "{% endif %}" * 120, "cannot be compiled")
    assert "IndentationError" in str(e) or "RecursionError" in str(e) or "SyntaxError" in str(e)
    _fails("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "cannot be compiled .RecursionError")


def test_source_size_and_budget_values_are_checked():
    with pytest.raises(ChatTemplateError, match="over the source limit"):
        ChatTemplate("x" * 101, budget=TemplateBudget(source_chars=100))
    with pytest.raises(ChatTemplateError, match="seconds: expected a positive number"):
        TemplateBudget(seconds=0)
    with pytest.raises(ChatTemplateError, match="extra variables must be JSON"):
        ChatTemplate(CHATML_TPL).render(MSGS, tools=object())


def test_a_stopped_template_renders_again_and_a_batch_names_the_failing_conversation():
    source = ("{% if messages[0]['content'] == 'hang' %}{% for i in range(100000) %}{% for j in range(100000) %}"
              "{% endfor %}{% endfor %}{% endif %}{% if messages[0]['content'] == 'raise' %}"
              "{{ raise_exception('no') }}{% endif %}ok")
    with ChatTemplate(source, budget=SMALL) as t:
        with pytest.raises(ChatTemplateError, match="time budget"):
            _within(GUARD_S, lambda: t.render([{"role": "user", "content": "hang"}]))
        assert t.render(MSGS) == "ok"
        with pytest.raises(ChatTemplateError, match=r"the template raised: no \(conversation 2 of the batch\)"):
            t.render_many([MSGS, MSGS, [{"role": "user", "content": "raise"}]])
        proc = t._sandbox.proc
    assert proc.poll() is not None      # close() ended the process


FRAGMENTS = [
    "{% for m in messages %}", "{% endfor %}", "{% if add_generation_prompt %}", "{% if m %}", "{% else %}",
    "{% endif %}", "{{ m['content'] }}", "{{ m.role }}", "{{ messages | tojson }}", "{{ bos_token }}", "text\n",
    "{{ 9**(9**10) }}", "{{ 'a' * 10**9 }}", "{{ 2**64 * 2**64 }}", "{% for i in range(100000) %}",
    "{% macro f(n) %}{{ f(n) }}{% endmacro %}", "{{ f(1) }}", "{{ ''.__class__.__mro__ }}", "{{ 1/0 }}",
    "{{ raise_exception('x') }}", "{{ undefined_name.attr }}", "{% set ns = namespace(s='ab') %}",
    "{% set ns.s = ns.s ~ ns.s %}", "{{ ns.s | length }}", "{% break %}", "{{ (", ")) }}", "{{ '%s' % 3 }}",
    "{{ 'x'.ljust(10**8) }}", "{{ '\\ud800' }}", "{% raw %}", "{% endraw %}", "{#", "#}", "{{ messages[9] }}",
    "{% set x = messages.append(1) %}", "{{ cycler.__init__.__globals__ }}", "{{ range(10**9) | list }}",
]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=8))
@example(["{% for m in messages %}", "{{ m['content'] }}", "{% endfor %}"])
@example(["{% for i in range(100000) %}", "{% for i in range(100000) %}", "{% endfor %}", "{% endfor %}"])
@example(["{{ '\\ud800' }}"])
def test_fuzzed_templates_render_or_fail_cleanly(parts):
    source = "".join(parts)

    def go():
        try:
            with ChatTemplate(source, where="fuzz.gguf", budget=SMALL) as t:
                return t.render(MSGS, add_generation_prompt=True)
        except ChatTemplateError as exc:
            return exc
    out, _ = _within(GUARD_S, go)
    assert isinstance(out, (str, ChatTemplateError)), repr(out)
    if isinstance(out, ChatTemplateError):
        assert str(out).startswith("fuzz.gguf: ")
