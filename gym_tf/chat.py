"""Chat messages as OpenAI requests carry them: their text, and a conversation as a problem to learn from.

One reading of a request everywhere: serve selects library items for `request_text(messages)`, and optimize, when a
problem is a recorded conversation, selects for the same text and sends the same messages.

>>> chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "6 x 7?"},
...         {"role": "assistant", "content": "42"}, {"role": "user", "content": "And times 2?"}]
>>> request_text(chat)
'And times 2?'
>>> print(conversation_text(chat))
User: 6 x 7?
<BLANKLINE>
Assistant: 42
<BLANKLINE>
User: And times 2?
"""

from __future__ import annotations

from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def message_text(content: Any) -> str:
    """A message's text: the string, or the text parts of a list of content parts joined by spaces."""
    if isinstance(content, list):
        return " ".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


def request_text(messages: Any) -> str:
    """What a chat request asks: its last user message's text ("" when there is none)."""
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            return message_text(message.get("content"))
    return ""


def conversation_text(messages: list[dict[str, Any]]) -> str:
    """A conversation as a problem's text: the user's message alone when it is the only turn, else every user,
    assistant and tool turn with text, after its role, so that a follow-up ("And times 2?") keeps what it follows.
    System messages stay out: they are the app's instructions, sent with the conversation but not the problem."""
    turns = [(m["role"], text) for m in messages
             if m.get("role") in ("user", "assistant", "tool") and (text := message_text(m.get("content")).strip())]
    if len(turns) == 1:
        return turns[0][1]
    return "\n\n".join(f"{role.capitalize()}: {text}" for role, text in turns)


def conversation_error(value: Any) -> str | None:
    """Why `value` is not a conversation to answer (a non-empty list of chat messages that ends with the user's turn
    or a tool's result, with a user message that has text), or None when it is one."""
    if not isinstance(value, list) or not value:
        return "must be a non-empty list of chat messages"
    for n, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            return f"message {n} must be an object whose role is one of {', '.join(ROLES)}"
        content = message.get("content")
        if not (content is None or isinstance(content, str)
                or (isinstance(content, list) and all(isinstance(p, dict) for p in content))):
            return f"message {n}: content must be a string, a list of content parts, or null"
    if value[-1]["role"] not in ("user", "tool"):
        return "must end with the user's turn or a tool's result (the request to answer)"
    if not request_text(value).strip():
        return "has no user message with text"
    return None


def without_nulls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of the messages without the fields that are null (a Parquet or `datasets` column fills every field a
    message lacks with null; strict servers refuse `"name": null`), keeping an assistant's null content."""
    return [{k: v for k, v in m.items() if v is not None or k == "content"} for m in messages]
