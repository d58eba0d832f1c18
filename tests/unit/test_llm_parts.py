"""The LLM brain's parts that need no endpoint: the conversation and the request body.

The brain's loop and the HTTP client are tested against a real HTTP server speaking the
chat-completions protocol in tests/integration/test_llm_brain.py.
"""

from __future__ import annotations

import orjson
import pytest

import agents.llm
from agents.llm.conversation import Conversation, normalise_calls
from agents.llm.endpoint import ChatEndpoint
from porter_mesh.errors import ConfigError


def test_every_exported_name_exists_and_is_documented() -> None:
    for name in agents.llm.__all__:
        value = getattr(agents.llm, name)
        if callable(value):
            assert value.__doc__, name


def test_the_pinned_head_survives_trimming() -> None:
    conversation = Conversation("system prompt")
    conversation.pin({"role": "user", "content": "Your goal:\nship it"})
    for i in range(20):
        conversation.add_user(f"message {i} " + "x" * 100)
    conversation.trim(max_chars=500)
    messages = conversation.messages
    assert messages[0] == {"role": "system", "content": "system prompt"}
    assert messages[1]["content"] == "Your goal:\nship it"
    assert messages[-1]["content"].startswith("message 19 ")
    assert len(messages) < 22
    conversation.set_system("a new team")
    assert conversation.messages[0]["content"] == "a new team"
    assert conversation.pinned == 2


def test_tool_calls_come_back_in_the_shape_the_api_expects() -> None:
    raw = [{"id": "a1", "function": {"name": "bash", "arguments": {"command": "ls"}}},
           {"function": {"name": "read_file"}}, "garbage"]
    calls = normalise_calls(raw, step=7)
    assert calls[0] == {"id": "a1", "type": "function", "function": {
        "name": "bash", "arguments": orjson.dumps({"command": "ls"}).decode()}}
    assert calls[1]["id"] == "call_7_1" and calls[1]["function"]["arguments"] == "{}"
    assert calls[2]["function"]["name"] == ""
    assert normalise_calls(None, step=1) == []


def test_the_request_body_carries_only_the_settings_given() -> None:
    endpoint = ChatEndpoint(url="http://127.0.0.1:9/v1", model="m", max_tokens=None)
    body = orjson.loads(endpoint.request_body([{"role": "user", "content": "hi"}], []))
    assert body == {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                    "tools": [], "tool_choice": "auto"}
    endpoint = ChatEndpoint(url="http://127.0.0.1:9/v1", model="m", max_tokens=5,
                            temperature=0.5)
    body = orjson.loads(endpoint.request_body([], []))
    assert (body["max_tokens"], body["temperature"]) == (5, 0.5)
    assert endpoint.url == "http://127.0.0.1:9/v1/chat/completions"


@pytest.mark.parametrize("model", ["", "  "])
def test_an_empty_model_name_is_refused(model: str) -> None:
    with pytest.raises(ConfigError, match="model name is empty"):
        ChatEndpoint(url="http://127.0.0.1:9/v1", model=model)
