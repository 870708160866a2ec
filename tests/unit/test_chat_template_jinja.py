"""Jinja chat templates (engine/chat_template.py): resolution of --chat-template, sandboxing,
errors at start, and raise_exception as a 400 at request time."""

from __future__ import annotations

import pytest

from inferctl.contract.errors import APIError
from inferctl.contract.openai import ChatMessage
from inferctl.engine.chat_template import (ChatTemplateError, JinjaChatTemplate, check_chat_template,
                                           render_chat_prompt, resolve_chat_template)

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
MSGS = [ChatMessage(role="developer", content="Be brief."), ChatMessage(role="user", content="Hi")]


def test_model_template_is_the_default_and_plain_without_one():
    tpl = resolve_chat_template(None, CHATML)
    assert isinstance(tpl, JinjaChatTemplate) and tpl.origin == "the model's metadata"
    assert render_chat_prompt(MSGS, tpl) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                                             "<|im_start|>assistant\n")
    assert resolve_chat_template(None, None) == "plain"
    assert resolve_chat_template("roles", CHATML) == "roles"


def test_flag_inline_or_file_overrides_the_model(tmp_path):
    inline = resolve_chat_template("{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}{{ eos_token }}",
                                   CHATML, bos_token="<s>", eos_token="</s>")
    assert render_chat_prompt(MSGS, inline) == "<s>[Be brief.][Hi]</s>"
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}\n{{ m.role }}:{{ m.content }}|\n  {% endfor %}", encoding="utf-8")
    # trim_blocks/lstrip_blocks as transformers: the block lines leave no whitespace behind
    assert render_chat_prompt(MSGS, resolve_chat_template(str(f), CHATML)) == "system:Be brief.|\nuser:Hi|\n"


def test_bad_templates_fail_at_start_naming_the_source(tmp_path):
    with pytest.raises(ChatTemplateError, match=r"--chat-template.*line 1"):
        resolve_chat_template("{% for m in messages %}{{ m.content }", None)
    with pytest.raises(ChatTemplateError, match="the model's metadata"):
        resolve_chat_template(None, "{{ messages[0].content | no_such_filter }}")
    with pytest.raises(ChatTemplateError, match="neither plain nor roles, a readable file, nor a Jinja template"):
        resolve_chat_template("chatml")
    with pytest.raises(ValueError, match="unknown chat template"):
        check_chat_template("chatml")


def test_sandbox_refuses_attribute_escapes():
    with pytest.raises(ChatTemplateError, match="unsafe|access"):
        resolve_chat_template("{{ messages.__class__.__mro__[1].__subclasses__() }}")


def test_raise_exception_is_a_400_naming_messages():
    tpl = resolve_chat_template("{% if messages[-1]['role'] != 'user' %}{{ raise_exception('last must be user') }}"
                                "{% endif %}{{ messages[-1]['content'] }}")
    assert render_chat_prompt(MSGS, tpl) == "Hi"
    with pytest.raises(APIError) as info:
        render_chat_prompt(MSGS + [ChatMessage(role="assistant", content="Hello")], tpl)
    assert info.value.status == 400 and info.value.param == "messages"
    assert "last must be user" in info.value.message
