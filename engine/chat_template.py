"""Chat templates: a conversation (:class:`~inferctl.contract.openai.ChatMessage` list) → one
prompt string.

The tiny story models (stories260K, the demo model) were trained on plain text with no
roles, so the ``"plain"`` template renders a conversation as the text of its messages in
order (system, user, assistant alike), joined with a newline, with no role markers; a single
user message ``"Once upon a time"`` becomes exactly the prompt ``"Once upon a time"``, so chat
and completions agree for greedy decoding. The ``"roles"`` template (``"System: …\\nUser: …
\\nAssistant:"``) is available for models that know turns; the server takes the template name
as configuration.
"""

from __future__ import annotations

from inferctl.contract.openai import ChatMessage

#: The template names ``render_chat_prompt`` knows (``--chat-template``).
CHAT_TEMPLATES = ("plain", "roles")

_ROLE_NAMES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}


def render_chat_prompt(messages: list[ChatMessage], template: str = "plain") -> str:
    """Render chat messages into one prompt string.

    ``"plain"`` (default, for the plain-text story models): the non-empty message texts in
    order joined by ``"\\n"``, no role markers. ``"roles"``: ``"System: …\\nUser: …\\n
    Assistant: …\\nAssistant:"`` — each message on its own line prefixed by its role, ending
    with an open assistant turn. Raises ValueError for an unknown template name.
    """
    if template == "plain":
        return "\n".join(m.text() for m in messages if m.text() != "")
    if template == "roles":
        lines = [f"{_ROLE_NAMES[m.role]}: {m.text()}" for m in messages]
        return "\n".join(lines + ["Assistant:"])
    raise ValueError(f"unknown chat template {template!r}; known: {', '.join(CHAT_TEMPLATES)}")
