// Task cards: one per task context, its state path as a stepper, and the human's review.

import { el, fill, ago, shortContext } from "./dom.js";
import { post } from "./api.js";

const STEPS = [
  ["offered", "offered"], ["accepted", "accepted"], ["in-review", "in review"], ["done", "done"],
];
const FAILED = new Set(["rejected", "withdrawn"]);
const ME = "porter-ui";


/** Whether the task waits for the human's verdict. */
export function waitsForMe(task) {
  return Boolean(task.review && task.review.to === ME && task.state === "in-review");
}

/** The stepper's steps: [label, "done" | "current" | "todo" | "failed" | "changes"]. */
export function steps(task) {
  const path = Array.isArray(task.path) ? task.path.map((p) => p.state) : [];
  const state = task.state;
  let reached = Math.max(-1, ...path.map((s) => STEPS.findIndex(([key]) => key === s)));
  if (state === "changes-requested") reached = Math.max(reached, 2);
  const current = STEPS.findIndex(([key]) => key === state);
  return STEPS.map(([key, label], i) => {
    let mark = i <= reached ? "done" : "todo";
    if (i === current) mark = state === "done" ? "done" : "current";
    if (state === "changes-requested" && key === "in-review") mark = "changes";
    if (FAILED.has(state) && i === reached + 1) mark = "failed";
    return [label, mark];
  });
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
    const ordered = [...this.tasks.values()].sort((a, b) =>
      (waitsForMe(b) - waitsForMe(a)) || (Number(b.updated) || 0) - (Number(a.updated) || 0));
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
    return el("article", { class: mine ? "task waiting" : "task", "data-testid": "task-card",
      dataset: { context, state: task.state } },
    el("header", null,
      el("span", { class: "title", title: task.title || "" }, task.title || "(untitled task)"),
      el("span", { class: "task-state", "data-state": task.state }, task.state)),
    el("ol", { class: "stepper" }, steps(task).map(([label, mark]) =>
      el("li", { "data-mark": mark }, el("span", { class: "label" }, label)))),
    el("div", { class: "meta" },
      el("button", { type: "button", class: "ctx", title: `show only ${context} in the timeline`,
        onclick: () => this.onContext(context) }, shortContext(context)),
      el("span", null, "holder ", el("b", null, task.holder || "none")),
      el("span", null, "attempt ", el("b", null, String(task.attempt ?? 0))),
      task.offered_by ? el("span", null, "by ", el("b", null, task.offered_by)) : null,
      el("span", { class: "updated", title: new Date((task.updated || 0) * 1000).toISOString() },
        task.updated ? ago(Date.now() / 1000 - task.updated) : "")),
    mine ? this.reviewBox(task) : null,
    task.holder ? el("footer", null, el("button", { type: "button", class: "link small",
      onclick: () => this.onMessage(task) }, `Message ${task.holder}`)) : null);
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
