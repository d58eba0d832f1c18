// Knowledge: ad-hoc SPARQL over porter-ui's replica of the team's graph, the remember
// form, and the newest observations.

import { el, fill, clock, shortContext } from "./dom.js";
import { get, post } from "./api.js";

/** The profile's example query: what has the team learned? */
export const LEARNED_QUERY = `SELECT ?about ?finding WHERE {
  ?obs <https://porter.chapeaux.io/vocab#about> ?about ;
       <https://porter.chapeaux.io/vocab#finding> ?finding
} LIMIT 10`;

function cell(value) {
  if (value === null || value === undefined) return el("td", { class: "unbound" }, "\u2014");
  return el("td", { title: String(value) }, String(value));
}

function when(at) {
  if (typeof at === "number") return clock(at);
  return String(at || "");
}

export class Knowledge {
  constructor(root, { onContext }) {
    this.root = root;
    this.onContext = onContext;
    this.query = root.querySelector('[data-testid="sparql"]');
    this.run = root.querySelector('[data-testid="sparql-run"]');
    this.results = root.querySelector('[data-testid="sparql-results"]');
    this.error = root.querySelector('[data-testid="sparql-error"]');
    this.about = root.querySelector('[data-testid="remember-about"]');
    this.finding = root.querySelector('[data-testid="remember-finding"]');
    this.rememberStatus = root.querySelector(".remember-status");
    this.observations = root.querySelector('[data-testid="observations"]');
    this.size = root.querySelector(".kg-size");
    this.query.value = LEARNED_QUERY;
    root.querySelector(".sparql-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.recall();
    });
    this.query.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        this.recall();
      }
    });
    root.querySelector(".remember-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.remember();
    });
    this.observations.addEventListener("click", (event) => {
      const chip = event.target.closest(".ctx");
      if (chip && chip.dataset.context) this.onContext(chip.dataset.context);
    });
  }

  /** The query the server names as the profile's, unless someone already edited the box. */
  prefill(query) {
    if (this.query.value === LEARNED_QUERY) this.query.value = query;
  }

  async recall() {
    this.run.disabled = true;
    this.error.hidden = true;
    fill(this.results, el("p", { class: "muted" }, "running\u2026"));
    try {
      const answer = await post("/api/recall", { query: this.query.value });
      const columns = answer.columns || [];
      const rows = answer.rows || [];
      fill(this.results,
        el("p", { class: "muted" }, `${rows.length} row${rows.length === 1 ? "" : "s"}` +
          (answer.truncated ? " (cut at the row limit)" : "")),
        el("div", { class: "table-wrap" }, el("table", null,
          el("thead", null, el("tr", null, columns.map((c) => el("th", null, c)))),
          el("tbody", null, rows.map((row) => el("tr", null, row.map(cell)))))));
    } catch (err) {
      fill(this.results);
      this.error.hidden = false;
      fill(this.error, el("b", null, err.code === "query" ? "Refused: " : "Failed: "),
        err.reason);
    } finally {
      this.run.disabled = false;
    }
  }

  async remember() {
    const about = this.about.value.trim();
    const finding = this.finding.value.trim();
    if (!about || !finding) {
      this.rememberStatus.textContent = "both what it is about and the finding are needed";
      this.rememberStatus.classList.add("error");
      return;
    }
    try {
      await post("/api/remember", { about, finding });
      this.rememberStatus.classList.remove("error");
      this.rememberStatus.textContent = `remembered: ${about}`;
      this.finding.value = "";
      this.refresh();
    } catch (err) {
      this.rememberStatus.classList.add("error");
      this.rememberStatus.textContent = `not remembered: ${err.reason}`;
    }
  }

  async refresh() {
    try {
      const answer = await get("/api/knowledge", { limit: 50 });
      const observations = answer.observations || [];
      this.size.textContent = `${answer.size ?? 0} triples`;
      if (observations.length === 0) {
        fill(this.observations, el("li", { class: "empty" }, "nothing remembered yet"));
        return;
      }
      fill(this.observations, observations.map((o) => el("li", { class: "observation" },
        el("div", { class: "obs-head" },
          el("span", { class: "about" }, o.about || ""),
          el("span", { class: "by" }, o.by || ""),
          o.context ? el("button", { type: "button", class: "ctx", "data-context": o.context,
            title: `show only ${o.context} in the timeline` }, shortContext(o.context)) : null,
          el("time", null, when(o.at))),
        el("p", { class: "finding" }, o.finding || ""))));
    } catch (err) {
      fill(this.observations, el("li", { class: "empty error" },
        `observations unavailable: ${err.reason}`));
    }
  }
}
