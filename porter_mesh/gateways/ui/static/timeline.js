// The timeline: every broadcast and observed direct activity, newest first.
//
// Theory of operation. Records arrive from two sides: history pages from
// /api/messages (older first, appended at the bottom) and live batches from the stream
// (prepended at the top). Both meet in one list keyed by record id, so an overlap
// between a history page and the live stream shows once. Live records are queued and
// drawn once per animation frame, so 1,000 activities a second cost ~17 rows a frame
// and one layout, not 1,000. The list keeps at most MAX_ROWS rows: the oldest fall off
// the bottom (scrolling down loads them again, a page at a time, with before=<id>);
// while someone reads far down in history, live rows wait in a queue (the banner says
// how many) instead of shifting the page under them.

import { el, fill, clock, shortContext } from "./dom.js";
import { get } from "./api.js";

export const MAX_ROWS = 2000;
const PAGE = 200;
const MAX_QUEUE = MAX_ROWS;

/** What kind of channel a record travelled on (for its colour). */
export function channelKind(channel) {
  if (typeof channel !== "string") return "other";
  if (channel.startsWith("task:")) return "direct";
  if (["log", "task", "review", "control"].includes(channel)) return channel;
  return "other";
}

/** Whether a record passes the filters (the same rules the server applies to history). */
export function matches(rec, f) {
  if (f.context && rec.context !== f.context) return false;
  if (f.channel && rec.channel !== f.channel) return false;
  if (f.type && rec.type !== f.type) return false;
  if (f.agent && rec.sender !== f.agent && rec.recipient !== f.agent) return false;
  if (f.q) {
    const needle = f.q.toLowerCase();
    const hay = `${rec.summary || ""}\u0000${rec.sender || ""}\u0000${rec.recipient || ""}`;
    if (!hay.toLowerCase().includes(needle)) return false;
  }
  return true;
}

/** "14:51:57.483" as its seconds and its milliseconds, which a narrow page hides. */
function splitClock(text) {
  const dot = text.indexOf(".");
  return dot < 0 ? [text] : [text.slice(0, dot), el("span", { class: "ms" }, text.slice(dot))];
}

function who(rec) {
  const parts = [el("span", { class: "sender" }, rec.sender || "?")];
  const target = rec.recipient || (rec.activity && typeof rec.activity.target === "string"
    ? rec.activity.target : null);
  if (target) {
    parts.push(el("span", { class: "arrow" }, "\u2192"),
      el("span", { class: rec.recipient ? "recipient" : "recipient addressed" }, target));
  }
  return parts;
}

/** One timeline row (also used by the inbox, with `extra` controls at its end). */
export function recordLine(rec, extra = null) {
  return el("div", { class: "line" },
    el("time", { class: "t", title: new Date(rec.ts * 1000).toISOString() },
      ...splitClock(clock(rec.ts))),
    el("span", { class: "chan", "data-kind": channelKind(rec.channel), title: rec.channel },
      channelKind(rec.channel) === "direct" ? "direct" : rec.channel),
    el("span", { class: "who" }, who(rec)),
    el("span", { class: "badge", "data-type": rec.type }, rec.type),
    el("span", { class: "summary", title: rec.summary }, rec.summary),
    rec.context
      ? el("button", { class: "ctx", type: "button", title: `show only ${rec.context}`,
        "data-context": rec.context }, shortContext(rec.context))
      : el("span", { class: "ctx-none" }),
    extra);
}

export class Timeline {
  constructor(root, { onContext, onFilters }) {
    this.root = root;
    this.onContext = onContext;
    this.onFilters = onFilters;
    this.filters = { channel: "", type: "", agent: "", q: "", context: "" };
    this.rows = new Map(); // id -> {node, rec}
    this.queue = [];
    this.overflow = false;
    this.frame = 0;
    this.paused = false;
    this.more = false;
    this.loading = false;
    this.generation = 0;
    this.received = 0;
    this.options = { channel: new Set(), type: new Set(), agent: new Set() };

    this.list = root.querySelector(".rows");
    this.scroller = root.querySelector(".scroller");
    this.footer = root.querySelector(".timeline-footer");
    this.banner = root.querySelector(".timeline-banner");
    this.selects = {
      channel: root.querySelector('[data-testid="filter-channel"]'),
      type: root.querySelector('[data-testid="filter-type"]'),
      agent: root.querySelector('[data-testid="filter-agent"]'),
    };
    this.text = root.querySelector('[data-testid="filter-text"]');
    this.contextChip = root.querySelector(".context-filter");

    for (const [key, select] of Object.entries(this.selects)) {
      select.addEventListener("change", () => this.setFilter(key, select.value));
    }
    let typing = 0;
    this.text.addEventListener("input", () => {
      clearTimeout(typing);
      typing = setTimeout(() => this.setFilter("q", this.text.value.trim()), 200);
    });
    this.list.addEventListener("click", (event) => this.click(event));
    this.scroller.addEventListener("scroll", () => this.scrolled(), { passive: true });
    this.banner.querySelector("button").addEventListener("click", () => this.resume());
    root.querySelector(".pause").addEventListener("click", (event) => {
      if (this.paused) this.resume();
      else this.pause();
    });
  }

  // -- filters ------------------------------------------------------------------------

  setFilter(key, value) {
    if (this.filters[key] === value) return;
    this.filters[key] = value;
    if (key === "context") this.showContextChip();
    if (key in this.selects && this.selects[key].value !== value) {
      this.learn(key, value);
      this.selects[key].value = value;
    }
    this.onFilters(this.filters);
    this.reload();
  }

  showContextChip() {
    const context = this.filters.context;
    if (!context) {
      fill(this.contextChip);
      this.contextChip.hidden = true;
      return;
    }
    this.contextChip.hidden = false;
    fill(this.contextChip,
      el("span", { class: "label" }, "task"),
      el("span", { class: "value", title: context }, shortContext(context)),
      el("button", { type: "button", class: "clear", title: "show every task",
        "aria-label": "clear the task filter", onclick: () => this.setFilter("context", "") },
      "\u00d7"));
  }

  /** Add a value to a filter's choices (channels, types and agents seen so far). */
  learn(key, value) {
    if (!value || this.options[key].has(value)) return;
    this.options[key].add(value);
    const select = this.selects[key];
    const values = [...this.options[key]].sort();
    const at = values.indexOf(value);
    const option = el("option", { value }, value);
    // option 0 is "all"; keep the rest sorted
    select.insertBefore(option, select.options[at + 1] || null);
  }

  learnRecord(rec) {
    this.learn("channel", rec.channel);
    this.learn("type", rec.type);
    this.learn("agent", rec.sender);
    if (rec.recipient) this.learn("agent", rec.recipient);
  }

  // -- loading ------------------------------------------------------------------------

  params(extra) {
    const f = this.filters;
    return { limit: PAGE, channel: f.channel, type: f.type, agent: f.agent, q: f.q,
      context: f.context, ...extra };
  }

  /** Start over from the newest page of history that matches the filters. */
  async reload() {
    const generation = ++this.generation;
    this.rows.clear();
    this.list.replaceChildren();
    this.queue = [];
    this.overflow = false;
    this.paused = false;
    this.more = false;
    this.showBanner();
    await this.fetchPage(generation, {}, "loading\u2026");
  }

  /** Records shown now (history and live). */
  get shown() {
    return this.rows.size;
  }

  async loadOlder() {
    if (this.loading || !this.more) return;
    const oldest = this.list.lastElementChild;
    if (!oldest) return;
    await this.fetchPage(this.generation, { before: oldest.dataset.id }, "loading older\u2026");
  }

  /** One page of history below what is shown; dropped if the filters changed meanwhile
   * (``generation``). */
  async fetchPage(generation, extra, label) {
    this.loading = true;
    this.setFooter(label);
    try {
      const page = await get("/api/messages", this.params(extra));
      if (generation !== this.generation) return;
      this.more = Boolean(page.more);
      this.appendOlder(page.messages);
    } catch (err) {
      if (generation === this.generation) this.setFooter(`history unavailable: ${err.reason}`);
      return;
    } finally {
      if (generation === this.generation) this.loading = false;
    }
    this.updateFooter();
  }

  /** History (oldest first) goes below what is shown. */
  appendOlder(records) {
    const fragment = document.createDocumentFragment();
    for (let i = records.length - 1; i >= 0; i--) {
      const rec = records[i];
      this.learnRecord(rec);
      if (this.rows.has(rec.id)) continue;
      fragment.appendChild(this.row(rec));
    }
    this.list.appendChild(fragment);
    if (this.rows.size > MAX_ROWS) {
      // Reading far back: drop the newest rows, and hold live ones until "back to live".
      while (this.rows.size > MAX_ROWS) this.remove(this.list.firstElementChild);
      this.pause("scrolled back into history");
    }
  }

  // -- live -----------------------------------------------------------------------------

  /** Records from the stream (oldest first). */
  add(records) {
    this.received += records.length;
    for (const rec of records) this.learnRecord(rec);
    for (const rec of records) {
      if (matches(rec, this.filters)) this.queue.push(rec);
    }
    if (this.queue.length > MAX_QUEUE) {
      this.queue.splice(0, this.queue.length - MAX_QUEUE);
      this.overflow = true;
    }
    if (this.paused) this.showBanner();
    else if (!this.frame) this.frame = requestAnimationFrame(() => this.flush());
  }

  flush() {
    this.frame = 0;
    if (this.paused || this.queue.length === 0) return;
    const batch = this.queue;
    this.queue = [];
    if (this.overflow) {
      // More arrived than the list holds: everything shown is older than the batch.
      this.overflow = false;
      this.rows.clear();
      this.list.replaceChildren();
      this.more = true;
    }
    const fragment = document.createDocumentFragment();
    for (let i = batch.length - 1; i >= 0; i--) {
      if (!this.rows.has(batch[i].id)) fragment.appendChild(this.row(batch[i]));
    }
    const reading = this.scroller.scrollTop > 2;
    const before = reading ? this.scroller.scrollHeight : 0;
    this.list.insertBefore(fragment, this.list.firstChild);
    if (reading) this.scroller.scrollTop += this.scroller.scrollHeight - before;
    while (this.rows.size > MAX_ROWS) {
      this.remove(this.list.lastElementChild);
      this.more = true;
    }
    this.updateFooter();
  }

  pause(reason = "paused") {
    this.paused = reason;
    this.showBanner();
  }

  resume() {
    if (this.overflow || this.paused === "scrolled back into history") {
      this.reload();
      return;
    }
    this.paused = false;
    this.showBanner();
    this.scroller.scrollTop = 0;
    if (!this.frame) this.frame = requestAnimationFrame(() => this.flush());
  }

  showBanner() {
    const pauseButton = this.root.querySelector(".pause");
    pauseButton.textContent = this.paused ? "Resume" : "Pause";
    pauseButton.setAttribute("aria-pressed", this.paused ? "true" : "false");
    if (!this.paused) {
      this.banner.hidden = true;
      return;
    }
    this.banner.hidden = false;
    const waiting = this.overflow ? `${MAX_QUEUE}+` : String(this.queue.length);
    this.banner.querySelector(".text").textContent =
      `${this.paused === true ? "paused" : this.paused} \u00b7 ${waiting} new`;
  }

  // -- rows -----------------------------------------------------------------------------

  row(rec) {
    const node = el("div", { class: "row", "data-testid": "timeline-row",
      dataset: { id: rec.id, type: rec.type } },
    recordLine(rec, el("button", { class: "raw-toggle", type: "button",
      title: "show the record as JSON", "aria-expanded": "false" }, "{}")));
    if (rec.inbox) node.classList.add("to-me");
    this.rows.set(rec.id, { node, rec });
    return node;
  }

  remove(node) {
    if (!node) return;
    this.rows.delete(node.dataset.id);
    node.remove();
  }

  click(event) {
    const chip = event.target.closest(".ctx");
    if (chip && chip.dataset.context) {
      this.onContext(chip.dataset.context);
      return;
    }
    const toggle = event.target.closest(".raw-toggle");
    if (!toggle) return;
    const node = toggle.closest(".row");
    const entry = node && this.rows.get(node.dataset.id);
    if (!entry) return;
    const open = node.querySelector(".raw");
    if (open) {
      open.remove();
      node.classList.remove("expanded");
      toggle.setAttribute("aria-expanded", "false");
      return;
    }
    node.classList.add("expanded");
    toggle.setAttribute("aria-expanded", "true");
    node.appendChild(el("pre", { class: "raw", "data-testid": "raw-json" },
      JSON.stringify(entry.rec, null, 2)));
  }

  scrolled() {
    const s = this.scroller;
    if (s.scrollTop + s.clientHeight >= s.scrollHeight - 200) this.loadOlder();
  }

  setFooter(text) {
    this.footer.textContent = text;
  }

  updateFooter() {
    if (this.rows.size === 0) {
      this.setFooter(this.filters.context || this.filters.channel || this.filters.type ||
        this.filters.agent || this.filters.q ? "nothing matches the filters"
        : "no activities yet: they appear here as the agents work");
    } else if (this.more) {
      this.setFooter("scroll for older activities");
    } else {
      this.setFooter(`the beginning of the log \u00b7 ${this.rows.size} shown`);
    }
  }
}
