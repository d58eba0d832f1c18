// Compose (to a channel or @agent) and the human's inbox (records addressed to porter-ui).

import { el, fill, shortContext } from "./dom.js";
import { post } from "./api.js";
import { recordLine } from "./timeline.js";

const MAX_INBOX = 500;

export class Compose {
  constructor(root, { onSent }) {
    this.root = root;
    this.onSent = onSent;
    this.target = root.querySelector('[data-testid="compose-target"]');
    this.type = root.querySelector('[data-testid="compose-type"]');
    this.context = root.querySelector('[data-testid="compose-context"]');
    this.text = root.querySelector('[data-testid="compose-text"]');
    this.send = root.querySelector('[data-testid="compose-send"]');
    this.status = root.querySelector('[data-testid="compose-status"]');
    this.targets = root.querySelector("#compose-targets");
    this.known = new Set();
    root.querySelector("form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.submit();
    });
    this.text.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        this.submit();
      }
    });
  }

  /** Offer @name as a target once an agent is known. */
  learnAgent(name) {
    if (!name || this.known.has(name) || name === "porter-ui") return;
    this.known.add(name);
    this.targets.appendChild(el("option", { value: `@${name}` }));
  }

  /** Prepare a reply: to whom, about which task, and which type. */
  prepare({ target, context, type }) {
    if (target) this.target.value = target;
    if (context !== undefined) this.context.value = context || "";
    if (type) this.type.value = type;
    this.text.focus();
  }

  say(text, failed = false) {
    this.status.textContent = text;
    this.status.classList.toggle("error", failed);
  }

  async submit() {
    const channel = this.target.value.trim();
    const text = this.text.value;
    if (!channel) return this.say("say where it goes: a channel (log, task, review) or @agent", true);
    if (!text.trim()) return this.say("write something to send", true);
    const body = { channel, text, type: this.type.value };
    const context = this.context.value.trim();
    if (context) body.context = context;
    this.send.disabled = true;
    this.say(`sending ${body.type} to ${channel}\u2026`);
    try {
      const answer = await post("/api/send", body);
      const ctx = answer.context || (answer.record && answer.record.context);
      this.say(`sent ${body.type} to ${channel}` + (ctx ? ` \u00b7 task ${shortContext(ctx)}` : ""));
      this.text.value = "";
      this.onSent(answer);
    } catch (err) {
      this.say(`not sent: ${err.reason}`, true);
    } finally {
      this.send.disabled = false;
    }
  }
}

export class Inbox {
  constructor(root, { onReply, onContext, onCount }) {
    this.root = root;
    this.list = root.querySelector(".inbox-rows");
    this.onReply = onReply;
    this.onCount = onCount;
    this.onContext = onContext;
    this.seen = new Set();
    this.unread = 0;
    this.list.addEventListener("click", (event) => {
      const chip = event.target.closest(".ctx");
      if (chip && chip.dataset.context) this.onContext(chip.dataset.context);
    });
    this.render();
  }

  /** Records oldest first; only those addressed to porter-ui are kept. */
  add(records, { fresh = true } = {}) {
    const mine = records.filter((r) => r.inbox && !this.seen.has(r.id));
    if (mine.length === 0) return;
    const empty = this.list.querySelector(".empty");
    if (empty) empty.remove();
    const fragment = document.createDocumentFragment();
    for (let i = mine.length - 1; i >= 0; i--) {
      this.seen.add(mine[i].id);
      fragment.appendChild(this.row(mine[i]));
    }
    if (fresh) {
      this.list.insertBefore(fragment, this.list.firstChild);
      this.unread += mine.length;
    } else {
      this.list.appendChild(fragment);
    }
    while (this.list.children.length > MAX_INBOX) {
      this.seen.delete(this.list.lastElementChild.dataset.id);
      this.list.lastElementChild.remove();
    }
    this.showCount();
  }

  row(rec) {
    const reply = el("button", { type: "button", class: "small", title: `answer ${rec.sender}`,
      onclick: () => this.onReply(rec) }, "Reply");
    return el("div", { class: "row inbox-row", "data-testid": "inbox-row",
      dataset: { id: rec.id, type: rec.type } }, recordLine(rec, reply));
  }

  render() {
    if (this.list.children.length === 0) {
      fill(this.list, el("p", { class: "empty" },
        "replies to porter-ui land here: accepts, questions, review requests"));
    }
    this.showCount();
  }

  markRead() {
    this.unread = 0;
    this.showCount();
  }

  showCount() {
    this.onCount(this.unread);
  }
}
