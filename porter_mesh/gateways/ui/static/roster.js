// The roster: one card per agent, its state in colour, its own numbers (what its brain
// did, what it lost), and drain/halt buttons. Nodes that are not agents (a command
// line's seat, a tail, an observer: the server's `kind`) take no tasks and obey no
// drain: they are named in one line under the cards while they are on the mesh, and
// forgotten when they go.

import { el, fill, ago, clock } from "./dom.js";
import { post } from "./api.js";

const STATE_ORDER = { alive: 0, draining: 1, "clock-skew": 2, evasive: 3, expired: 4, left: 5 };
const CONFIRM_MS = 4000;

/** "812", "3.4k", "27k", "1.2M" for a count; "?" for what is not one. */
export function compact(n) {
  if (typeof n !== "number" || !Number.isFinite(n)) return "?";
  if (n < 1000) return String(n);
  if (n < 10_000) return `${(n / 1000).toFixed(1)}k`;
  if (n < 1_000_000) return `${Math.round(n / 1000)}k`;
  return `${(n / 1_000_000).toFixed(1)}M`;
}

/** The parts of a peer's stats line: [text, bad] pairs (bad: worth a look). */
export function statsParts(stats) {
  if (!stats || typeof stats !== "object") return [];
  const parts = [];
  const agent = stats.agent && typeof stats.agent === "object" ? stats.agent : null;
  if (agent && "model_calls" in agent) {
    parts.push([`model ${compact(agent.model_calls)} calls`, false],
      [`${compact(agent.tokens_in)} tok in / ${compact(agent.tokens_out)} out`, false],
      [`tools ${compact(agent.tool_calls)}`, false],
      [`errors ${compact(agent.errors)}`, Boolean(agent.errors)],
      [`retries ${compact(agent.retries)}`, false]);
  }
  if (stats.lost) parts.push([`lost ${compact(stats.lost)}`, true]);
  if (stats.dropped) parts.push([`dropped ${compact(stats.dropped)}`, true]);
  return parts;
}

function statsTitle(stats) {
  const lines = [];
  const agent = stats.agent && typeof stats.agent === "object" ? stats.agent : null;
  if (agent) lines.push(`brain ${agent.brain ?? "?"}` + (agent.model ? `, model ${agent.model}` : ""));
  const q = stats.queues && typeof stats.queues === "object" ? stats.queues : {};
  lines.push(`queues: inbox ${compact(q.inbox)}, outbox ${compact(q.outbox)}, ` +
    `subscribers ${compact(q.subscribers)}`);
  const kg = stats.knowledge;
  lines.push(kg && typeof kg === "object"
    ? `knowledge: ${compact(kg.observations)} observations, ${compact(kg.retractions)} retractions`
    : "knowledge: none");
  lines.push(`lost ${compact(stats.lost)}, dropped ${compact(stats.dropped)}`);
  if (typeof stats.at === "number") lines.push(`as of ${clock(stats.at)}`);
  return lines.join("\n");
}

/** "12.3ms", "1.24s" for a time in milliseconds. */
export function millis(value) {
  const n = Number(value);
  if (!Number.isFinite(n)) return "?";
  return n >= 1000 ? `${(n / 1000).toFixed(2)}s` : `${n.toFixed(1)}ms`;
}

/** An agent's service metrics (the `service` section of its view, checked by the
 * server): [kind, {count, errors, p50_ms, p99_ms}] rows, tasks first, and the totals
 * the summary line shows; null when it reports none. */
export function serviceRows(stats) {
  const service = stats && typeof stats === "object" ? stats.service : null;
  if (!service || typeof service !== "object" || !service.kinds) return null;
  const kinds = Object.entries(service.kinds).filter(([, k]) => k && typeof k === "object");
  const rank = (kind) => (kind === "task" ? 0 : kind === "chat" ? 1 : 2);
  kinds.sort(([a], [b]) => rank(a) - rank(b) || a.localeCompare(b));
  const tools = kinds.filter(([kind]) => kind.startsWith("tool "))
    .reduce((sum, [, k]) => sum + (Number(k.count) || 0), 0);
  const tasks = kinds.filter(([kind]) => kind === "task")
    .reduce((sum, [, k]) => sum + (Number(k.count) || 0), 0);
  return { rows: kinds, tools, tasks, tokensIn: Number(service.tokens_in) || 0,
    tokensOut: Number(service.tokens_out) || 0 };
}

/** "worker, 2 slots"; a role that holds no tasks alone ("reviewer"). */
function roleText(peer) {
  const slots = Number(peer.slots) || 0;
  const role = String(peer.role || "?");
  return slots ? `${role}, ${slots} slot${slots === 1 ? "" : "s"}` : role;
}

/** A button that asks for a second click before it acts ("Halt" -> "Halt: sure?"). */
function confirmButton(label, attrs, act) {
  let armed = 0;
  const button = el("button", { type: "button", ...attrs }, label);
  button.addEventListener("click", () => {
    if (!armed) {
      button.textContent = `${label}: sure?`;
      button.classList.add("armed");
      armed = setTimeout(() => {
        armed = 0;
        button.textContent = label;
        button.classList.remove("armed");
      }, CONFIRM_MS);
      return;
    }
    clearTimeout(armed);
    armed = 0;
    button.textContent = label;
    button.classList.remove("armed");
    act();
  });
  return button;
}

export class Roster {
  constructor(root, { status, onAgent }) {
    this.root = root;
    this.list = root.querySelector(".cards");
    this.othersLine = root.querySelector(".others");
    this.count = root.querySelector(".count");
    this.status = status;
    this.onAgent = onAgent;
    this.peers = [];
    this.others = [];
    this.heardAt = new Map(); // name -> performance.now() ms of last heard
    this.openService = new Set(); // agents whose service table is unfolded (kept on redraw)
    this.self = "porter-ui";
    root.querySelector(".drain-all").addEventListener("click", () => this.control("drain"));
    root.querySelector(".halt-all").replaceWith(confirmButton("Halt all",
      { class: "halt-all danger small", title: "halt every agent on the mesh" },
      () => this.control("halt")));
    setInterval(() => this.tick(), 1000);
  }

  update(peers) {
    const now = performance.now();
    for (const peer of peers) {
      this.heardAt.set(peer.name, now - 1000 * (Number(peer.last_heard) || 0));
    }
    const sorted = [...peers].sort((a, b) =>
      (STATE_ORDER[a.state] ?? 9) - (STATE_ORDER[b.state] ?? 9) ||
      String(a.name).localeCompare(String(b.name)));
    this.peers = sorted.filter((p) => (p.kind ?? "agent") === "agent");
    this.others = sorted.filter((p) => (p.kind ?? "agent") !== "agent" &&
      p.state !== "left" && p.state !== "expired");
    for (const peer of peers) this.onAgent(peer.name);
    this.render();
  }

  render() {
    const live = this.peers.filter((p) => p.state === "alive" || p.state === "draining").length;
    this.count.textContent = `${live}/${this.peers.length}`;
    this.renderOthers();
    if (this.peers.length === 0) {
      fill(this.list, el("p", { class: "empty" }, "no agents yet: start one with porter-mesh agent"));
      return;
    }
    fill(this.list, this.peers.map((peer) => this.card(peer)));
  }

  renderOthers() {
    this.othersLine.hidden = this.others.length === 0;
    fill(this.othersLine, this.others.length ? [
      el("span", { class: "label" }, "also here: "),
      this.others.map((peer) => el("span", { class: "other", "data-testid": "other-peer",
        dataset: { name: String(peer.name), kind: peer.kind },
        title: `${peer.name}: ${peer.kind} (role ${peer.role || "?"}), not an agent`},
      String(peer.name))),
    ] : []);
  }

  card(peer) {
    const name = String(peer.name);
    const tools = Array.isArray(peer.tools) ? peer.tools : [];
    return el("article", { class: "peer", "data-testid": "peer-card",
      dataset: { name, state: peer.state } },
    el("header", null,
      el("span", { class: "dot", "aria-hidden": "true" }),
      el("span", { class: "name", title: name }, name),
      el("span", { class: "state" }, peer.state)),
    el("dl", null,
      el("dt", null, "role"), el("dd", { class: "role" }, roleText(peer)),
      el("dt", null, "heard"), el("dd", { class: "heard" }, this.heardText(name)),
      el("dt", null, "at"), el("dd", { class: "mono", title: peer.incarnation || "" },
        peer.address || "")),
    tools.length ? el("div", { class: "tools" }, tools.map((t) => el("span", null, t))) : null,
    this.statsLine(peer.stats),
    this.serviceTable(name, peer.stats),
    el("footer", null,
      el("button", { type: "button", class: "small", "data-testid": `drain-${name}`,
        title: `ask ${name} to finish what it holds and take nothing new`,
        onclick: () => this.control("drain", name) }, "Drain"),
      confirmButton("Halt", { class: "small danger", "data-testid": `halt-${name}`,
        title: `stop ${name} now` }, () => this.control("halt", name))));
  }

  statsLine(stats) {
    const parts = statsParts(stats);
    if (!parts.length) return null;
    const children = [];
    for (const [text, bad] of parts) {
      if (children.length) children.push(" · ");
      children.push(el("span", { class: bad ? "bad" : null }, text));
    }
    return el("p", { class: "stats", "data-testid": "peer-stats", title: statsTitle(stats) },
      children);
  }

  /** The agent's service metrics: a summary line that unfolds a table per kind of work
   * (requests, errors, p50, p99), the same numbers as `stats` and /metrics. */
  serviceTable(name, stats) {
    const service = serviceRows(stats);
    if (!service) return null;
    const details = el("details", { class: "service", "data-testid": "peer-service",
      open: this.openService.has(name) },
    el("summary", null, `tasks ${compact(service.tasks)} · tool calls ${compact(service.tools)}` +
      ` · tokens ${compact(service.tokensIn)} in / ${compact(service.tokensOut)} out`),
    service.rows.length ? el("table", null,
      el("thead", null, el("tr", null, ["work", "requests", "errors", "p50", "p99"].map(
        (label) => el("th", { scope: "col" }, label)))),
      el("tbody", null, service.rows.map(([kind, k]) => el("tr", {
        "data-testid": "service-row", dataset: { kind } },
      el("th", { scope: "row", title: kind }, kind),
      el("td", null, compact(k.count)),
      el("td", { class: Number(k.errors) ? "bad" : null }, compact(k.errors)),
      el("td", null, millis(k.p50_ms)),
      el("td", null, millis(k.p99_ms)))))) : el("p", { class: "muted" }, "no work yet"));
    details.addEventListener("toggle", () => {
      if (details.open) this.openService.add(name);
      else this.openService.delete(name);
    });
    return details;
  }

  heardText(name) {
    const at = this.heardAt.get(name);
    if (at === undefined) return "never";
    return ago((performance.now() - at) / 1000);
  }

  tick() {
    for (const card of this.list.querySelectorAll(".peer")) {
      const heard = card.querySelector(".heard");
      if (heard) heard.textContent = this.heardText(card.dataset.name);
    }
  }

  async control(kind, to) {
    const whom = to || "every agent";
    try {
      await post("/api/control", to ? { kind, to } : { kind });
      this.status(`${kind} sent to ${whom}`);
    } catch (err) {
      this.status(`${kind} to ${whom} failed: ${err.reason}`, true);
    }
  }
}
