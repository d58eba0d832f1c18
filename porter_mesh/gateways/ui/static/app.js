// porter-ui's page: wires the panels to the API and the live stream (see docs/ui.md).

import { el, byTestId } from "./dom.js";
import { get, whenUnauthorised } from "./api.js";
import { Timeline } from "./timeline.js";
import { Roster } from "./roster.js";
import { Compose, Inbox } from "./compose.js";
import { Tasks } from "./tasks.js";
import { Knowledge } from "./knowledge.js";

const KNOWLEDGE_POLL_MS = 5000;

const $ = (selector) => document.querySelector(selector);

function toast(text, failed = false) {
  const box = $("#toast");
  box.textContent = text;
  box.classList.toggle("error", failed);
  box.classList.add("show");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => box.classList.remove("show"), 3500);
}

function connection(state, text) {
  const badge = $("#conn");
  badge.dataset.state = state;
  badge.textContent = text;
}

// -- tabs -----------------------------------------------------------------------------

function showTab(name) {
  for (const button of document.querySelectorAll(".tabs button")) {
    const on = button.dataset.tab === name;
    button.setAttribute("aria-selected", on ? "true" : "false");
  }
  for (const pane of document.querySelectorAll(".tab-pane")) {
    pane.hidden = pane.dataset.pane !== name;
  }
  if (name === "knowledge") knowledge.refresh();
  if (name === "inbox") inbox.markRead();
}

for (const button of document.querySelectorAll(".tabs button")) {
  button.addEventListener("click", () => showTab(button.dataset.tab));
}

function tabCount(name, text, hot = false) {
  const badge = document.querySelector(`.tabs button[data-tab="${name}"] .n`);
  badge.textContent = text;
  badge.hidden = !text;
  badge.classList.toggle("hot", hot);
}

// -- panels ---------------------------------------------------------------------------

const filterToContext = (context) => timeline.setFilter("context", context);

const timeline = new Timeline(byTestId("timeline"), {
  onContext: filterToContext,
  onFilters: () => {},
});

const compose = new Compose($(".compose"), {
  onSent: () => {},
});

const roster = new Roster(byTestId("roster"), {
  status: toast,
  onAgent: (name) => {
    compose.learnAgent(name);
    timeline.learn("agent", name);
  },
});

const inbox = new Inbox(byTestId("inbox"), {
  onContext: filterToContext,
  onReply: (rec) => compose.prepare({
    target: `@${rec.sender}`,
    context: rec.context,
    type: rec.type === "Question" ? "Note" : undefined,
  }),
  onCount: (unread) => tabCount("inbox", unread ? String(unread) : "", true),
});

const tasks = new Tasks(byTestId("tasks"), {
  onContext: filterToContext,
  status: toast,
  onMessage: (task) => compose.prepare({ target: `@${task.holder}`, context: task.context,
    type: "Note" }),
  onCount: (all, waiting) => tabCount("tasks", waiting ? `${waiting} to review` : String(all || ""),
    waiting > 0),
});

const knowledge = new Knowledge($(".knowledge"), { onContext: filterToContext });

// -- header figures -------------------------------------------------------------------

let lastCount = 0;
setInterval(() => {
  const count = timeline.received;
  $("#stat-rate").textContent = `${count - lastCount}/s`;
  $("#stat-count").textContent = timeline.shown.toLocaleString();
  lastCount = count;
}, 1000);

// -- data -----------------------------------------------------------------------------

whenUnauthorised(() => {
  $("#unauthorised").hidden = false;
  connection("offline", "no token");
});

// The message log's health: while the dashboard cannot write its log (a full disk), the
// page says so; it keeps working from the dashboard's memory.
function showLogHealth(health) {
  const badge = $("#log-health");
  const failing = Boolean(health) && health.ok === false;
  badge.hidden = !failing;
  if (failing) {
    const free = health.free_bytes == null ? "unknown" : `${health.free_bytes} bytes`;
    badge.textContent = `message log not written: ${health.error} (${free} free); ` +
      `${health.unwritten} record(s) held in memory`;
    badge.title = health.path || "";
  }
}

async function refreshPeers() {
  try {
    const answer = await get("/api/peers");
    roster.update(answer.peers || []);
    showLogHealth(answer.log);
  } catch (err) {
    // the connection badge says what is wrong
  }
}

async function refreshTasks() {
  try {
    const answer = await get("/api/tasks");
    tasks.replace(answer.tasks || []);
  } catch (err) {
    toast(`tasks unavailable: ${err.reason}`, true);
  }
}

async function loadInbox() {
  try {
    const page = await get("/api/messages", { inbox: 1, limit: 100 });
    inbox.add(page.messages || [], { fresh: false });
  } catch (err) {
    // shown by the timeline's own history message
  }
}

// Opens the live stream; the promise settles once it is open (the server has registered
// this page by then) or has failed, so that history read afterwards leaves no gap.
function openStream() {
  const stream = new EventSource("/api/stream");
  let wasOpen = false;
  let settle;
  const opened = new Promise((resolve) => { settle = resolve; });
  stream.addEventListener("open", () => {
    settle();
    connection("live", "live");
    if (wasOpen) {
      // back after a break: the stream resumes from Last-Event-ID; the roster and the
      // tasks are read again in full
      refreshPeers();
      refreshTasks();
    }
    wasOpen = true;
  });
  stream.addEventListener("error", () => {
    settle();
    if (stream.readyState === EventSource.CLOSED) {
      connection("offline", "disconnected");
      // a refused stream (a new token after a restart) is not retried by the browser
      get("/api/info").then(() => setTimeout(openStream, 2000), () => {});
    } else {
      connection("connecting", "reconnecting\u2026");
    }
  });
  stream.addEventListener("messages", (event) => {
    const records = JSON.parse(event.data);
    timeline.add(records);
    inbox.add(records);
  });
  stream.addEventListener("peers", (event) => {
    const answer = JSON.parse(event.data);
    roster.update(answer.peers || []);
    showLogHealth(answer.log);
  });
  stream.addEventListener("tasks", (event) => tasks.upsert(JSON.parse(event.data)));
  stream.addEventListener("reset", () => {
    // the stream cannot resume from where this page was: read everything again
    timeline.reload();
    refreshTasks();
  });
  return opened;
}

async function start() {
  connection("connecting", "connecting\u2026");
  // The stream first, so that nothing falls between the history and the live stream.
  const live = openStream();
  try {
    const info = await get("/api/info");
    $("#mesh-name").textContent = info.mesh || "";
    $("#version").textContent = info.version ? `v${info.version}` : "";
    if (info.query) knowledge.prefill(info.query);
    document.title = `porter-ui \u00b7 ${info.mesh || ""}`;
  } catch (err) {
    connection("offline", "server unavailable");
  }
  await live;
  await Promise.all([timeline.reload(), refreshPeers(), refreshTasks(), loadInbox()]);
  setInterval(() => {
    if (!document.querySelector('.tab-pane[data-pane="knowledge"]').hidden) knowledge.refresh();
  }, KNOWLEDGE_POLL_MS);
}

showTab("tasks");
start();
