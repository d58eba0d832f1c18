// Task cards: one per task context, its state path as a stepper, and the human's review.

import { el, fill, ago, shortContext } from "./dom.js";
import { post } from "./api.js";
import { openWaterfall } from "./waterfall.js";

// The mesh's one vocabulary of task states (docs/protocol.md, "Task states").
const STEPS = [
  ["submitted", "submitted"], ["working", "working"], ["in-review", "in review"],
  ["completed", "completed"],
];
const FAILED = new Set(["rejected", "cancelled", "failed"]);
const FINAL = new Set(["completed", "rejected", "cancelled", "failed"]);
const ME = "porter-ui";

/** Whether a name is one of the human's (the dashboard or a command-line seat). */
function isHuman(name) {
  return name === ME || String(name || "").startsWith(`${ME}-`);
}

/** Whether the task waits for the human: a verdict, or an answer to its holder's question. */
export function waitsForMe(task) {
  if (task.state === "input-required") return isHuman(task.offered_by);
  return Boolean(task.review && task.review.to === ME && task.state === "in-review");
}

/** The stepper's steps: [label, "done" | "current" | "todo" | "failed" | "changes"]. */
export function steps(task) {
  const path = Array.isArray(task.path) ? task.path.map((p) => p.state) : [];
  const state = task.state;
  let reached = Math.max(-1, ...path.map((s) => STEPS.findIndex(([key]) => key === s)));
  if (state === "changes-requested") reached = Math.max(reached, 2);
  if (state === "input-required") reached = Math.max(reached, 1);
  const current = STEPS.findIndex(([key]) => key === state);
  return STEPS.map(([key, label], i) => {
    let mark = i <= reached ? "done" : "todo";
    if (i === current) mark = state === "completed" ? "done" : "current";
    if (state === "input-required" && key === "working") mark = "changes";
    if (state === "changes-requested" && key === "in-review") mark = "changes";
    if (FAILED.has(state) && i === reached + 1) mark = "failed";
    return [label, mark];
  });
}

/** ``items`` reordered so that each sub-task follows its parent (depth first), keeping
 * the given order among siblings and among roots. */
export function asTree(items, parentOf) {
  const children = new Map();
  const roots = [];
  for (const item of items) {
    const parent = parentOf(item);
    if (parent === null) roots.push(item);
    else children.set(parent, [...(children.get(parent) || []), item]);
  }
  const out = [];
  const seen = new Set();
  const walk = (item) => {
    if (seen.has(item.context)) return;
    seen.add(item.context);
    out.push(item);
    for (const child of children.get(item.context) || []) walk(child);
  };
  roots.forEach(walk);
  for (const item of items) walk(item); // parents in a cycle: shown all the same
  return out;
}

export class Tasks {
  constructor(root, { onContext, onMessage, onCount, status }) {
    this.root = root;
    this.list = root.querySelector(".task-cards");
    this.onContext = onContext;
    this.onMessage = onMessage;
    this.onCount = onCount;
    this.status = status;
    this.tasks = new Map(); // context -> task
    this.drafts = new Map(); // context -> reason being typed
    this.cards = new Map(); // context -> element
    this.frame = 0;
    this.dirty = new Set();
  }

  replace(tasks) {
    this.tasks.clear();
    this.cards.clear();
    this.list.replaceChildren();
    this.upsert(tasks);
  }

  upsert(tasks) {
    for (const task of tasks) {
      if (!task || !task.context) continue;
      this.tasks.set(task.context, task);
      this.dirty.add(task.context);
    }
    if (!this.frame) this.frame = requestAnimationFrame(() => this.render());
  }

  render() {
    this.frame = 0;
    const sorted = [...this.tasks.values()].sort((a, b) =>
      (waitsForMe(b) - waitsForMe(a)) || (Number(b.updated) || 0) - (Number(a.updated) || 0));
    const ordered = asTree(sorted, (t) => (t.parent && this.tasks.has(t.parent) ? t.parent : null));
    for (const context of this.dirty) {
      const old = this.cards.get(context);
      const card = this.card(this.tasks.get(context));
      if (old) old.replaceWith(card);
      this.cards.set(context, card);
    }
    this.dirty.clear();
    // Order the cards without rebuilding them (a reason being typed keeps its focus).
    let previous = null;
    for (const task of ordered) {
      const card = this.cards.get(task.context);
      const next = previous ? previous.nextElementSibling : this.list.firstElementChild;
      if (next !== card) this.list.insertBefore(card, next);
      previous = card;
    }
    if (ordered.length === 0 && !this.list.querySelector(".empty")) {
      fill(this.list, el("p", { class: "empty" },
        "no tasks yet: an Offer (from an architect, or from Compose) starts one"));
    } else if (ordered.length) {
      const empty = this.list.querySelector(".empty");
      if (empty) empty.remove();
    }
    this.onCount(ordered.length, ordered.filter(waitsForMe).length);
  }

  card(task) {
    const context = String(task.context);
    const mine = waitsForMe(task);
    const cls = `task${mine ? " waiting" : ""}${task.parent && this.tasks.has(task.parent) ? " sub" : ""}`;
    return el("article", { class: cls, "data-testid": "task-card",
      dataset: { context, state: task.state } },
    el("header", null,
      el("span", { class: "title", title: task.title || "" }, task.title || "(untitled task)"),
      el("span", { class: "task-state", "data-state": task.state }, task.state)),
    el("ol", { class: "stepper" }, steps(task).map(([label, mark]) =>
      el("li", { "data-mark": mark }, el("span", { class: "label" }, label)))),
    el("div", { class: "meta" },
      el("button", { type: "button", class: "ctx", title: `show only ${context} in the timeline`,
        onclick: () => this.onContext(context) }, shortContext(context)),
      task.parent ? el("span", { class: "parent", "data-testid": "task-parent" }, "part of ",
        el("button", { type: "button", class: "ctx", title: `show only ${task.parent}`,
          onclick: () => this.onContext(task.parent) }, shortContext(task.parent))) : null,
      el("span", null, "holder ", el("b", null, task.holder || "none")),
      el("span", null, "attempt ", el("b", null, String(task.attempt ?? 0))),
      task.offered_by ? el("span", null, "by ", el("b", null, task.offered_by)) : null,
      el("span", { class: "updated", title: new Date((task.updated || 0) * 1000).toISOString() },
        task.updated ? ago(Date.now() / 1000 - task.updated) : "")),
    mine && task.state === "in-review" ? this.reviewBox(task) : null,
    mine && task.state === "input-required" ? this.answerBox(task) : null,
    el("footer", null,
      el("button", { type: "button", class: "link small", "data-testid": "task-trace",
        title: "the task's spans across the agents, as a waterfall",
        onclick: () => openWaterfall(context, task.title) }, "Trace"),
      task.holder ? el("button", { type: "button", class: "link small",
        onclick: () => this.onMessage(task) }, `Message ${task.holder}`) : null,
      FINAL.has(task.state) ? null : this.cancelButton(task)));
  }

  /** Cancel the task (its holder stops and cancels its sub-tasks). */
  cancelButton(task) {
    const context = task.context;
    const button = el("button", { type: "button", class: "link small danger",
      "data-testid": "task-cancel", title: "stop this task and every sub-task it delegated",
      onclick: async () => {
        if (!window.confirm(`Cancel "${task.title || context}" and its sub-tasks?`)) return;
        button.disabled = true;
        try {
          const answer = await post("/api/cancel", { context });
          this.status(`cancel sent to ${answer.to}: ${task.title || context}`);
        } catch (err) {
          button.disabled = false;
          this.status(`not cancelled: ${err.reason}`);
        }
      } }, "Cancel");
    return button;
  }

  /** The holder's question and a box to answer it (a Note to the holder in the task). */
  answerBox(task) {
    const context = task.context;
    const text = el("input", { type: "text", class: "reason", "data-testid": "answer-text",
      placeholder: "your answer", value: this.drafts.get(context) || "",
      "aria-label": `answer to ${task.holder}`,
      oninput: () => this.drafts.set(context, text.value) });
    const note = el("p", { class: "review-status", role: "status" });
    const send = async () => {
      const answer = text.value.trim();
      if (!answer) {
        note.textContent = "write an answer first";
        note.classList.add("error");
        text.focus();
        return;
      }
      send.button.disabled = true;
      note.classList.remove("error");
      note.textContent = "sending\u2026";
      try {
        await post("/api/send", { channel: `task:${task.holder}`, text: answer, type: "Note",
          context });
        this.drafts.delete(context);
        note.textContent = `answered; ${task.holder} goes on`;
        this.status(`answered: ${task.title || context}`);
      } catch (err) {
        note.textContent = `not sent: ${err.reason}`;
        note.classList.add("error");
        send.button.disabled = false;
      }
    };
    send.button = el("button", { type: "button", class: "approve", "data-testid": "answer-send",
      onclick: send }, "Answer");
    return el("div", { class: "review" },
      el("p", { class: "ask" }, el("b", null, task.holder || "?"), " asks you: ",
        el("span", { class: "question", "data-testid": "task-question" }, task.question || "")),
      el("div", { class: "decide" }, text, send.button),
      note);
  }

  reviewBox(task) {
    const context = task.context;
    const review = task.review;
    const reason = el("input", { type: "text", class: "reason", "data-testid": "review-reason",
      placeholder: "what should change (needed to send it back)",
      value: this.drafts.get(context) || "", "aria-label": "reason for sending it back",
      oninput: () => this.drafts.set(context, reason.value) });
    const note = el("p", { class: "review-status", role: "status" });
    const decide = async (decision) => {
      const body = { context, decision };
      if (decision === "reject") {
        const why = reason.value.trim();
        if (!why) {
          note.textContent = "say what should change before sending it back";
          note.classList.add("error");
          reason.focus();
          return;
        }
        body.reason = why;
      }
      for (const b of box.querySelectorAll("button")) b.disabled = true;
      note.classList.remove("error");
      note.textContent = decision === "approve" ? "approving\u2026" : "sending back\u2026";
      try {
        await post("/api/review", body);
        this.drafts.delete(context);
        note.textContent = decision === "approve" ? `approved; ${review.from} is told`
          : `sent back to ${review.from}`;
        this.status(`${decision === "approve" ? "approved" : "sent back"}: ${task.title || context}`);
      } catch (err) {
        note.textContent = `not sent: ${err.reason}`;
        note.classList.add("error");
        for (const b of box.querySelectorAll("button")) b.disabled = false;
      }
    };
    const box = el("div", { class: "review" },
      el("p", { class: "ask" }, el("b", null, review.from || "?"), " asks you to review: ",
        el("span", { class: "review-summary" }, review.summary || "")),
      el("div", { class: "decide" },
        el("button", { type: "button", class: "approve", "data-testid": "review-approve",
          onclick: () => decide("approve") }, "Approve"),
        reason,
        el("button", { type: "button", class: "reject", "data-testid": "review-reject",
          onclick: () => decide("reject") }, "Send back")),
      note);
    return box;
  }
}
