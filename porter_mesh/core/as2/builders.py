"""Builders: one function per activity type of the profile, writing its fields in the
profile's order (``document``, ``offer``, ``remember``...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from porter_mesh.core.as2.model import (
    Activity,
    ASObject,
)
from porter_mesh.errors import ActivityError


def document(url: str, summary: str | None = None) -> ASObject:
    """A workspace file: ``{"type": "Document", "url": url[, "summary": ...]}``.

    Raises:
        ActivityError: ``url`` or ``summary`` is not a string.
    """
    return ASObject("Document", url=url, summary=summary)


def collection(items: Iterable[ASObject | str], *, summary: str | None = None) -> ASObject:
    """A set of objects (usually documents): ``{"type": "Collection", "items": [...]}``.

    Raises:
        ActivityError: an item is neither an object nor a string.
    """
    return ASObject("Collection", summary=summary, items=items)


def note_object(
    content: str,
    *,
    about: str | None = None,
    name: str | None = None,
    summary: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> ASObject:
    """Free text: ``{"type": "Note"[, "about": ...], "content": content}``.

    Raises:
        ActivityError: a value is not a string.
    """
    return ASObject("Note", name=name, about=about, content=content, summary=summary, extra=extra)


#: What ``object=`` of a builder takes: an object, a reference, or a JSON mapping.
ObjectArg = ASObject | str | Mapping[str, Any] | None


def _text_object(kind: str, text: str | None, obj: ObjectArg) -> ObjectArg:
    """``object`` of a text builder: ``obj`` as given, or a Note made from ``text``."""
    if text is None:
        return obj
    if obj is not None:
        what = "reason" if kind == "Reject" else "content"
        raise ActivityError(
            f"give either {what} or object=, not both",
            field="object",
            expected=f"{what} or object",
            reason="bad-field",
        )
    return {"type": "Note", "content": text}


class TextBuilder(Protocol):
    """The signature of :func:`offer`, :func:`announce` and :func:`question`."""

    def __call__(
        self,
        actor: str,
        summary: str,
        content: str | None = None,
        *,
        target: str | None = None,
        context: str | None = None,
        object: ObjectArg = None,
        tag: Sequence[str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Activity: ...


class ArtifactBuilder(Protocol):
    """The signature of :func:`create`, :func:`update` and :func:`delete`."""

    def __call__(
        self,
        actor: str,
        summary: str,
        object: ObjectArg = None,
        *,
        context: str | None = None,
        target: str | None = None,
        instrument: str | Sequence[str] | None = None,
        tag: Sequence[str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Activity: ...


def _named(function: Callable[..., Activity], kind: str, doc: str) -> None:
    function.__name__ = function.__qualname__ = kind.lower()
    function.__doc__ = doc


def _text_builder(kind: str, doc: str) -> TextBuilder:
    """A builder of ``kind`` whose ``content`` becomes a Note ``object``."""

    def build(
        actor: str,
        summary: str,
        content: str | None = None,
        *,
        target: str | None = None,
        context: str | None = None,
        object: ObjectArg = None,
        tag: Sequence[str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Activity:
        return Activity(kind, actor, summary, context=context,
                        object=_text_object(kind, content, object), target=target, tag=tag,
                        extra=extra)

    _named(build, kind, doc + """

    Raises:
        ActivityError: a value breaks the profile, or both ``content`` and ``object``.
    """)
    return build


def _artifact_builder(kind: str, doc: str) -> ArtifactBuilder:
    """A builder of ``kind`` about an artifact (``object`` usually a Document)."""

    def build(
        actor: str,
        summary: str,
        object: ObjectArg = None,
        *,
        context: str | None = None,
        target: str | None = None,
        instrument: str | Sequence[str] | None = None,
        tag: Sequence[str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> Activity:
        return Activity(kind, actor, summary, context=context, object=object, target=target,
                        instrument=instrument, tag=tag, extra=extra)

    _named(build, kind, doc + """

    Raises:
        ActivityError: a value breaks the profile.
    """)
    return build


offer = _text_builder(
    "Offer", "Assign a task (or request a review): ``content`` becomes a Note ``object``.")
announce = _text_builder(
    "Announce", "Broadcast status or findings: ``content`` becomes a Note ``object``.")
question = _text_builder(
    "Question", "Ask for input or clarification: ``content`` becomes a Note ``object``.")

create = _artifact_builder(
    "Create", "Produce a new artifact (``object`` is usually a Document or a Collection).")
update = _artifact_builder("Update", "Modify an existing artifact.")
delete = _artifact_builder("Delete", "Remove an artifact.")


def accept(
    actor: str,
    summary: str,
    *,
    context: str | None = None,
    object: ObjectArg = None,
    target: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Activity:
    """Acknowledge a task or approve a review.

    Raises:
        ActivityError: a value breaks the profile.
    """
    return Activity(
        "Accept", actor, summary, context=context, object=object, target=target, extra=extra
    )


def reject(
    actor: str,
    summary: str,
    reason: str | None = None,
    *,
    context: str | None = None,
    object: ObjectArg = None,
    target: str | None = None,
    tag: Sequence[str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Activity:
    """Decline a task or request changes: ``reason`` becomes a Note ``object``.

    Raises:
        ActivityError: a value breaks the profile, or both ``reason`` and ``object``.
    """
    return Activity("Reject", actor, summary, context=context,
                    object=_text_object("Reject", reason, object), target=target, tag=tag,
                    extra=extra)


def invoke(
    actor: str,
    summary: str,
    command: str,
    output: str | None,
    *,
    context: str | None = None,
    instrument: str | Sequence[str] | None = ("bash",),
    extra: Mapping[str, Any] | None = None,
) -> Activity:
    """Record a command execution: ``command`` and ``output`` become Note objects.

    Args:
        actor: the agent that ran the command.
        summary: one-line description.
        command: the command line (``object.content``).
        output: what it printed (``result.content``); ``None`` leaves ``result`` out.
        context: the task id.
        instrument: the tool used, ``["bash"]`` by default.
        extra: further fields.

    Raises:
        ActivityError: a value breaks the profile.
    """
    return Activity(
        "Invoke",
        actor,
        summary,
        context=context,
        object={"type": "Note", "content": command},
        result=None if output is None else {"type": "Note", "content": output},
        instrument=instrument,
        extra=extra,
    )


def remember(
    actor: str,
    summary: str,
    about: str,
    finding: str,
    *,
    context: str | None = None,
    severity: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Activity:
    """Store an observation: ``{"type": "Note", "about": about, "content": finding}``.

    Args:
        actor: the discovering agent.
        summary: one-line description.
        about: what the finding is about (a URN such as ``urn:porter:file:app.py``).
        finding: the observation itself.
        context: the task id.
        severity: optional severity label, stored as the object's ``severity`` field.
        extra: further top-level fields.

    Raises:
        ActivityError: a value breaks the profile.
    """
    obj: dict[str, Any] = {"type": "Note", "about": about, "content": finding}
    if severity is not None:
        obj["severity"] = severity
    return Activity("Remember", actor, summary, context=context, object=obj, extra=extra)


def recall(
    actor: str,
    summary: str,
    sparql: str,
    *,
    result_items: Iterable[Mapping[str, Any]] | None = None,
    context: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Activity:
    """Query the knowledge graph: the query is a Note ``object``; rows form the ``result``.

    Args:
        actor: the asking agent.
        summary: one-line description.
        sparql: a read-only SPARQL query.
        result_items: binding rows (variable name -> value) for the answer; ``None``
            leaves ``result`` out (a question, not yet an answer).
        context: the task id.
        extra: further fields.

    Raises:
        ActivityError: a value breaks the profile.
    """
    result = None
    if result_items is not None:
        result = {"type": "Collection", "items": list(result_items)}
    return Activity(
        "Recall",
        actor,
        summary,
        context=context,
        object={"type": "Note", "content": sparql},
        result=result,
        extra=extra,
    )


def note(
    actor: str,
    summary: str,
    content: str,
    *,
    context: str | None = None,
    target: str | None = None,
    object: ObjectArg = None,
    tag: Sequence[str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Activity:
    """A top-level Note, e.g. a review comment: ``content`` is the text.

    Raises:
        ActivityError: a value breaks the profile.
    """
    return Activity(
        "Note",
        actor,
        summary,
        content=content,
        context=context,
        object=object,
        target=target,
        tag=tag,
        extra=extra,
    )


def fallback_note(text: str) -> Activity:
    """The profile's plain-text fallback, ``{"type": "Note", "content": text}``.

    Raises:
        ActivityError: ``text`` is not a string or is too large.
    """
    return Activity.fallback(text)
