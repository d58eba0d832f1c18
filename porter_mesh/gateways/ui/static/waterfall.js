// A task's trace as a waterfall: the spans the agents keep, gathered by the dashboard
// (GET /api/trace, the same gathering as `porter-mesh trace`), drawn as bars by start
// offset and duration under one another, the slowest path marked, what is missing named.

import { el, fill } from "./dom.js";
import { get } from "./api.js";

/** "12.3ms" or "1.24s". */
export function ms(value) {
  const n = Number(value) || 0;
  return n >= 1000 ? `${(n / 1000).toFixed(2)}s` : `${n.toFixed(1)}ms`;
}

/** Left offset and width of a span's bar, in percent of the trace's length. */
export function bar(row, total) {
  const whole = Number(total) > 0 ? Number(total) : 1;
  const left = Math.min(100, Math.max(0, (Number(row.offset_ms) || 0) / whole * 100));
  const width = Math.min(100 - left, Math.max(0.4, (Number(row.duration_ms) || 0) / whole * 100));
  return [left, width];
}

function statusText(row) {
  if (row.status === "error" && row.message) return `error: ${row.message}`;
  return row.status || "unset";
}

function spanRow(row, total) {
  const [left, width] = bar(row, total);
  const status = statusText(row);
  return el("div", { class: "wf-row", role: "row", "data-testid": "waterfall-row",
    dataset: { agent: row.agent, name: row.name, status: row.status,
      slowest: row.slowest ? "true" : "false", orphan: row.orphan ? "true" : "false" } },
  el("span", { class: "wf-mark", role: "cell",
    title: row.orphan ? "its parent span was not found" : row.slowest ? "on the slowest path" : "" },
  row.orphan ? "?" : row.slowest ? "\u2605" : ""),
  el("span", { class: "wf-agent", role: "cell", title: row.agent }, row.agent),
  el("span", { class: "wf-name", role: "cell", title: `${row.name} (${row.kind})`,
    style: `padding-left: ${Math.min(Number(row.depth) || 0, 12) * 12}px` }, row.name),
  el("span", { class: "wf-track", role: "cell",
    title: `starts at ${ms(row.offset_ms)}, takes ${ms(row.duration_ms)}` },
  el("span", { class: "wf-bar", style: `left: ${left}%; width: ${width}%` })),
  el("span", { class: "wf-num", role: "cell" }, ms(row.offset_ms)),
  el("span", { class: "wf-num", role: "cell" }, ms(row.duration_ms)),
  el("span", { class: "wf-status", role: "cell", title: status }, status));
}

/** The waterfall of one gathered trace (what GET /api/trace answers). */
export function drawWaterfall(trace) {
  const rows = Array.isArray(trace.rows) ? trace.rows : [];
  const head = rows.length
    ? `${rows.length} span(s) in ${ms(trace.total_ms)}; \u2605 marks the slowest path`
    : "no spans of this task were found: the agents that had them may have restarted, " +
      "or tracing is off (pip install 'porter-mesh[otel]')";
  const missing = Array.isArray(trace.missing) ? trace.missing : [];
  const notes = Array.isArray(trace.notes) ? trace.notes : [];
  return el("div", { class: "wf", "data-testid": "waterfall",
    dataset: { complete: trace.complete ? "true" : "false" } },
  el("p", { class: "wf-head" }, head,
    (trace.trace_ids || []).length ? el("span", { class: "muted" },
      ` \u00b7 trace ${(trace.trace_ids || []).join(", ")}`) : null),
  rows.length ? el("div", { class: "wf-table", role: "table" },
    el("div", { class: "wf-row wf-labels", role: "row" },
      ["", "agent", "span", "timeline", "start", "duration", "status"].map((label) =>
        el("span", { role: "columnheader" }, label))),
    rows.map((row) => spanRow(row, trace.total_ms))) : null,
  missing.length ? el("p", { class: "wf-missing", "data-testid": "waterfall-missing",
    role: "alert" },
  `missing: ${missing.length} parent span(s) of the spans marked ? were not found ` +
    `(${missing.slice(0, 4).join(", ")}${missing.length > 4 ? ", \u2026" : ""}); their ` +
    "agents may have restarted, dropped them from their rings, or not answered: the tree " +
    "is partial") : null,
  notes.map((note) => el("p", { class: "wf-note muted", "data-testid": "waterfall-note" },
    `note: ${note}`)));
}

/** Open the waterfall of ``context`` in a dialog over the page. */
export async function openWaterfall(context, title) {
  const body = el("div", { class: "wf-body" }, el("p", { class: "muted" },
    "gathering the spans from the agents\u2026"));
  const close = el("button", { type: "button", class: "small", "data-testid": "waterfall-close",
    onclick: () => dialog.close() }, "Close");
  const dialog = el("dialog", { class: "wf-dialog", "data-testid": "waterfall-dialog",
    "aria-label": `trace of ${title || context}` },
  el("header", null, el("h2", null, "Trace of ", el("b", null, title || context)), close),
  body);
  dialog.addEventListener("close", () => dialog.remove());
  document.body.appendChild(dialog);
  dialog.showModal();
  try {
    fill(body, drawWaterfall(await get("/api/trace", { context })));
  } catch (err) {
    fill(body, el("p", { class: "wf-missing", role: "alert" },
      `could not gather the trace: ${err.reason || err}`));
  }
  return dialog;
}
